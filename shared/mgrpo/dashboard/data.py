"""What the dashboard shows, assembled from the stats store (and an embedded run's CSV).

The page (``/ui``) polls small JSON documents built here; the API routes only call these
functions, so the same data serves the planner service (PostgreSQL) and ``mgrpo ui RUN_DIR``
(the run's SQLite store). A run's stored config is parsed once (:func:`stored_run_config`)
and read as a :class:`~mgrpo.training.config.RunConfig`. Curves are grouped server side by
metric suffix (:data:`CHARTS`, keys from docs/metrics.md), one line per agent or model.

What this module does NOT do: decode trajectories into text (``mgrpo.dashboard.trace``) or
write anything.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from mgrpo.models.checkpoint import MANIFEST, list_versions, version_uri
from mgrpo.store.records import TERMINAL_ROUND_STATUSES
from mgrpo.training.config import RunConfig
from mgrpo.training.round_spec import run_config_of
from mgrpo.training.round_store import round_id_of
from mgrpo.training.run_lock import live_owner
from mgrpo.training.watch import RunWatch

# (chart title, metric-key suffixes, exact keys or prefixes ending in "*"): every key of a
# run whose name ends with "/<suffix>" (or equals an exact key, or starts with a prefix)
# becomes one line of the chart.
CHARTS: list[tuple[str, list[str]]] = [
    ("reward", ["reward_mean"]),
    ("groups with zero reward variance", ["frac_reward_zero_std"]),
    ("accuracy", ["planner/accuracy", "eval/greedy/accuracy", "eval/sampled/accuracy"]),
    ("format rate", ["planner/format_valid", "eval/greedy/format_valid",
                     "eval/sampled/format_valid"]),
    ("calls per episode", ["calls_per_episode", "eval/greedy/calls_*", "eval/sampled/calls_*"]),
    ("clip fraction", ["clipfrac"]),
    ("KL", ["kl", "approx_kl"]),
    ("train/inference logprob mismatch", ["rollout_logp_diff_mean", "rollout_kl"]),
    ("round time (s)", ["time/rollout_s", "time/update_s"]),
]


def _chart_of(key: str) -> str | None:
    for title, patterns in CHARTS:
        for pattern in patterns:
            if pattern.endswith("*") and key.startswith(pattern[:-1]):
                return title
            if "/" in pattern and key == pattern:
                return title
            if "/" not in pattern and not key.startswith(("eval/", "time/")) \
                    and key.rsplit("/", 1)[-1] == pattern:
                return title
    return None


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def stored_run_config(run) -> RunConfig | None:
    """The run config a stored run (a ``RunRecord``) was created with; None for no run, a
    run stored without one, or one this library cannot read (the page shows the run without
    it rather than failing)."""
    try:
        return run_config_of(run)
    except ValidationError:
        return None


def list_runs(store, run_dir: Path | None = None) -> list[dict]:
    """Runs with their round counts, rounds done of those their stages plan, the newest
    round's status and the run's status (:func:`run_status`). ``run_dir``: the embedded run
    folder ``mgrpo ui`` reads (its lock file says whether the run still trains)."""
    rounds = store.list_rounds()
    out = []
    for run in store.list_runs():
        mine = [r for r in rounds if r.run_id == run.run_id]
        done = sum(r.status == "done" for r in mine)
        planned = planned_rounds(stored_run_config(run))
        out.append({"run_id": run.run_id, "status": run_status(mine, planned, run_dir),
                    "created_at": _iso(run.created_at), "rounds": len(mine),
                    "rounds_done": done, "rounds_planned": planned,
                    "last_round_status": mine[-1].status if mine else None})
    return out


def run_summary(store, run_id: str, run_dir: Path | None = None) -> dict:
    """What a run is, for the page's header: algorithm, K, B, agents and models (paths),
    rounds done of planned, status, and an embedded run's held-out accuracy before the first
    round and after the last (its ``eval_before.json``/``eval_after.json``)."""
    cfg = stored_run_config(store.get_run(run_id))
    rounds = store.list_rounds(run_id)
    planned = planned_rounds(cfg)
    evaluation = {}
    for tag in ("before", "after"):
        path = run_dir / f"eval_{tag}.json" if run_dir is not None else None
        try:
            values = json.loads(path.read_text()) if path is not None else None
        except (OSError, ValueError):
            values = None
        if isinstance(values, dict):
            evaluation[tag] = {k: v for k, v in values.items()
                               if k in ("eval/greedy/accuracy", "eval/sampled/accuracy")}
    return {"run_id": run_id, "status": run_status(rounds, planned, run_dir),
            "algorithm": cfg.algorithm if cfg else None, "k": cfg.k if cfg else None,
            "queries_per_round": cfg.queries_per_round if cfg else None,
            "agents": dict(cfg.agents) if cfg else {},
            "models": {name: m.path for name, m in cfg.models.items()} if cfg else {},
            "rounds_done": sum(r.status == "done" for r in rounds),
            "rounds_planned": planned, "eval": evaluation}


def planned_rounds(cfg: RunConfig | None) -> int | None:
    """The rounds a run config's stages plan (None: no run config recorded)."""
    return sum(stage.rounds for stage in cfg.stages) if cfg is not None else None


