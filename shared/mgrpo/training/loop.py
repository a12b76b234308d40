"""The embedded training loop: rounds of collect -> score -> store -> train -> checkpoint.

Every round goes through the stats store exactly as in distributed mode: the planner side
writes its outcomes, every trajectory is ingested, and each model's trainer reads back ONLY
its own model's trajectories and the planner outcomes, publishes its group statistics, and
updates. State needed to resume (last complete round, weights, optimizer moments) is
checkpointed atomically after each round; every random choice is a pure function of
(seed, round), so a resumed run repeats what the uninterrupted run would have done.

Runs: checkpoints go under ``out_dir/checkpoints/<name>/`` and optimizer state under
``out_dir/optim/<name>/`` (:func:`run_dirs`), so a run never writes another's versions, even
in a shared ``out_dir``. The state file (the commit point) names its run. A run starts from
each model's ``path``, or from another run's checkpoint when ``init_from`` names it. At
start, what a killed run left uncommitted (temp folders, versions after the state file's)
is removed; versions are written once, so a fresh run over existing versions of the same
name is refused.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mgrpo.training.config import RunConfig
from mgrpo.training.evaluate import evaluate
from mgrpo.training.metrics import MetricsLogger
from mgrpo.training.rounds import collect, observed_d, sample_questions, score, train_model
from mgrpo.training.scoring import d_counts
from mgrpo.training.system import System, build_system, out_path

STATE_FILE = "state.json"


@dataclass
class RunResult:
    out_dir: Path
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    rounds: int = 0
    wall_s: float = 0.0


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def run_dirs(cfg: RunConfig, run_id: str | None = None,
             out_dir: str | None = None) -> tuple[str, Path]:
    """(checkpoint root, optimizer folder) of run ``run_id`` (default: ``cfg.name``) in
    ``out_dir`` (default: ``cfg.out_dir``)."""
    from mgrpo.models.checkpoint import run_root

    run_id, out_dir = run_id or cfg.name, out_dir or cfg.out_dir
    root = run_root(str(Path(out_dir) / "checkpoints"), run_id)
    return root, Path(out_dir) / "optim" / run_id


def _save_state(system: System, round_index: int) -> None:
    from mgrpo.models.checkpoint import prune_versions, save_checkpoint

    ckpt_root, optim_dir = run_dirs(system.cfg)
    optim_dir.mkdir(parents=True, exist_ok=True)
    for lm in system.models.values():
        if lm.optimizer is None:
            continue
        save_checkpoint(lm.model, ckpt_root, lm.name, round_index + 1, tokenizer=lm.tokenizer,
                        extra={"round": round_index, "run_id": system.cfg.name})
        # Versioned like the weights: the state file may still name the previous round.
        optim = optim_dir / f"{lm.name}-v{round_index + 1}.pt"
        torch.save(lm.optimizer.state_dict(), optim.with_suffix(".tmp"))
        os.replace(optim.with_suffix(".tmp"), optim)
        lm.version = round_index + 1
        lm.engine.version = lm.version
    _write_json_atomic(out_path(system.cfg, STATE_FILE),
                       {"completed_rounds": round_index + 1, "run_id": system.cfg.name})
    for lm in system.models.values():  # only the state file's version is needed now
        (optim_dir / f"{lm.name}-v{round_index}.pt").unlink(missing_ok=True)
        if lm.optimizer is not None:
            prune_versions(ckpt_root, lm.name, keep=system.cfg.keep_checkpoints)


def _committed_rounds(cfg: RunConfig) -> int | None:
    """Rounds the state file commits for THIS run: 0 without a state file, None when it is
    another run's (the out_dir's last run; this run's commit point is then unknown)."""
    state_path = Path(cfg.out_dir) / STATE_FILE
    if not state_path.exists():
        return 0
    state = json.loads(state_path.read_text())
    return state["completed_rounds"] if state.get("run_id", cfg.name) == cfg.name else None


def clean_uncommitted(cfg: RunConfig, models: list[str]) -> list[str]:
    """Remove what a killed run left behind: temp folders and files, and (when the state
    file is this run's) versions and optimizer files after the state file's. Returns what
    was removed."""
    from mgrpo.models.checkpoint import clean_leftovers, discard_version, list_versions

    done = _committed_rounds(cfg)
    ckpt_root, optim_dir = run_dirs(cfg)
    removed = []
    for name in models:
        removed += [f"{name}/{leaf}" for leaf in clean_leftovers(ckpt_root, name)]
        for version in list_versions(ckpt_root, name):
            if done is not None and version > done \
                    and discard_version(ckpt_root, name, version):
                removed.append(f"{name}/v{version:06d}")
    if optim_dir.exists():
        for path in optim_dir.iterdir():
            stem = path.name.removesuffix(".pt").removesuffix(".tmp")
            version = stem.rsplit("-v", 1)[-1]
            if path.suffix == ".tmp" or (done is not None and version.isdigit()
                                         and int(version) > done):
                path.unlink()
                removed.append(f"optim/{path.name}")
    return removed


