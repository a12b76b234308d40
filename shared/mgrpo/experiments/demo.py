"""`make demo`: the whole pipeline on tiny models, embedded, on this laptop.

benchmark -> expert demonstrations (with a systematic planner error) -> tiny models ->
supervised warm start -> held-out evaluation -> M-GRPO co-training rounds -> evaluation
again -> before/after table, curves (PNG) and TensorBoard logs under ``runs/demo``.

The warm start is deliberately imperfect: a share of the planner's demonstrations answers
without delegating (a plausible wrong guess). Greedy decoding then inherits part of that
habit, which leaves RL room to show (noise spread thinly over the demonstrations leaves greedy
accuracy at 100%).
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator

from mgrpo.envs import BenchmarkConfig, build_benchmark
from mgrpo.envs.demos import write_demos
from mgrpo.envs.experts import ExpertErrors
from mgrpo.experiments.demo_recipe import claim
from mgrpo.experiments.demo_spread import demo_spread
from mgrpo.experiments.plots import plot_run
from mgrpo.models import TinyModelConfig, init_tiny, load_model
from mgrpo.models.permissions import make_readable
from mgrpo.training.config_yaml import map_paths
from mgrpo.training.numerics import describe, pin
from mgrpo.validation import StrictModel


class DemoConfig(StrictModel):
    out_dir: str = "runs/demo"
    seed: int = 0
    stage: int | None = Field(1, description="Benchmark stage of the demonstrations (None: "
                              "both), of the RL rounds unless `stages` is set, and of the "
                              "held-out evaluation unless `eval_stage` is set.")
    demos_per_agent: int = 2000
    n_train: int = Field(6000, description="Training questions (about 35% are stage 1).")
    planner_errors: dict[str, float] = Field(
        default_factory=lambda: {"skip_delegation": 0.5})
    searcher_errors: dict[str, float] = Field(default_factory=lambda: {"bad_query": 0.2})
    coder_errors: dict[str, float] = Field(default_factory=dict)
    tools: dict[str, dict] = Field(
        default_factory=lambda: {"search": {"k": 1}},
        description="Terse observations (top-1 document) keep sequences short for tiny models.")
    sft_steps: dict[str, int] = Field(
        default_factory=lambda: {"planner": 1000, "searcher": 1000, "coder": 200},
        description="Warm-start steps per role: the planner must learn to copy unseen "
        "entity names into its delegations, which takes the longest.")
    train_entities: dict[str, int] = Field(
        default_factory=lambda: {"city": 135, "person": 270, "company": 200},
        description="Training entities per type: many distinct names make copying, not "
        "memorising, the cheaper way to fit the demonstrations.")
    held_out_entities: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="Dev and test entities per type over the "
        "benchmark's defaults (dev 20/30/15, test 25/35/18 cities/people/companies: 252 "
        "distinct stage-1 test questions), e.g. a larger test split for the ablation. The "
        "name pools are nearly used up, so a larger test takes its names from dev. Names are "
        "drawn with the training ones: any change gives another benchmark and warm start.")
    vocab_size: int = Field(512, description="BPE size; small so names split into syllables.")
    n_test: int = Field(600, description="Test questions (about 35% are stage 1).")
    sft_batch: int = 32
    rounds: int = 40
    stages: list[dict] | None = Field(
        None, description="RL curriculum, e.g. [{stage: 1, rounds: 10}, {stage: 2, rounds: "
        "40}] (`make demo-full`); default: `rounds` rounds of `stage`.")
    eval_stage: int | None = Field(None, description="Held-out stage (default: `stage`).")
    queries_per_round: int = 16
    k: int = 8
    lr: float = 2e-4
    eval_questions: int = 200
    eval_every: int = Field(
        10, ge=0, description="Greedy held-out evaluation every N rounds, besides before and "
        "after (sampled and greedy): accuracy.png draws these points (0: before/after only).")
    threads: int = Field(
        1, ge=1, description="torch intra-op threads, fixed so the same seed gives the same "
        "weights whatever OMP_NUM_THREADS the shell has (matmul reductions split by thread).")
    cpu_kernels: Literal["avx2", "native"] = Field(
        "avx2", description="CPU kernels of torch and MKL: avx2 pins them to the AVX2 ones "
        "every x86-64 CPU has, so machines with other vector units (AVX-512) take the same "
        "kernel paths and the same seed gives the same weights; native: each machine's "
        "best (mgrpo.training.numerics).")
    run_set: dict[str, Any] = Field(
        default_factory=dict, description="Run-config options over the demo's own, dotted "
        "keys as `mgrpo train --set` (`mgrpo demo --set KEY=VALUE`), e.g. {max_staleness: 1, "
        "loss.rollout_is: token}: the RL rounds in the asynchronous mode. Checked against "
        "the run config before the warm start.")

    @model_validator(mode="after")
    def _one_schedule(self) -> DemoConfig:
        if self.stages is not None and "rounds" in self.model_fields_set:
            raise ValueError("set either rounds (one stage) or stages (a curriculum), not both")
        return self

    @model_validator(mode="after")
    def _run_set_is_valid(self) -> DemoConfig:
        """A bad ``run_set`` fails now, not after ten minutes of warm start."""
        # on use: keeps torch out of this module's import
        from mgrpo.training.config import RunConfig

        if self.run_set:
            placeholder = dict.fromkeys(("planner", "searcher", "coder"), "unbuilt")
            RunConfig.model_validate(run_config(self, placeholder))
        return self

    def schedule(self) -> list[dict]:
        return self.stages if self.stages is not None else [{"stage": self.stage,
                                                             "rounds": self.rounds}]

    def held_out_stage(self) -> int | None:
        return self.eval_stage if "eval_stage" in self.model_fields_set else self.stage


def _stamp(msg: str, t0: float) -> None:
    print(f"[demo {time.perf_counter() - t0:6.1f}s] {msg}", flush=True)


ROLES = ("planner", "searcher", "coder")  # the demo's models, each warm-started by prepare


def sft_dir(cfg: DemoConfig, name: str) -> Path:
    """Where model ``name``'s warm start is saved; it counts as built once its config is."""
    return Path(cfg.out_dir) / "models" / "sft" / name


