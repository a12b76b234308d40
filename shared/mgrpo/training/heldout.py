"""What ``mgrpo eval`` evaluates: which questions, which weights, which benchmark.

- Questions: the first ``n`` of a split, of one stage. A selection that would mix stage-1
  look-ups with stage-2 questions is refused unless asked for (``stage="all"``), so ``--n
  200`` on a small benchmark never slips stage-2 questions into a "stage-1" number.
- Weights: a run's latest checkpoints (``out_dir/checkpoints/<name>``), loaded over the models'
  starting ``path`` s, so one config evaluates the warm start and the trained system.
- Benchmark: the run's benchmark config rebuilt with another generator seed (new entities,
  same templates and sizes), to check that a gain is not memorisation of our own entities.

:func:`evaluate_hierarchy` is the hierarchy's ``mgrpo eval`` (its runner's,
:mod:`mgrpo.training.runners`).

What this module does not do: play episodes or score them (``mgrpo.training.evaluate``).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Literal

from mgrpo.envs import build_benchmark, load_benchmark
from mgrpo.models.checkpoint import latest_version, load_checkpoint, version_uri
from mgrpo.progress import progress_bar
from mgrpo.workflows import EvalRefused

Stage = int | Literal["all"] | None


def parse_stage(text: str | None) -> Stage:
    """``--stage`` text -> 1, 2, "all" or None (not given)."""
    if text is None:
        return None
    if text == "all":
        return "all"
    if text in ("1", "2"):
        return int(text)
    raise ValueError(f"stage {text!r}: expected 1, 2 or all")


def select_questions(bench, split: str, n: int, stage: Stage) -> list:
    """The first ``n`` questions of ``split`` of ``stage`` (1 or 2); ``"all"``: of every stage.
    ``None`` takes every stage only when that does not mix stages; otherwise ValueError."""
    if n < 1:
        raise ValueError(f"n={n}: evaluate at least one question")
    questions = bench.questions(split, stage=stage if isinstance(stage, int) else None)[:n]
    if not questions:
        raise ValueError(f"split {split!r} has no stage-{stage} questions")
    stages = Counter(q.stage for q in questions)
    if stage is None and len(stages) > 1:
        counts = ", ".join(f"{c} of stage {s}" for s, c in sorted(stages.items()))
        raise ValueError(f"the first {n} {split} questions mix stages ({counts}); pass "
                         "--stage 1 or --stage 2, or --stage all to mix them on purpose")
    return questions


def load_trained(system) -> dict[str, int]:
    """Load the latest checkpoint of each model of ``system``'s run (its ``out_dir`` and
    ``name``) into the model in place; returns {model: version}. Models the run never
    checkpointed (frozen ones) keep their ``path`` weights; no checkpoint at all is an error."""
    # on use: keeps torch out of this module's import
    from mgrpo.training.run_state import checkpoint_root, sync_sampler

    root = checkpoint_root(system.cfg)
    loaded = {}
    for lm in system.models.values():
        version = latest_version(root, lm.name)
        if version is not None:
            load_checkpoint(root, lm.name, version=version, model=lm.model)
            lm.version = version
            sync_sampler(lm, version_uri(root, lm.name, version))
            loaded[lm.name] = version
    if not loaded:
        raise FileNotFoundError(f"run {system.cfg.name!r} has no checkpoints under {root}")
    return loaded


def other_seed_benchmark(bench_dir: str | Path, seed: int, out: str | Path) -> Path:
    """Build (once) the benchmark of ``bench_dir``'s config with generator ``seed`` into
    ``out``: new entities, documents and questions from the same templates and sizes."""
    out = Path(out)
    if (out / "benchmark.json").exists():
        built = load_benchmark(out)
        if built.config is not None and built.config.seed == seed:
            return out
        raise FileExistsError(f"{out} holds another benchmark; remove it or pick another folder")
    config = load_benchmark(bench_dir).config
    if config is None:
        raise ValueError(f"{bench_dir} has no generator config (a user benchmark?); only a "
                         "built-in benchmark can be rebuilt with another seed")
    if config.seed == seed:
        raise ValueError(f"{bench_dir} was built with seed {seed} already; pick another seed")
    build_benchmark(config.model_copy(update={"seed": seed})).save(out)
    return out


def name_overlap(train_bench, other_bench, split: str = "test") -> float:
    """Share of ``other_bench``'s ``split`` entities whose name is also the name of one of
    ``train_bench``'s training entities (0 for a benchmark without a knowledge graph)."""
    if train_bench.kg is None or other_bench.kg is None:
        return 0.0
    seen = {e.name for e in train_bench.kg.entities if e.split == "train"}
    names = [e.name for e in other_bench.kg.entities if e.split == split and not e.distractor]
    return sum(n in seen for n in names) / max(len(names), 1)


