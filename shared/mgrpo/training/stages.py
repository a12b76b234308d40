"""The stages of a run: which stage each round belongs to, and a stage's training pool
(difficulty-filtered when the stage says so; docs/algorithm.md, 'Algorithms by mode').

A filtered pool is stored (``<out_dir>/pools/<run>-stage<i>.json``: the kept question ids and
the filter's settings) when it is first computed and read back afterwards, so an embedded
run resumed mid-stage trains on the pool the uninterrupted run chose, not on one re-filtered
by the resumed weights. A fresh run (no completed round) clears its stored pools first
(:func:`clear_pools`)."""

from __future__ import annotations

import json
from pathlib import Path

from mgrpo.atomic import write_text_atomic
from mgrpo.training.config import RunConfig
from mgrpo.training.rounds import collect, score
from mgrpo.training.system import System


def stage_schedule(cfg: RunConfig) -> list[tuple[int, int]]:
    """(stage index, global round index) for every round of the run."""
    out, g = [], 0
    for s, stage in enumerate(cfg.stages):
        for _ in range(stage.rounds):
            out.append((s, g))
            g += 1
    return out


def stage_at(cfg: RunConfig, round_index: int) -> int:
    """The stage index of global round ``round_index`` (past the schedule: the last stage,
    for distributed runs that go on)."""
    schedule = stage_schedule(cfg)
    if round_index < len(schedule):
        return schedule[round_index][0]
    return max(len(cfg.stages) - 1, 0)


def filter_round_id(run_id: str, stage_index: int) -> str:
    """The id of a stage's difficulty-filter episodes: their seeds derive from it (as a
    training round's derive from its id), so both modes sample the same filter episodes."""
    return f"{run_id}-filter{stage_index}"


def hard_questions(pool: list, correct: list[tuple[str, float]], max_success: float) -> list:
    """The curriculum's difficulty filter: the questions of ``pool`` whose success rate over their
    filter rollouts (``correct``: (query id, 0/1) per rollout) is below ``max_success``; the whole
    pool if none is (a stage never runs out of questions)."""
    success: dict[str, list[float]] = {}
    for query_id, value in correct:
        success.setdefault(query_id, []).append(float(value))
    kept = [q for q in pool
            if q.id in success and sum(success[q.id]) / len(success[q.id]) < max_success]
    return kept or pool


def pool_path(cfg: RunConfig, run_id: str, stage_index: int) -> Path:
    return Path(cfg.out_dir) / "pools" / f"{run_id}-stage{stage_index}.json"


def clear_pools(cfg: RunConfig, run_id: str) -> None:
    """Forget run ``run_id``'s stored pools (a fresh start: its weights are new)."""
    for path in (Path(cfg.out_dir) / "pools").glob(f"{run_id}-stage*.json"):
        path.unlink(missing_ok=True)


def stage_pool(system: System, stage_index: int, run_id: str | None = None) -> list:
    """Training questions of a stage, difficulty-filtered when ``max_success`` < 1:
    keep queries the system at the start of the stage solves less often than the
    threshold; stored, and reused when the stage's pool is asked for again (a resume). The
    distributed path (``mgrpo.services.rounds``) plays the same episodes as a filter round."""
    stage = system.cfg.stages[stage_index]
    pool = system.bench.questions("train", stage=stage.stage)
    if stage.max_success >= 1.0:
        return pool
    run_id = run_id or system.cfg.name
    path = pool_path(system.cfg, run_id, stage_index)
    settings = {"stage": stage.stage, "max_success": stage.max_success,
                "filter_samples": stage.filter_samples}
    if path.exists():
        saved = json.loads(path.read_text())
        by_id = {q.id: q for q in pool}
        if saved.get("settings") == settings and all(i in by_id for i in saved["ids"]):
            return [by_id[i] for i in saved["ids"]]
    episodes = collect(system, filter_round_id(run_id, stage_index), pool,
                       k=stage.filter_samples, seed=system.cfg.seed)
    outcomes = score(system, episodes)
    kept = hard_questions(pool, [(o.query_id, o.correct) for o in outcomes], stage.max_success)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps({"settings": settings, "ids": [q.id for q in kept]}))
    return kept