def _start_weights(system: System, resume: bool) -> int:
    """Clean leftovers; then resume (``resume``), or start fresh (from ``init_from`` if the
    config names a run). Returns the rounds already done."""
    from mgrpo.models.checkpoint import latest_version, list_versions, load_checkpoint

    cfg = system.cfg
    trained = [lm.name for lm in system.models.values() if lm.optimizer is not None]
    clean_uncommitted(cfg, trained)
    if resume:
        return _restore_state(system)
    ckpt_root, _ = run_dirs(cfg)
    taken = [name for name in trained if list_versions(ckpt_root, name)]
    if taken:
        raise FileExistsError(
            f"run {cfg.name!r} already has checkpoints of {taken} in {cfg.out_dir}; versions "
            "are written once: resume it (--resume), or pick another name or out_dir")
    if cfg.init_from is not None:
        source_root, _ = run_dirs(cfg, cfg.init_from.run_id, cfg.init_from.out_dir)
        for lm in system.models.values():
            version = cfg.init_from.version or latest_version(source_root, lm.name)
            if version is None:
                if lm.optimizer is not None:
                    raise FileNotFoundError(
                        f"init_from: run {cfg.init_from.run_id!r} has no checkpoint of "
                        f"{lm.name} under {source_root}")
                continue
            load_checkpoint(source_root, lm.name, version=version, model=lm.model)
    return 0


def _restore_state(system: System) -> int:
    """Load the last complete round's weights and optimizer state; returns rounds done."""
    from mgrpo.models.checkpoint import load_checkpoint

    done = _committed_rounds(system.cfg)
    if done is None:
        raise FileExistsError(
            f"{system.cfg.out_dir}/{STATE_FILE} belongs to another run; run "
            f"{system.cfg.name!r} can be resumed only while it is the out_dir's last run")
    if done == 0:
        return 0
    ckpt_root, optim_dir = run_dirs(system.cfg)
    for lm in system.models.values():
        if lm.optimizer is None:
            continue
        load_checkpoint(ckpt_root, lm.name, version=done, model=lm.model)
        lm.optimizer.load_state_dict(torch.load(optim_dir / f"{lm.name}-v{done}.pt"))
        lm.version = lm.engine.version = done
    return done


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
    """SPEC 1.6's filter: the questions of ``pool`` whose success rate over their filter
    rollouts (``correct``: (query id, 0/1) per rollout) is below ``max_success``; the whole
    pool if none is (a stage never runs out of questions)."""
    success: dict[str, list[float]] = {}
    for query_id, value in correct:
        success.setdefault(query_id, []).append(float(value))
    kept = [q for q in pool
            if q.id in success and sum(success[q.id]) / len(success[q.id]) < max_success]
    return kept or pool


def stage_pool(system: System, stage_index: int, run_id: str | None = None) -> list:
    """Training questions of a stage, difficulty-filtered when ``max_success`` < 1 (SPEC
    1.6): keep queries the current system solves less often than the threshold. The
    distributed path (``mgrpo.services.rounds``) plays the same episodes as a filter round."""
    stage = system.cfg.stages[stage_index]
    pool = system.bench.questions("train", stage=stage.stage)
    if stage.max_success >= 1.0:
        return pool
    episodes = collect(system, filter_round_id(run_id or system.cfg.name, stage_index), pool,
                       k=stage.filter_samples, seed=system.cfg.seed)
    outcomes = score(system, episodes)
    return hard_questions(pool, [(o.query_id, o.correct) for o in outcomes], stage.max_success)


def run_round(system: System, store, run_id: str, round_index: int, pool: list) -> dict:
    cfg = system.cfg
    round_id = f"{run_id}-r{round_index:04d}"
    questions = sample_questions(pool, cfg.queries_per_round, cfg.seed, round_index)
    store.create_round(run_id, round_id, round_index, [q.id for q in questions], cfg.k,
                       cfg.model_dump(mode="json"))
    t0 = time.perf_counter()
    episodes = collect(system, round_id, questions, cfg.k, cfg.seed)
    t1 = time.perf_counter()
    outcomes = score(system, episodes)
    ingest_episodes(store, round_id, episodes, outcomes)
    t2 = time.perf_counter()
    metrics: dict[str, float] = {}
    outcome_map = {(o.query_id, o.rollout): o for o in store.read_planner_outcomes(round_id)}
    keys = [(q.id, r) for q in questions for r in range(cfg.k)]
    for lm in system.models.values():
        roles = [r for r, m in cfg.agents.items() if m == lm.name]
        trajs = store.round_trajectories(round_id, lm.name)
        for role in roles:
            if role != "planner":
                store.record_d_counts(role, round_id,
                                      d_counts([t for t in trajs if t.agent == role], keys))
        d_seen = observed_d(store, run_id, roles)
        model_metrics, stats = train_model(lm, roles, trajs, outcome_map, cfg, system.judge,
                                           d_seen, round_index)
        publish_stats(store, round_id, lm.name, stats)
        metrics.update(model_metrics)
    t3 = time.perf_counter()
    _save_state(system, round_index)
    t4 = time.perf_counter()
    n = max(len(outcomes), 1)
    metrics.update({
        "planner/accuracy": sum(o.correct for o in outcomes) / n,
        "planner/format_valid": sum(o.format_ok for o in outcomes) / n,
        "time/rollout_s": t1 - t0, "time/ingest_s": t2 - t1, "time/update_s": t3 - t2,
        "time/weight_sync_s": t4 - t3,
        "throughput/tokens_per_s": sum(sum(t.response_mask) for ep in episodes
                                       for t in [ep.planner, *ep.subagents]) / max(t1 - t0, 1e-9),
    })
    for role, calls in _calls(episodes).items():
        metrics[f"{role}/calls_per_episode"] = calls / n
    store.record_metrics(run_id, round_id, metrics)
    store.set_round_status(round_id, "done")
    return metrics