def run_status(rounds: list, planned: int | None, run_dir: Path | None = None) -> str:
    """``running``: a round in progress, or an embedded run's folder held by a live process
    (between rounds, evaluating); ``done``: every planned round done; else ``idle`` (a
    distributed run waits for its next POST /v1/rounds; an embedded one was stopped)."""
    if any(r.status not in TERMINAL_ROUND_STATUSES for r in rounds):
        return "running"
    if run_dir is not None and live_owner(Path(run_dir)) is not None:
        return "running"
    if planned is not None and sum(r.status == "done" for r in rounds) >= planned > 0:
        return "done"
    return "idle"


def run_rounds(store, run_id: str) -> list[dict]:
    """A run's rounds: status, timings (seconds from created to started to finished) and
    rollouts completed."""
    rounds = store.list_rounds(run_id)
    published = store.published_models_by_round([r.round_id for r in rounds])
    out = []
    for r in rounds:
        progress = store.round_progress(r.round_id)
        waited = (r.started_at - r.created_at).total_seconds() if r.started_at else None
        took = ((r.finished_at - (r.started_at or r.created_at)).total_seconds()
                if r.finished_at else None)
        out.append({"round_id": r.round_id, "index": r.index, "k": r.k, "status": r.status,
                    "error": r.error, "created_at": _iso(r.created_at),
                    "started_at": _iso(r.started_at), "finished_at": _iso(r.finished_at),
                    "queued_s": waited, "duration_s": took,
                    "rollouts_completed": progress.completed, "rollouts_total": progress.total,
                    "published_models": sorted(published.get(r.round_id, ())),
                    "live": None if r.status in TERMINAL_ROUND_STATUSES
                    else live_outcomes(store, r.round_id)})
    return out


def live_outcomes(store, round_id: str) -> dict | None:
    """A round still running: mean R_M, accuracy and format rate of the rollouts completed
    so far (the round's metrics are recorded only when it is trained)."""
    outcomes = store.read_planner_outcomes(round_id)
    if not outcomes:
        return None
    n = len(outcomes)
    return {"n": n, "reward_mean": sum(o.reward for o in outcomes) / n,
            "accuracy": sum(o.correct for o in outcomes) / n,
            "format_valid": sum(1 for o in outcomes if o.format_ok) / n}


def read_metrics_csv(path: Path) -> dict[int, dict[str, float]]:
    """``{round: {key: value}}`` from an embedded run's long-format ``metrics.csv`` (eval
    keys are logged at step 0 before training and at step r+1 after round r)."""
    out: dict[int, dict[str, float]] = {}
    if not path.exists():
        return out
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            try:
                out.setdefault(int(row["round"]), {})[row["key"]] = float(row["value"])
            except (KeyError, TypeError, ValueError):
                continue  # a torn last line while the run writes it
    return out


STALLED_AFTER_S = 300.0  # an unfinished round without progress this long is warned about


