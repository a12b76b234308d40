"""Warm-started tiny assets for tests and benchmarks: a small benchmark, expert
demonstrations, a tiny init model, and planner / searcher / single-agent models briefly
trained by SFT on those demonstrations (so that rewards vary and the planner delegates).

``stage`` picks the benchmark stage the demonstrations play: 1 (the default; one-hop
look-ups: the planner delegates to the searcher only, and the coder is the untrained init
model) or 2 (chains, comparisons and arithmetic: the planner delegates to the searcher and
to the coder, and the coder is SFT'd on its demonstrations too). A round on stage-2 assets
should play stage-2 questions (``bench/round.py``'s ``make_config(..., stage=2)``).

:func:`prepare` builds them in a folder; :func:`prepare_cached` builds them once per machine,
settings and code version (:func:`asset_key`) under ``MGRPO_ASSET_CACHE`` (default
``~/.cache/mgrpo/assets``). Used by ``bench/round.py`` and the services' parity tests.

What this module does NOT do: train with RL, or decide how many SFT steps are enough (the
caller passes ``sft_steps``; a round's planner delegates only after enough of them).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import mgrpo
from mgrpo.envs import BenchmarkConfig, build_benchmark
from mgrpo.envs.demos import write_demos
from mgrpo.envs.experts import ExpertErrors
from mgrpo.models import TinyModelConfig, init_tiny, load_model
from mgrpo.training.inline import write_inline_demos

SMALL = {"train": {"city": 12, "person": 16, "company": 8},
         "dev": {"city": 6, "person": 8, "company": 4},
         "test": {"city": 6, "person": 8, "company": 4}}
ASSET_MODULES = ("envs/benchmark.py", "envs/demos.py", "envs/experts.py", "models/sft.py",
                 "models/tiny.py", "training/inline.py",
                 "experiments/tiny_assets.py")  # what the assets are made by
ASSET_NAMES = ("bench", "init", "planner", "searcher", "single")
STAGES = (1, 2)  # benchmark stages the demonstrations can play


def sft_roles(stage: int) -> tuple[str, ...]:
    """The sub-agent and planner models SFT'd on the demonstrations of ``stage``: stage-1
    questions never call the coder, so its model stays the init model."""
    if stage not in STAGES:
        raise ValueError(f"stage {stage!r} is not one of {STAGES}")
    return ("planner", "searcher") if stage == 1 else ("planner", "searcher", "coder")


def asset_key(sft_steps: int, stage: int = 1) -> str:
    """Cache key of :func:`prepare`: its settings and the source of the code that makes the
    assets (a change there builds new ones instead of reusing stale files)."""
    import hashlib

    settings = f"v1|sft_steps={sft_steps}|{SMALL}" + ("" if stage == 1 else f"|stage={stage}")
    digest = hashlib.sha256(settings.encode())
    package = Path(mgrpo.__file__).resolve().parent
    for module in ASSET_MODULES:
        digest.update((package / module).read_bytes())
    return digest.hexdigest()[:16]


def default_cache_dir() -> Path:
    """``MGRPO_ASSET_CACHE``, else ``~/.cache/mgrpo/assets``."""
    return Path(os.environ.get("MGRPO_ASSET_CACHE")
                or Path.home() / ".cache" / "mgrpo" / "assets")


def prepare_cached(sft_steps: int = 60, cache_dir: Path | None = None,
                   stage: int = 1) -> dict[str, Path]:
    """:func:`prepare`, built once per (settings, code) and kept on disk: tests and repeated
    benchmark runs load the same warm-started models instead of re-running SFT. Built in a
    temporary folder and renamed into place, so concurrent callers never see half an entry
    (the loser of a race discards its copy). Callers must not write into the returned
    folders (both modes write checkpoints elsewhere)."""
    import shutil

    root = (cache_dir or default_cache_dir()) / asset_key(sft_steps, stage)
    if not (root / "complete").exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
        try:
            prepare(tmp, sft_steps=sft_steps, stage=stage)
            (tmp / "complete").write_text("ok\n")
            os.replace(tmp, root)
        except OSError:
            if not (root / "complete").exists():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"coder": root / ("coder" if "coder" in sft_roles(stage) else "init"),
            **{name: root / name for name in ASSET_NAMES}}


def prepare(root: Path, sft_steps: int = 60, stage: int = 1) -> dict[str, Path]:
    """Benchmark, demonstrations of ``stage``'s questions, a tiny init model, the SFT'd
    models of :func:`sft_roles` (stage 1: planner and searcher; the coder is the init model)
    and a single-agent model (``single``: SFT'd on the inline form of the same
    demonstrations, for ``algorithm: grpo``, with the planner's and the sub-agents' steps
    together)."""
    # on use: keeps torch out of this module's import
    import torch

    from mgrpo.models.sft import SFTConfig, load_sft_jsonl, train_sft
    from mgrpo.training.system import build_tools

    bench = build_benchmark(BenchmarkConfig(seed=0, n_train=120, n_dev=40, n_test=40,
                                            entities=SMALL))
    bench.save(root / "bench")
    tools = build_tools(bench, ["searcher", "coder"], tool_cfg={"search": {"k": 1}})
    errors = ExpertErrors.parse("planner.skip_delegation=0.5")
    roles = sft_roles(stage)
    write_demos(bench, root / "demos", tools, errors, n=200, stage=stage, seed=0)
    write_inline_demos(bench, root / "demos-inline", tools, errors, n=200, stage=stage, seed=0)
    texts = [d.text for d in bench.corpus.docs] + [
        "".join(s.text for s in e.segments)
        for role in roles for e in load_sft_jsonl(root / f"demos/{role}.jsonl")]
    config = TinyModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, intermediate_size=128, vocab_size=600)
    init_tiny(root / "init", config, corpus_texts=texts)
    paths = {"bench": root / "bench", "coder": root / "init", "init": root / "init"}
    for role, data, steps in (*((r, f"demos/{r}.jsonl", sft_steps) for r in roles),
                              ("single", "demos-inline/planner.jsonl", 2 * sft_steps)):
        model, tokenizer = load_model(root / "init")
        torch.manual_seed(0)
        train_sft(model, tokenizer, load_sft_jsonl(root / data),
                  SFTConfig(steps=steps, batch_size=16, lr=3e-3, eval_every=steps, seed=0))
        model.save_pretrained(root / role)
        tokenizer.save_pretrained(root / role)
        paths[role] = root / role
    return paths