def evaluate_hierarchy(cfg, request) -> dict:
    """``mgrpo eval`` on a hierarchy run (an :class:`mgrpo.workflows.EvalRequest`): its
    metrics on the first ``n`` questions of ``split`` of one stage (``stage``, else the
    config's ``eval_stage``), with ``subagent`` also played alone; with ``bench_seed``, the
    same beside on that generator seed's benchmark (built once into ``BENCH_DIR-seedS``)."""
    stage = request.stage if request.stage is not None else cfg.eval_stage
    result = evaluate_on(cfg, request, stage)
    if request.bench_seed is None:
        return result
    seed = request.bench_seed
    try:
        other = other_seed_benchmark(cfg.bench_dir, seed, f"{cfg.bench_dir.rstrip('/')}-seed{seed}")
    except ValueError as exc:
        raise EvalRefused(str(exc), "pass --bench-seed with a seed other than the benchmark's "
                          "own") from None
    config = load_benchmark(cfg.bench_dir).config
    own = config.seed if config is not None else "?"
    beside = evaluate_on(cfg.model_copy(update={"bench_dir": str(other)}), request, stage)
    # the episodes shown: the run's own benchmark's, then the other seed's
    episodes = result.pop("episodes", []) + beside.pop("episodes", [])
    return {f"seed {own}": result, f"seed {seed}": beside,
            "name_overlap": name_overlap(load_benchmark(cfg.bench_dir), load_benchmark(other),
                                         request.split),
            **({"episodes": episodes} if episodes else {})}


def evaluate_on(cfg, request, stage: Stage) -> dict:
    """One evaluation of ``cfg``'s hierarchy: metrics plus what was evaluated."""
    # on use: keeps torch, sqlalchemy out of this module's import
    from mgrpo.training.evaluate import evaluate, evaluate_subagent
    from mgrpo.training.system import build_system

    system = build_system(cfg)
    try:
        questions = select_questions(system.bench, request.split, request.n, stage)
    except ValueError as exc:
        raise EvalRefused(f"{cfg.bench_dir}: {exc}", "see `mgrpo data show "
                          f"{cfg.bench_dir}` for the questions per split and stage") from None
    subagent = request.subagent
    if subagent is not None and (subagent not in system.runtimes or subagent == "planner"):
        raise EvalRefused(f"--subagent {subagent!r} is not a sub-agent of this run",
                          f"one of {sorted(r for r in system.runtimes if r != 'planner')}")
    versions = load_trained(system) if request.checkpoints else {}
    records: list[dict] = []
    with progress_bar(desc="eval", total=len(questions)) as bar:
        result: dict = evaluate(system, questions, greedy=request.greedy, progress=bar.update,
                                records=records, keep=request.episodes or 0)
    if subagent is not None:
        result.update(evaluate_subagent(system, subagent, questions, greedy=request.greedy))
    result.update({"split": request.split, "stages": sorted({q.stage for q in questions}),
                   "questions": len(questions), "bench_dir": cfg.bench_dir,
                   "weights": {name: f"{cfg.name} v{v}" for name, v in versions.items()}
                   or "models' paths"})
    if request.episodes:
        result["episodes"] = records
    return result