def ingest_episodes(store, round_id: str, episodes, outcomes) -> None:
    """The planner side's hand-off: outcomes and trajectories into the store, then each
    rollout marked complete with the attempt that produced them (SPEC 2.2 step 3)."""
    for ep, outcome in zip(episodes, outcomes, strict=True):
        attempt = store.begin_attempt(round_id, ep.job.question.id, ep.job.rollout)
        if attempt is None:  # completed before a crash: its stored attempt stays the one
            continue
        ep_trajs = [ep.planner, *ep.subagents]
        for traj in ep_trajs:
            traj.attempt = attempt
        store.write_planner_outcomes(round_id, [outcome.model_copy(update={"attempt": attempt})])
        store.ingest_trajectories(ep_trajs)
        store.complete_rollout(round_id, ep.job.question.id, ep.job.rollout, attempt)


def publish_stats(store, round_id: str, model: str, stats) -> None:
    from mgrpo.store import GroupStatIn

    for agent in sorted({s.agent for s in stats}):
        rows = [GroupStatIn(group_key=s.group_key, n=s.n, mean=s.mean, std=s.std)
                for s in stats if s.agent == agent]
        store.publish_group_stats(round_id, model, agent, rows, published_by=f"trainer-{model}")


def _calls(episodes) -> dict[str, float]:
    out: dict[str, float] = {}
    for ep in episodes:
        for role, n in ep.calls_per_role.items():
            out[role] = out.get(role, 0) + n
    return out


def run_training(cfg: RunConfig, resume: bool = False, progress: bool = True,
                 stop_after: int | None = None) -> RunResult:
    """Train per ``cfg`` in this process. ``stop_after`` ends early (tests of resume)."""
    from mgrpo.store import Store

    started = time.perf_counter()
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    system = build_system(cfg)
    store = Store(f"sqlite:///{Path(cfg.out_dir).resolve() / 'store.db'}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    done = _start_weights(system, resume)
    logger = MetricsLogger(Path(cfg.out_dir), enabled=progress)
    result = RunResult(out_dir=Path(cfg.out_dir))
    test = system.bench.questions("test", stage=cfg.eval_stage)[: cfg.eval_questions]
    if done == 0:
        result.before = _eval_both(system, test, logger, "before", step=0)
    schedule = stage_schedule(cfg)
    pools: dict[int, list] = {}
    for stage_index, round_index in logger.progress(schedule[done:], desc="rounds"):
        if stop_after is not None and round_index >= stop_after:
            break
        if stage_index not in pools:
            pools[stage_index] = stage_pool(system, stage_index, cfg.name)
        if cfg.algorithm == "at_grpo":  # tree sampling, groups (query, agent, turn)
            from mgrpo.training.tree import run_at_grpo_round as round_fn
        else:
            round_fn = run_round
        metrics = round_fn(system, store, cfg.name, round_index, pools[stage_index])
        logger.log(round_index, metrics)
        if cfg.eval_every and (round_index + 1) % cfg.eval_every == 0:
            logger.log(round_index + 1, evaluate(system, test, greedy=True))
        result.rounds = round_index + 1
    else:
        result.after = _eval_both(system, test, logger, "after", step=len(schedule))
    result.wall_s = time.perf_counter() - started
    logger.close()
    return result


def _eval_both(system: System, test: list, logger: MetricsLogger, tag: str,
               step: int) -> dict:
    """Sampled and greedy held-out accuracy; logged at ``step`` = rounds of updates so far
    (round metrics at step r describe round r's rollouts, made before its update)."""
    from mgrpo.progress import progress_bar

    out = {}
    with progress_bar(desc=f"eval {tag}", total=2 * len(test), enabled=logger.enabled) as bar:
        for greedy in (False, True):
            out.update(evaluate(system, test, greedy=greedy, progress=bar.update))
    _write_json_atomic(out_path(system.cfg, f"eval_{tag}.json"), out)
    logger.note(tag, out)
    logger.log(step, out)
    return out