def pin_cpu(cfg: DemoConfig) -> dict:
    """The demo's kernels and thread count for this process (warm start and RL alike),
    before its first tensor operation (:mod:`mgrpo.training.numerics`); returns what is
    in use."""
    return pin(cfg.threads, cfg.cpu_kernels)


def demo_benchmark(cfg: DemoConfig):
    """The demo's benchmark: the built-in generator with the demo's sizes and entities."""
    entities = BenchmarkConfig().entities
    entities["train"] = dict(cfg.train_entities)
    for split, counts in cfg.held_out_entities.items():
        if split not in ("dev", "test"):
            raise ValueError(f"held_out_entities: {split!r} is not dev or test "
                             "(training entities are train_entities)")
        entities[split] = dict(counts)
    return build_benchmark(BenchmarkConfig(seed=cfg.seed, n_test=cfg.n_test,
                                           n_train=cfg.n_train, entities=entities))


def prepare(cfg: DemoConfig, t0: float) -> dict[str, str]:
    """Benchmark, demonstrations, tiny models and their warm start; returns model paths."""

    # on use: keeps torch out of this module's import
    from mgrpo.training.system import build_tools

    cpu = pin_cpu(cfg)
    _stamp(f"torch {cpu['torch']}, {cpu['threads']} thread(s), {cpu['kernels']} kernels", t0)
    claim(cfg)  # another recipe in this folder is refused before anything is written
    out = Path(cfg.out_dir)
    bench = demo_benchmark(cfg)
    bench.save(out / "bench")
    _stamp(f"benchmark: {bench.counts()}", t0)
    built = {role: sft_dir(cfg, role) for role in ROLES}
    if all((path / "config.json").exists() for path in built.values()):
        # Demonstrations only feed the warm start: a second `mgrpo ablate` on the same
        # warm start neither spends 12 s to a minute rewriting them nor rewrites files
        # another call may be reading.
        _stamp(f"warm start: reusing {', '.join(ROLES)} in {built['planner'].parent}", t0)
        return {role: str(path) for role, path in built.items()}
    errors = ExpertErrors(planner=cfg.planner_errors, searcher=cfg.searcher_errors,
                          coder=cfg.coder_errors)
    tools = build_tools(bench, ["searcher", "coder"], tool_cfg=cfg.tools)
    summary = write_demos(bench, out / "demos", tools, errors, n=cfg.demos_per_agent,
                          stage=cfg.stage, seed=cfg.seed, progress=True)
    files = {agent: out / "demos" / f"{agent}.jsonl" for agent in summary["records"]}
    # Sub-agents learn from every delegation the expert planner makes when it does not skip,
    # with their own error rates: the planner's skipping must not starve them of data.
    no_skip = errors.model_copy(update={"planner": type(errors.planner)()})
    sub = write_demos(bench, out / "demos-subagents", tools, no_skip, n=cfg.demos_per_agent,
                      stage=cfg.stage, seed=cfg.seed + 1, progress=True)
    for agent in ("searcher", "coder"):  # the coder when the stages include its tasks
        if agent in sub["records"]:
            files[agent] = out / "demos-subagents" / f"{agent}.jsonl"
    if "coder" not in files:  # stage 1 never needs the coder: teach it on stage-2 tasks
        write_demos(bench, out / "demos-coder", tools, errors, n=cfg.demos_per_agent // 2,
                    stage=2, seed=cfg.seed, progress=True)
        files["coder"] = out / "demos-coder" / "coder.jsonl"
    _stamp(f"demonstrations: {summary['records']}, expert accuracy "
           f"{summary['accuracy']:.2f}", t0)
    texts = tokenizer_texts(bench, list(files.values()))
    return {role: warm_start(cfg, role, path, cfg.sft_steps.get(role, 300), texts, t0)
            for role, path in files.items()}