def run_warnings(store, run_id: str, stalled_after_s: float = STALLED_AFTER_S) -> list[dict]:
    """The warnings of a run that learns nothing (:class:`mgrpo.training.watch.RunWatch`:
    zero reward variance, grad_norm 0, format collapse, a sub-agent never called), replayed
    over its stored round metrics in round order: ``[{"round": index, "text": ...}]``, the
    lines ``mgrpo train`` printed (the dashboard's banner); then one per unfinished round
    that has made no progress for ``stalled_after_s`` (``store.stalled_seconds``)."""
    cfg = stored_run_config(store.get_run(run_id))
    agents = dict(cfg.agents) if cfg else {"planner": "planner", "searcher": "searcher",
                                           "coder": "coder"}
    trained = [m for m in dict.fromkeys(agents.values())
               if cfg is None or m not in cfg.models or cfg.models[m].trainable]
    watch = RunWatch(dict(agents), trained)
    index = {r.round_id: r.index for r in store.list_rounds(run_id)}
    by_round: dict[int, dict[str, float]] = {}
    for round_id, values in store.metrics(run_id).items():
        if round_id in index:
            by_round.setdefault(index[round_id], {}).update(values)
    warnings = [{"round": step, "text": text} for step in sorted(by_round)
                for text in watch.check(step, by_round[step])]
    stalled = store.stalled_seconds()
    for round_id, step in index.items():
        if stalled.get(round_id, -1.0) >= stalled_after_s:
            warnings.append({"round": step, "text": (
                f"warning: round {round_id} has made no progress for {stalled[round_id]:.0f} s "
                "(no rollout completed, no model published): check the workers' and trainers' "
                "/readyz and `mgrpo dlq list`")})
    return warnings


def run_metrics(store, run_id: str, csv_path: Path | None = None) -> dict:
    """Curves of a run: ``{"charts": {title: {key: [[round, value], ...]}}, "keys": [...]}``.

    x is the round index. The store holds every round's metrics (both modes); an embedded
    run's CSV adds the eval keys the store does not hold. Non-finite values are dropped (JSON
    has no NaN)."""
    index = {r.round_id: r.index for r in store.list_rounds(run_id)}
    by_round: dict[int, dict[str, float]] = {}
    for round_id, values in store.metrics(run_id).items():
        if round_id in index:
            by_round.setdefault(index[round_id], {}).update(values)
    if csv_path is not None:
        for step, values in read_metrics_csv(csv_path).items():
            row = by_round.setdefault(step, {})
            for key, value in values.items():
                row.setdefault(key, value)
    charts: dict[str, dict[str, list[list[float]]]] = {title: {} for title, _ in CHARTS}
    keys: set[str] = set()
    for step in sorted(by_round):
        for key, value in by_round[step].items():
            keys.add(key)
            title = _chart_of(key)
            if title is None or not math.isfinite(value):
                continue
            charts[title].setdefault(key, []).append([step, value])
    # Every agent of the run in the reward chart: one that never had a sample (a sub-agent
    # the planner never calls) is a line of no points, marked, not a silent absence.
    cfg = stored_run_config(store.get_run(run_id))
    for role in cfg.agents if cfg else {}:
        if f"{role}/reward_mean" not in charts["reward"]:
            charts["reward"][f"{role}/reward_mean (no samples)"] = []
    return {"run_id": run_id, "rounds": sorted(by_round), "charts": charts,
            "keys": sorted(keys)}


def group_stats(store, round_id: str) -> list[dict]:
    """Per (model, agent) of a round: groups, samples, mean of group means, mean group std
    and the share of groups with zero std (no advantage signal)."""
    by_pair: dict[tuple[str, str], list] = {}
    for stat in store.read_group_stats(round_id):
        by_pair.setdefault((stat.model, stat.agent), []).append(stat)
    out = []
    for (model, agent), stats in sorted(by_pair.items()):
        out.append({"model": model, "agent": agent, "groups": len(stats),
                    "samples": sum(s.n for s in stats),
                    "mean": sum(s.mean for s in stats) / len(stats),
                    "std_mean": sum(s.std for s in stats) / len(stats),
                    "zero_std_share": sum(1 for s in stats if s.std == 0) / len(stats),
                    "published_by": stats[0].published_by})
    return out


