"""What trainers exchange (docs/store.md, 'Tables'): trajectories, planner outcomes, group
statistics; the observed d_k are read in ``mgrpo.store.call_counts``.

Trajectories are keyed by (traj_id, attempt): ingestion is ``INSERT ... ON CONFLICT DO
NOTHING``, so a redelivered message or a second ingesting thread never adds a row; a
DIFFERENT trajectory under a stored (traj_id, attempt) is told apart from such a redelivery
(:meth:`TrainingMixin.ingest_trajectories_checked`), so the caller can refuse it loudly. The token
arrays (``input_ids``, ``response_mask``, ``old_logprobs``) and the free-text fields are kept
inline as JSON in ``trajectories.payload``: tiny to moderate sequences fit comfortably and a
trainer needs one query, not a blob store. ``payload_uri`` is reserved for a later
out-of-database payload store and is not read yet.

Readers see only what counts: :meth:`TrainingMixin.round_trajectories` and
:meth:`TrainingMixin.read_planner_outcomes` join on ``rollouts.completed_attempt``, so a
trajectory of an abandoned attempt is never paired with one of the completing attempt.

What this module does NOT do: compute rewards, statistics or advantages (``mgrpo.algo``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from pydantic_core import to_json
from sqlalchemy import (
    Integer,
    String,
    and_,
    column,
    func,
    literal_column,
    select,
    text,
    tuple_,
    update,
    values,
)

from mgrpo.store.base import StoreBase
from mgrpo.store.models import GroupStat, ObservedD, PlannerOutcome, Rollout, TrajectoryRow, utcnow
from mgrpo.store.records import (
    DCount,
    GroupStatIn,
    GroupStatRecord,
    PlannerOutcomeIn,
    PlannerOutcomeRecord,
)
from mgrpo.types import Trajectory

PAYLOAD_FIELDS = ("input_ids", "response_mask", "old_logprobs", "subtask", "result", "reward",
                  "extra")
_COLUMN_FIELDS = ("traj_id", "attempt", "round_id", "query_id", "rollout", "agent", "model",
                  "invocation", "turn", "weights_version", "format_ok")


_ROW_TYPES = {"traj_id": "text", "attempt": "integer", "round_id": "text", "query_id": "text",
              "rollout": "integer", "agent": "text", "model": "text", "invocation": "integer",
              "turn": "integer", "weights_version": "integer", "format_ok": "boolean",
              "payload": "json", "n_tokens": "integer", "n_response_tokens": "integer"}
_PG_INGEST = text(
    f"INSERT INTO trajectories ({', '.join(_ROW_TYPES)}, created_at) "
    f"SELECT {', '.join(_ROW_TYPES)}, :created_at "
    f"FROM json_to_recordset(CAST(:rows AS json)) AS r("
    f"{', '.join(f'{name} {kind}' for name, kind in _ROW_TYPES.items())}) "
    "ON CONFLICT (traj_id, attempt) DO NOTHING RETURNING traj_id, attempt")


def check_trajectory(traj: Trajectory) -> None:
    """``ValueError`` (with the fix) for a trajectory the store cannot keep."""
    if not len(traj.input_ids) == len(traj.response_mask) == len(traj.old_logprobs):
        raise ValueError(
            f"trajectory {traj.traj_id!r}: input_ids ({len(traj.input_ids)}), response_mask "
            f"({len(traj.response_mask)}) and old_logprobs ({len(traj.old_logprobs)}) must have "
            "one entry per token; fix the episode runner that built it")


def _without_nul(value):
    """``value`` with every NUL character of its strings replaced by U+FFFD: PostgreSQL
    text (and ``json_to_recordset``) refuses NUL, and a tiny model may generate one."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {k: _without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    return value


def trajectory_row(traj: Trajectory) -> dict:
    """Column values of a trajectory (token counts derived, arrays into ``payload``; a NUL
    in its text fields is stored as U+FFFD, the token ids are kept as they are)."""
    check_trajectory(traj)
    data = traj.model_dump()
    row = {name: data[name] for name in _COLUMN_FIELDS}
    row["payload"] = {name: data[name] if name in ("input_ids", "response_mask",
                                                   "old_logprobs") else _without_nul(data[name])
                      for name in PAYLOAD_FIELDS}
    row["n_tokens"] = len(traj.input_ids)
    row["n_response_tokens"] = int(sum(traj.response_mask))
    return row


def _content(row: dict) -> dict:
    """What makes two rows the same trajectory: its columns and payload (JSON-normalised)."""
    if not row:
        return ""
    return json.dumps({name: row.get(name) for name in (*_COLUMN_FIELDS, "payload")},
                      sort_keys=True, default=str)