def tokenizer_texts(bench, sft_files: list[Path]) -> list[str]:
    """What the tokenizer is trained on: TRAINING documents and demonstrations only, so
    test entities' names decompose into pieces (syllables) the models were trained on, not
    into tokens nobody ever trained."""
    # on use: keeps torch out of this module's import
    from mgrpo.models.sft import load_sft_jsonl

    train_docs = {e.doc_id for e in bench.kg.entities if e.split == "train"}
    texts = [d.text for d in bench.corpus.docs if d.id in train_docs]
    for path in sft_files:
        texts += ["".join(s.text for s in ex.segments) for ex in load_sft_jsonl(path)[:300]]
    return texts


def warm_start(cfg: DemoConfig, name: str, data: Path, steps: int, texts: list[str],
               t0: float) -> str:
    """A tiny model ``name`` built and SFT-trained on ``data``; a finished one is reused."""
    # on use: keeps torch out of this module's import
    import torch

    from mgrpo.models.sft import SFTConfig, load_sft_jsonl, save_metrics, train_sft

    target = sft_dir(cfg, name)
    if (target / "config.json").exists():
        _stamp(f"warm start {name}: reusing {target}", t0)
        return str(target)
    base = Path(cfg.out_dir) / "models" / "init" / name
    init_tiny(base, TinyModelConfig(vocab_size=cfg.vocab_size, seed=cfg.seed),
              corpus_texts=texts)
    model, tokenizer = load_model(base)
    torch.manual_seed(cfg.seed)
    metrics = train_sft(model, tokenizer, load_sft_jsonl(data),
                        SFTConfig(steps=steps, batch_size=cfg.sft_batch, seed=cfg.seed,
                                  eval_every=100), progress=True, log_name=name)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    save_metrics(metrics, target / "sft_metrics.json")
    make_readable(target)  # the services' user must read what this user wrote
    curve = metrics["eval_loss"] or list(enumerate(metrics["train_loss"]))  # few examples:
    kind = "eval" if metrics["eval_loss"] else "train"                     # no eval split
    _stamp(f"warm start {name}: {kind} loss {curve[0][1]:.3f} -> {curve[-1][1]:.3f}", t0)
    return str(target)


def run_config(cfg: DemoConfig, paths: dict[str, str]) -> dict:
    """The RL run's config fields: the demo's settings, then ``cfg.run_set`` over them."""
    # on use: keeps torch out of this module's import
    from mgrpo.training.overrides import apply_overrides

    return apply_overrides(copy.deepcopy({
        "name": "demo", "seed": cfg.seed, "algorithm": "mgrpo",
        "cpu_kernels": cfg.cpu_kernels, "cpu_threads": cfg.threads,
        "models": {role: {"path": p, "lr": cfg.lr} for role, p in paths.items()},
        "tools": cfg.tools,
        "k": cfg.k, "queries_per_round": cfg.queries_per_round,
        "stages": cfg.schedule(),
        "eval_questions": cfg.eval_questions, "eval_stage": cfg.held_out_stage(),
        "eval_every": cfg.eval_every,
        "bench_dir": str(Path(cfg.out_dir) / "bench"),
        "out_dir": str(Path(cfg.out_dir) / "run"),
    }), dict(cfg.run_set))


def table(before: dict, after: dict) -> str:
    keys = sorted(k for k in after if k.startswith("eval/"))
    lines = ["| metric | before | after |", "| --- | ---: | ---: |"]
    lines += [f"| {k} | {before.get(k, float('nan')):.3f} | {after[k]:.3f} |" for k in keys]
    return "\n".join(lines)


def run_demo(cfg: DemoConfig, log_every: int = 1) -> dict:
    # on use: keeps torch, sqlalchemy out of this module's import
    from mgrpo.training.config import RunConfig
    from mgrpo.training.loop import run_training

    t0 = time.perf_counter()
    paths = prepare(cfg, t0)
    run_cfg = RunConfig.model_validate(run_config(cfg, paths))
    # Paths relative to demo.yaml's folder, as a config file's are read (`mgrpo eval
    # --config runs/demo/demo.yaml` from anywhere).
    Path(cfg.out_dir, "demo.yaml").write_text(yaml.safe_dump(map_paths(
        run_cfg.model_dump(mode="json"), lambda p: os.path.relpath(p, cfg.out_dir)),
        sort_keys=False))
    stale = {m: n for m in run_cfg.trained_models() if (n := run_cfg.staleness(m)) > 0}
    _stamp("M-GRPO co-training (embedded" + (f", asynchronous, max_staleness {stale}"
                                             if stale else "") + ")", t0)
    result = run_training(run_cfg, log_every=log_every)
    plots = plot_run(run_cfg.out_dir)
    summary = {"before": result.before, "after": result.after, "rounds": result.rounds,
               "wall_s": round(time.perf_counter() - t0, 1), "run_set": cfg.run_set,
               "cpu": describe(),
               "plots": [str(p) for p in plots]}
    Path(cfg.out_dir, "summary.json").write_text(json.dumps(summary, indent=2))
    print(table(result.before, result.after))
    if spread := demo_spread(cfg):
        print(spread)
    _stamp(f"done: {cfg.out_dir}/summary.json, plots in {run_cfg.out_dir}/plots, "
           f"tensorboard --logdir {run_cfg.out_dir}/tensorboard", t0)
    return summary
