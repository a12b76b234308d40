"""How one ``turn_team`` round's time grows with K, team turns and agents (embedded mode).

One round of :func:`mgrpo.training.team_round.run_team_round` per config, on the tiny model
of ``mgrpo models init-tiny`` (untrained: it does not solve, so every episode plays its full
``turns`` team turns; ``team_turns`` in each row says so), B tasks (``--b``, default 2) of
Plan-Path:

- ``--ks`` (default 2 4 8): candidates per (task, role, team turn);
- ``--turns`` (default 1 2 4): team turns per episode (the world's and the workflow's limit);
- ``--agents`` (default solo team): ``solo`` is ``plan_path_solo`` (one role, one model),
  ``team`` is ``plan_path`` (tool + plan, one model per role: specialised), ``shared`` is
  ``plan_path`` with one model playing both roles.

Every config of the product is a fresh system (models loaded, SQLite store) that plays
``--warmup`` untimed rounds, then the timed one. Per config: the round's wall time, this
process's CPU seconds in it (``cpu_s``: on a loaded machine closer to a quiet machine's
wall time than the wall time is) and its phases (``rollout_s``: tree play, K requests per
live episode and role each team turn; ``ingest_s``: the candidates into the store;
``update_s``: each model's AT-GRPO update; ``weight_sync_s``: checkpoint and optimizer
state written), the candidates sampled and tokens generated, the load average before and
after; its ratios to the smallest config (the first of the product) beside the work ratio
``K x turns x roles / that of the smallest``. Then least-squares slopes of each time on
``K x turns x roles`` (candidates per task), the process's peak resident memory and the
machine (load included: on a shared machine wall times move with it).

What it does NOT do: the services' mode (a turn_team run trains embedded only), warm-started
models (the tool role's text is not code, so the sandbox is not run: tree play here is
generation and state copies), repeats (one timed round each: read single figures as such),
or larger models.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/team_round.py [--ks 2 4 8] [--turns 1 2 4]
        [--agents solo team] [--b 2] [--max-new-tokens 16] [--warmup 1]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

from report import fit, load_avg, progress, write_result  # noqa: E402

RESULT_FILE = Path(__file__).resolve().parent / "results" / "team_round.json"
# agents -> (world, {role: model})
AGENTS = {"solo": ("plan_path_solo", {"plan": "plan"}),
          "team": ("plan_path", {"tool": "tool", "plan": "plan"}),
          "shared": ("plan_path", {"tool": "shared", "plan": "shared"})}
PHASES = ("rollout_s", "ingest_s", "update_s", "weight_sync_s")


def make_config(tiny: Path, out_dir: Path, *, agents: str, k: int, turns: int, b: int,
                max_new_tokens: int, size: int):
    from mgrpo.training.config import RunConfig

    world, roles = AGENTS[agents]
    return RunConfig.model_validate({
        "name": f"team-{agents}-k{k}-t{turns}", "seed": 0, "out_dir": str(out_dir),
        "k": k, "queries_per_round": b, "report_to": [],
        "stages": [{"stage": None, "rounds": 1}],
        "sampling": {"max_new_tokens": max_new_tokens},
        "models": {m: {"path": str(tiny), "lr": 1e-4} for m in set(roles.values())},
        "workflow": {"kind": "turn_team", "world": world, "roles": roles, "alpha": 1.0,
                     "max_turns": turns, "world_options": {"size": size, "max_turns": turns}}})


def one_config(tiny: Path, root: Path, agents: str, k: int, turns: int, args) -> dict:
    from mgrpo.store import Store
    from mgrpo.training.team_round import build_team_system, run_team_round

    cfg = make_config(tiny, root / f"{agents}-k{k}-t{turns}", agents=agents, k=k, turns=turns,
                      b=args.b, max_new_tokens=args.max_new_tokens, size=args.size)
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    system = build_team_system(cfg)
    store = Store(f"sqlite:///{Path(cfg.out_dir).resolve() / 'store.db'}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    pool = system.world.tasks("train", 4 * args.b, cfg.seed)
    for index in range(args.warmup):
        run_team_round(system, store, cfg.name, index, pool)
    load_before = load_avg()
    started, cpu_started = time.perf_counter(), time.process_time()
    metrics = run_team_round(system, store, cfg.name, args.warmup, pool)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    round_id = f"{cfg.name}-r{args.warmup:04d}"
    candidates = sum(len(store.round_trajectories(round_id, m)) for m in system.models)
    store.close()
    roles = len(AGENTS[agents][1])
    return {"agents": agents, "roles": roles, "models": len(system.models), "K": k,
            "turns": turns, "B": args.b, "work": k * turns * roles,
            "wall_s": round(wall, 4), "cpu_s": round(cpu, 4),
            "phases": {p: round(metrics[f"time/{p}"], 4) for p in PHASES},
            "candidates": candidates,
            "generated_tokens": int(metrics["rollout/generated_tokens"]),
            "team_turns": metrics["team/team_turns"], "solved": metrics["team/accuracy"],
            "load_avg_before": load_before, "load_avg_after": load_avg()}


def summarize(rows: list[dict]) -> dict:
    """Each row's ratios to the first (smallest) config, and slopes of the times on work
    (K x turns x roles)."""
    base = rows[0]
    for row in rows:
        row["ratio"] = {"work": round(row["work"] / base["work"], 3),
                        "wall": round(row["wall_s"] / base["wall_s"], 3),
                        "cpu": round(row["cpu_s"] / base["cpu_s"], 3),
                        **{p: round(row["phases"][p] / base["phases"][p], 3)
                           if base["phases"][p] > 0 else None for p in PHASES}}

    def per_work(key) -> float | None:
        return fit([(r["work"], key(r)) for r in rows])

    return {"wall_s_per_work": per_work(lambda r: r["wall_s"]),
            "cpu_s_per_work": per_work(lambda r: r["cpu_s"]),
            **{f"{p}_per_work": per_work(lambda r, p=p: r["phases"][p]) for p in PHASES},
            "generated_tokens_per_work": per_work(lambda r: r["generated_tokens"])}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--agents", nargs="+", default=["solo", "team"], choices=sorted(AGENTS))
    parser.add_argument("--b", type=int, default=2, help="tasks per round")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="per action")
    parser.add_argument("--size", type=int, default=4, help="Plan-Path grid side")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed rounds each config plays before the timed one")
    parser.add_argument("--out", type=Path, default=RESULT_FILE)
    args = parser.parse_args(argv)
    from mgrpo.models import TinyModelConfig, init_tiny

    rows = []
    with tempfile.TemporaryDirectory(prefix="mgrpo-team-round-") as tmp:
        tiny = init_tiny(Path(tmp) / "tiny", TinyModelConfig(seed=0))
        for agents, k, turns in itertools.product(args.agents, sorted(args.ks),
                                                  sorted(args.turns)):
            rows.append(one_config(tiny, Path(tmp), agents, k, turns, args))
            progress(rows[-1], ("agents", "K", "turns", "wall_s", "cpu_s", "phases",
                                "load_avg_after"))
    return write_result({"bench": "team_round", "world": "plan_path", "B": args.b,
                         "max_new_tokens": args.max_new_tokens, "size": args.size,
                         "warmup": args.warmup, "slopes": summarize(rows), "rows": rows},
                        args.out, argv, rss_key="peak_rss_mb")


if __name__ == "__main__":
    main()