def completing(model, *extra):
    """Join condition: ``model``'s row belongs to the attempt that completed its rollout."""
    return and_(Rollout.round_id == model.round_id, Rollout.query_id == model.query_id,
                Rollout.rollout == model.rollout, Rollout.completed_attempt == model.attempt,
                *extra)


class TrainingMixin(StoreBase):
    def ingest_trajectory(self, traj: Trajectory) -> bool:
        """Store one trajectory; True if new, False if (traj_id, attempt) was already stored."""
        return self.ingest_trajectories([traj]) == 1

    def ingest_trajectories(self, trajs: Iterable[Trajectory]) -> int:
        """Store several trajectories in ONE transaction and one multi-row ``INSERT ... ON
        CONFLICT DO NOTHING``; returns how many were new (a (traj_id, attempt) already
        stored, or twice in ``trajs``, adds nothing). On PostgreSQL the rows travel as ONE
        JSON parameter (``json_to_recordset``): the statement text is constant, so neither
        SQLAlchemy nor psycopg re-parses a statement of thousands of placeholders."""
        now = utcnow()
        rows = [trajectory_row(traj) for traj in trajs]
        if not rows:
            return 0
        with self._tx() as session:
            if self.dialect == "postgresql":
                return len(session.execute(_PG_INGEST, {"rows": to_json(rows).decode(),
                                                        "created_at": now}).all())
            stmt = self._insert(TrajectoryRow).on_conflict_do_nothing(
                index_elements=["traj_id", "attempt"]).returning(literal_column("1"))
            return len(session.execute(stmt, [{**row, "created_at": now}
                                              for row in rows]).all())

    def ingest_trajectories_checked(self, trajs: Sequence[Trajectory]) -> list[int]:
        """:meth:`ingest_trajectories`, then the positions in ``trajs`` whose (traj_id,
        attempt) was stored already with OTHER content (a redelivery of the same trajectory
        is not among them). Only the rows not inserted are read back."""
        rows = [trajectory_row(traj) for traj in trajs]
        if not rows:
            return []
        now = utcnow()
        with self._tx() as session:
            if self.dialect == "postgresql":
                result = session.execute(_PG_INGEST, {"rows": to_json(rows).decode(),
                                                      "created_at": now})
            else:
                result = session.execute(
                    self._insert(TrajectoryRow).on_conflict_do_nothing(
                        index_elements=["traj_id", "attempt"]).returning(
                        TrajectoryRow.traj_id, TrajectoryRow.attempt),
                    [{**row, "created_at": now} for row in rows])
            inserted = {(traj_id, attempt) for traj_id, attempt in result.all()}
        first: dict[tuple, int] = {}  # the first of a key in this batch is the one inserted
        clashes = []
        for i, row in enumerate(rows):
            key = (row["traj_id"], row["attempt"])
            if key in inserted and key not in first:
                first[key] = i
            elif key in first:
                if _content(rows[first[key]]) != _content(row):
                    clashes.append(i)
            else:
                clashes.append(i)  # stored before: compared below
        stored = self._stored_rows({(rows[i]["traj_id"], rows[i]["attempt"]) for i in clashes
                                    if (rows[i]["traj_id"], rows[i]["attempt"]) not in first})
        return [i for i in clashes
                if (key := (rows[i]["traj_id"], rows[i]["attempt"])) in first
                or _content(stored.get(key, {})) != _content(rows[i])]

    def _stored_rows(self, keys: set[tuple]) -> dict[tuple, dict]:
        if not keys:
            return {}
        stmt = select(TrajectoryRow).where(
            tuple_(TrajectoryRow.traj_id, TrajectoryRow.attempt).in_(sorted(keys)))
        with self._tx() as session:
            return {(row.traj_id, row.attempt): {
                **{name: getattr(row, name) for name in _COLUMN_FIELDS},
                "payload": row.payload} for row in session.scalars(stmt)}

    def round_trajectories(self, round_id: str, model: str,
                           agent: str | None = None) -> list[Trajectory]:
        """``model``'s trajectories of a round, ONLY those of each rollout's completing attempt.

        Ordered by (query_id, rollout, agent, invocation, turn) so groups come out together.
        """
        stmt = (select(TrajectoryRow).join(Rollout, completing(TrajectoryRow))
                .where(TrajectoryRow.round_id == round_id, TrajectoryRow.model == model)
                .order_by(TrajectoryRow.query_id, TrajectoryRow.rollout, TrajectoryRow.agent,
                          TrajectoryRow.invocation, TrajectoryRow.turn))
        if agent is not None:
            stmt = stmt.where(TrajectoryRow.agent == agent)
        with self._tx() as session:
            rows = list(session.scalars(stmt))
        return [Trajectory(**{name: getattr(row, name) for name in _COLUMN_FIELDS},
                           **(row.payload or {})) for row in rows]

    def episode_trajectories(self, round_id: str, query_id: str,
                             rollout: int) -> list[Trajectory]:
        """Every model's trajectories of ONE rollout (its completing attempt): the planner's
        and each sub-agent call's, ordered by (agent, invocation, turn). The dashboard's trace
        viewer reads this; trainers never do."""
        stmt = (select(TrajectoryRow).join(Rollout, completing(TrajectoryRow))
                .where(TrajectoryRow.round_id == round_id, TrajectoryRow.query_id == query_id,
                       TrajectoryRow.rollout == rollout)
                .order_by(TrajectoryRow.agent, TrajectoryRow.invocation, TrajectoryRow.turn))
        with self._tx() as session:
            rows = list(session.scalars(stmt))
        return [Trajectory(**{name: getattr(row, name) for name in _COLUMN_FIELDS},
                           **(row.payload or {})) for row in rows]

    def count_round_trajectories(self, round_id: str, model: str,
                                 agent: str | None = None) -> int:
        """How many :meth:`round_trajectories` would return, without loading the payloads
        (trainers poll this while they wait for their part of a round)."""
        stmt = (select(func.count()).select_from(TrajectoryRow)
                .join(Rollout, completing(TrajectoryRow))
                .where(TrajectoryRow.round_id == round_id, TrajectoryRow.model == model))
        if agent is not None:
            stmt = stmt.where(TrajectoryRow.agent == agent)
        with self._tx() as session:
            return session.execute(stmt).scalar_one()

    def round_trajectory_keys(self, round_id: str, model: str,
                              agent: str) -> set[tuple[str, int, int]]:
        """(query_id, rollout, invocation) of ``agent``'s trajectories of the round (those
        :meth:`round_trajectories` returns), without the payloads: which recorded calls a
        trainer has ingested."""
        stmt = (select(TrajectoryRow.query_id, TrajectoryRow.rollout, TrajectoryRow.invocation)
                .join(Rollout, completing(TrajectoryRow))
                .where(TrajectoryRow.round_id == round_id, TrajectoryRow.model == model,
                       TrajectoryRow.agent == agent).distinct())
        with self._tx() as session:
            return {tuple(row) for row in session.execute(stmt)}

    def count_trajectories(self, round_id: str | None = None, model: str | None = None) -> int:
        """Stored rows, every attempt included (operations and tests: 'nothing twice')."""
        stmt = select(func.count()).select_from(TrajectoryRow)
        if round_id is not None:
            stmt = stmt.where(TrajectoryRow.round_id == round_id)
        if model is not None:
            stmt = stmt.where(TrajectoryRow.model == model)
        with self._tx() as session:
            return session.execute(stmt).scalar_one()

    def write_planner_outcomes(self, round_id: str, rows: Sequence[PlannerOutcomeIn]) -> int:
        """Write planner scores (first write of an attempt wins); returns how many were new."""
        inserted = 0
        with self._tx() as session:
            for row in rows:
                stmt = self._insert(PlannerOutcome).values(
                    round_id=round_id, created_at=utcnow(),
                    **PlannerOutcomeIn.model_validate(row).model_dump())
                inserted += self._written(session, stmt.on_conflict_do_nothing(
                    index_elements=["round_id", "query_id", "rollout", "attempt"]))
        return inserted

    def finish_episodes(self, round_id: str, outcomes: Sequence[PlannerOutcomeIn],
                        d_counts: dict[str, Sequence[DCount]]) -> list[bool]:
        """What the planner worker records after playing a batch of a round's episodes, in
        ONE transaction: the planner outcomes, the d_k of each sub-agent type (by role, with
        their attempts), then each outcome's rollout completed by its attempt (compare and
        set, as :meth:`complete_rollout`). Returns, per outcome, whether its attempt won.
        A few statements whatever the batch size (multi-row inserts; on PostgreSQL one
        ``UPDATE ... FROM (VALUES ...)`` completes every rollout)."""
        now = utcnow()
        outcome_rows = [{"round_id": round_id, "created_at": now,
                         **PlannerOutcomeIn.model_validate(row).model_dump()}
                        for row in outcomes]
        d_rows = []
        for agent, counts in d_counts.items():
            for count in counts:
                if count.attempt is None:
                    raise ValueError("finish_episodes takes d_k with their attempt")
                d_rows.append({"agent": agent, "round_id": round_id, "created_at": now,
                               **DCount.model_validate(count).model_dump()})
        keys = [(row.query_id, row.rollout) for row in outcomes]
        with self._tx() as session:
            if outcome_rows:
                session.execute(self._insert(PlannerOutcome).values(outcome_rows)
                                .on_conflict_do_nothing(index_elements=[
                                    "round_id", "query_id", "rollout", "attempt"]))
            if d_rows:
                session.execute(self._insert(ObservedD).values(d_rows).on_conflict_do_nothing(
                    index_elements=["agent", "round_id", "query_id", "rollout", "attempt"]))
            if self.dialect == "postgresql" and len(set(keys)) == len(keys):
                done = values(column("query_id", String), column("rollout", Integer),
                              column("attempt", Integer), name="done").data(
                    [(row.query_id, row.rollout, row.attempt) for row in outcomes])
                won = set(map(tuple, session.execute(update(Rollout).where(
                    Rollout.round_id == round_id, Rollout.query_id == done.c.query_id,
                    Rollout.rollout == done.c.rollout, Rollout.status != "completed").values(
                    status="completed", completed_attempt=done.c.attempt, completed_at=now)
                    .returning(Rollout.query_id, Rollout.rollout)).all()))
                return [key in won for key in keys]
            return [self._written(session, update(Rollout).where(  # one by one, in order
                Rollout.round_id == round_id, Rollout.query_id == row.query_id,
                Rollout.rollout == row.rollout, Rollout.status != "completed").values(
                status="completed", completed_attempt=row.attempt,
                completed_at=now)) == 1 for row in outcomes]

    def read_planner_outcomes(self, round_id: str) -> list[PlannerOutcomeRecord]:
        """Planner outcomes of the completing attempts: what sub-agent trainers use as
        r_correct_main (docs/algorithm.md, '1.2 Rewards'). Ordered by (query_id, rollout)."""
        stmt = (select(PlannerOutcome).join(Rollout, completing(PlannerOutcome))
                .where(PlannerOutcome.round_id == round_id)
                .order_by(PlannerOutcome.query_id, PlannerOutcome.rollout))
        with self._tx() as session:
            return [PlannerOutcomeRecord.model_validate(r) for r in session.scalars(stmt)]

    def publish_group_stats(self, round_id: str, model: str, agent: str,
                            rows: Sequence[GroupStatIn], published_by: str) -> int:
        """Publish a trainer's group statistics of one role (:meth:`publish_model_stats`)."""
        return self.publish_model_stats(round_id, model, {agent: rows}, published_by)

    def publish_model_stats(self, round_id: str, model: str,
                            rows_by_agent: Mapping[str, Sequence[GroupStatIn]],
                            published_by: str) -> int:
        """Publish a model's group statistics of every role it plays, {agent: rows}, in ONE
        multi-row statement: a model is published whole or not at all (a trainer killed
        while publishing leaves none of them). A group key given twice for one agent: the
        last row wins; a re-publish (restarted trainer) overwrites. Returns the rows given."""
        now = utcnow()
        values = {}
        for agent, rows in rows_by_agent.items():
            for row in rows:
                stat = GroupStatIn.model_validate(row).model_dump()
                values[(agent, stat["group_key"])] = {
                    "round_id": round_id, "model": model, "agent": agent,
                    "published_by": published_by, "created_at": now, **stat}
        if not values:
            return 0
        stmt = self._insert(GroupStat).values(list(values.values()))
        with self._tx() as session:
            session.execute(stmt.on_conflict_do_update(
                index_elements=["round_id", "model", "agent", "group_key"],
                set_={name: getattr(stmt.excluded, name)
                      for name in ("n", "mean", "std", "published_by", "created_at")}))
        return sum(len(rows) for rows in rows_by_agent.values())

    def read_group_stats(self, round_id: str, model: str | None = None,
                         agent: str | None = None) -> list[GroupStatRecord]:
        stmt = (select(GroupStat).where(GroupStat.round_id == round_id)
                .order_by(GroupStat.model, GroupStat.agent, GroupStat.group_key))
        if model is not None:
            stmt = stmt.where(GroupStat.model == model)
        if agent is not None:
            stmt = stmt.where(GroupStat.agent == agent)
        with self._tx() as session:
            return [GroupStatRecord.model_validate(r) for r in session.scalars(stmt)]

    def published_models(self, round_id: str) -> set[str]:
        """Models that published group statistics for the round (the round ends at all)."""
        stmt = select(GroupStat.model).where(GroupStat.round_id == round_id).distinct()
        with self._tx() as session:
            return set(session.scalars(stmt))

    def published_models_by_round(self, round_ids: Sequence[str]) -> dict[str, set[str]]:
        """:meth:`published_models` of many rounds in one query (round lists)."""
        out: dict[str, set[str]] = {round_id: set() for round_id in round_ids}
        if not out:
            return out
        stmt = (select(GroupStat.round_id, GroupStat.model)
                .where(GroupStat.round_id.in_(list(out))).distinct())
        with self._tx() as session:
            for round_id, model in session.execute(stmt):
                out[round_id].add(model)
        return out
