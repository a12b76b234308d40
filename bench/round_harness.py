"""The round bench's harness, part 1: the run config both modes share, the embedded round,
and what a finished round left behind (:class:`RoundData`, :func:`read_round`,
:func:`compare_rounds`, :func:`delegations`). Also the harness of
``tests/integration/services/test_services_parity.py`` and friends (through
``bench/round.py``, which re-exports it).

What it does NOT do: run services (``round_services``) or time anything (``round``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

MODELS = ("planner", "searcher", "coder")


@dataclass
class RoundData:
    """What one round left in its store and checkpoints, keyed for comparison."""

    outcomes: dict[tuple[str, int], tuple[bool, float, float]]  # (q, k) -> (format, correct, R)
    stats: dict[tuple[str, str, str], tuple[int, float, float]]  # (model, agent, key) -> n,mu,sd
    metrics: dict[str, float]
    tokens: dict[str, list[int]]  # traj_id -> input_ids, every model
    weights: dict[str, dict]  # model -> state dict of checkpoint v1
    wall_s: float = 0.0
    split: dict[str, float] = field(default_factory=dict)
    work: dict[str, float] = field(default_factory=dict)  # worker process -> episodes/calls
    # service process -> peak_rss_mb (its whole life), rss_at_start_mb and cpu_s (the timed
    # round's); distributed rounds only
    usage: dict[str, dict[str, float]] = field(default_factory=dict)


VARIANTS = ("co-training", "main-only", "grpo", "curriculum", "at_grpo")


def make_config(paths: dict[str, Path], out_dir: Path, *, b: int, k: int, seed: int = 3,
                name: str = "parity", temperature: float = 1.0, variant: str = "co-training",
                stage: int = 1):
    """The run config both modes share. ``name`` is the run id: round ids, hence every
    episode seed, derive from it, so both modes must use the same one. A ``temperature``
    above 1 flattens the warm-started (peaked) policies, so that a seeding difference
    between the modes shows up as different tokens (the parity test uses 1.5).

    ``variant``: ``co-training`` (M-GRPO, every model trained), ``main-only`` (M-GRPO,
    sub-agents frozen), ``grpo`` (one model ``single`` plays every role) or ``curriculum``
    (co-training on the questions a difficulty filter keeps: ``max_success`` 0.5 over 2
    filter rollouts per question) or ``at_grpo`` (tree sampling, K candidates per turn).

    ``stage``: the benchmark stage the round plays, as the assets' demonstrations did
    (``prepare_cached(..., stage=...)``): 1, look-ups (the planner calls the searcher), or 2,
    chains, comparisons and arithmetic (the searcher twice, then often the coder: the
    planner gets 4 turns, room for three calls and the answer)."""
    from mgrpo.training.config import RunConfig

    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r} is not one of {VARIANTS}")
    data = {
        "name": name, "seed": seed, "algorithm": "mgrpo",
        "agents": {"planner": "planner", "searcher": "searcher", "coder": "coder"},
        "models": {m: {"path": str(paths[m]), "lr": 1e-3, "micro_batch_size": 8}
                   for m in MODELS},
        "k": k, "queries_per_round": b, "tools": {"search": {"k": 1}},
        "sampling": {"planner_max_turns": 3 if stage == 1 else 4, "subagent_max_turns": 2,
                     "max_new_tokens": 24, "temperature": temperature},
        "stages": [{"stage": stage, "rounds": 1}], "eval_questions": 4,
        "bench_dir": str(paths["bench"]), "out_dir": str(out_dir)}
    if variant == "main-only":
        for model in ("searcher", "coder"):
            data["models"][model]["trainable"] = False
    elif variant == "grpo":
        data.update(algorithm="grpo", agents=dict.fromkeys(MODELS, "single"),
                    models={"single": {"path": str(paths["single"]), "lr": 1e-3,
                                       "micro_batch_size": 8}})
    elif variant == "at_grpo":
        data["algorithm"] = "at_grpo"
    elif variant == "curriculum":
        data["stages"] = [{"stage": stage, "rounds": 1, "max_success": 0.5,
                           "filter_samples": 2}]
    return RunConfig.model_validate(data)


def read_round(store, cfg, round_id: str, ckpt_root: str, version: int = 1) -> RoundData:
    """Outcomes, group statistics (n = 0 placeholder rows left out: see the parity test),
    metrics, every played model's token ids (frozen ones included: both modes store and
    score them) and the trained models' weights of ``version`` (round i writes version
    i + 1) of a finished round of run ``cfg.name``."""
    from mgrpo.models.checkpoint import load_checkpoint, run_root

    trained = cfg.trained_models()
    played = list(dict.fromkeys(cfg.agents.values()))
    outcomes = {(o.query_id, o.rollout): (o.format_ok, o.correct, o.reward)
                for o in store.read_planner_outcomes(round_id)}
    stats = {(s.model, s.agent, s.group_key): (s.n, s.mean, s.std)
             for s in store.read_group_stats(round_id) if s.n > 0 and s.model in played}
    tokens = {t.traj_id: list(t.input_ids)
              for m in played for t in store.round_trajectories(round_id, m)}
    weights = {m: load_checkpoint(run_root(ckpt_root, cfg.name), m, version=version)[0]
               for m in trained}
    metrics = store.metrics(cfg.name, round_id).get(round_id, {})
    return RoundData(outcomes, stats, metrics, tokens, weights)


def embedded_round(cfg, warmup: int = 0) -> RoundData:
    """One round of ``run_round`` in this process, on a fresh SQLite store; with ``warmup``
    = W, rounds 0..W-1 run first (untimed) and round W is the one timed and read."""
    from mgrpo.store import Store
    from mgrpo.training.loop import run_round, stage_pool
    from mgrpo.training.stages import stage_at
    from mgrpo.training.system import build_system
    from mgrpo.training.tree_round import run_at_grpo_round

    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    system = build_system(cfg)
    store = Store(f"sqlite:///{Path(cfg.out_dir).resolve() / 'store.db'}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    round_fn = run_at_grpo_round if cfg.algorithm == "at_grpo" else run_round
    for index in range(warmup + 1):
        started = time.perf_counter()
        metrics = round_fn(system, store, cfg.name, index,
                           stage_pool(system, stage_at(cfg, index)))
        wall = time.perf_counter() - started
    data = read_round(store, cfg, f"{cfg.name}-r{warmup:04d}",
                      str(Path(cfg.out_dir) / "checkpoints"), version=warmup + 1)
    data.wall_s = wall
    data.split = {key.removeprefix("time/"): value for key, value in metrics.items()
                  if key.startswith("time/")}
    store.close()
    return data

def compare_rounds(a: RoundData, b: RoundData) -> dict[str, float]:
    """Largest differences between two rounds (0 everywhere = identical). Count mismatches
    are reported as counts of keys present in only one round."""
    def max_diff(x: dict, y: dict, key_fn) -> float:
        common = x.keys() & y.keys()
        return max((key_fn(x[k], y[k]) for k in common), default=0.0)

    weight_diff = max(float((a.weights[m][p] - b.weights[m][p]).abs().max())
                      for m in a.weights for p in a.weights[m])
    metric_keys = {k for k in a.metrics.keys() & b.metrics.keys()
                   if not k.startswith(("time/", "throughput/"))}
    return {
        "outcome_keys_only_one_side": float(len(a.outcomes.keys() ^ b.outcomes.keys())),
        "outcome_mismatches": float(sum(a.outcomes[k] != b.outcomes[k]
                                        for k in a.outcomes.keys() & b.outcomes.keys())),
        "token_keys_only_one_side": float(len(a.tokens.keys() ^ b.tokens.keys())),
        "token_mismatches": float(sum(a.tokens[k] != b.tokens[k]
                                      for k in a.tokens.keys() & b.tokens.keys())),
        "stat_keys_only_one_side": float(len(a.stats.keys() ^ b.stats.keys())),
        "stat_max_abs_diff": max_diff(a.stats, b.stats, lambda u, v: max(
            abs(p - q) for p, q in zip(u, v, strict=True))),
        "metrics_compared": float(len(metric_keys)),
        "metric_max_abs_diff": max((abs(a.metrics[k] - b.metrics[k]) for k in metric_keys),
                                   default=0.0),
        "weight_max_abs_diff": weight_diff,
        "weight_tensors": float(sum(len(a.weights[m]) for m in a.weights)),
    }

def delegations(data: RoundData, cfg) -> dict[str, int]:
    """Trajectories per sub-agent model in a round: 0 means the planner never delegated, and
    the round timed no sub-agent work at all."""
    return {m: sum(f"/{role}/" in t for t in data.tokens for role in cfg.agents
                   if cfg.agents[role] == m and role != "planner")
            for m in cfg.trained_models() if m != cfg.agents["planner"]}