def checkpoints(store, run_id: str, run_dir: Path | None = None) -> list[dict]:
    """Checkpoints the store records (distributed trainers) and, for an embedded run, the
    versions under ``run_dir/checkpoints/<run_id>/<model>/`` (the embedded loop writes files
    only; their ``manifest.json`` gives the sha256 and time)."""
    out = [{"model": c.model, "version": c.version, "round_id": c.round_id, "uri": c.uri,
            "sha256": c.sha256[:12], "created_at": _iso(c.created_at)}
           for c in store.list_checkpoints(run_id=run_id)]
    seen = {(c["model"], c["version"]) for c in out}
    root = run_dir / "checkpoints" / run_id if run_dir is not None else None
    if root is not None and root.is_dir():
        for model in sorted(p.name for p in root.iterdir() if p.is_dir()):
            for version in list_versions(str(root), model):
                if (model, version) in seen:
                    continue
                folder = Path(version_uri(str(root), model, version))
                manifest = folder / MANIFEST
                created = datetime.fromtimestamp(manifest.stat().st_mtime, tz=UTC)
                out.append({"model": model, "version": version,
                            "round_id": _embedded_round_id(run_id, manifest),
                            "uri": str(folder),
                            "sha256": hashlib.sha256(manifest.read_bytes()).hexdigest()[:12],
                            "created_at": created.isoformat()})
    return sorted(out, key=lambda c: (c["model"], c["version"]))


def _embedded_round_id(run_id: str, manifest: Path) -> str | None:
    """The round an embedded checkpoint was written after: its manifest's ``extra.round``
    (``mgrpo.training.run_state.save_state``), as the embedded loop names rounds."""
    try:
        index = json.loads(manifest.read_text())["extra"]["round"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return round_id_of(run_id, int(index)) if isinstance(index, int) else None


def question_lookup(store, bench=None) -> Callable[[str], tuple[str | None, str | None]]:
    """``query_id -> (question, gold answer)``: the store's ``queries`` table (distributed
    rounds write it), else the run's benchmark (the embedded loop keeps questions there
    only). ``bench`` may be a zero-argument callable (loaded only when needed)."""
    by_id: dict[str, tuple[str | None, str | None]] | None = None
    seen: dict[str, tuple[str | None, str | None]] = {}  # K rollouts share a query

    def lookup(query_id: str) -> tuple[str | None, str | None]:
        nonlocal by_id
        if query_id in seen:
            return seen[query_id]
        query = store.get_query(query_id)
        if query is not None and query.question:
            seen[query_id] = (query.question, query.answer)
            return seen[query_id]
        if by_id is None:
            try:
                loaded = bench() if callable(bench) else bench
                by_id = {q.id: (q.question, q.answer) for q in loaded.all_questions}
            except Exception:  # no benchmark here (a bare store): the ids still show
                by_id = {}
        return by_id.get(query_id, (None, None))
    return lookup


def episodes(store, round_id: str, lookup: Callable | None = None) -> list[dict]:
    """The round's completed episodes (planner outcomes of completing attempts) with their
    question and gold answer, for picking one to trace."""
    lookup = lookup or question_lookup(store)
    out = []
    for o in sorted(store.read_planner_outcomes(round_id), key=lambda o: (o.query_id, o.rollout)):
        question, gold = lookup(o.query_id)
        out.append({"query_id": o.query_id, "rollout": o.rollout, "attempt": o.attempt,
                    "format_ok": o.format_ok, "correct": o.correct, "reward": o.reward,
                    "question": question, "gold": gold})
    return out


COMPLETIONS_SHOWN = 20


def completions(run_dir: Path | None, limit: int = COMPLETIONS_SHOWN) -> list[dict]:
    """The last ``limit`` episodes an embedded run wrote as people read them
    (``completions.jsonl``, ``MetricsLogger.log_completions``), newest last: round, query,
    rollout, reward, correct, format and the text. None in a run without the file (a
    distributed run's trainers write none)."""
    path = run_dir / "completions.jsonl" if run_dir is not None else None
    if path is None or not path.is_file():
        return []
    keep = ("round", "query_id", "rollout", "reward", "correct", "format_ok", "text")
    rows = []
    with path.open() as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line being written as we read
                continue
            rows.append({k: row.get(k) for k in keep})
    return rows[-limit:]
