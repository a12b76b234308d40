"""What trainers exchange (SPEC 1.2-1.3, 2.2): trajectories, planner outcomes, group statistics,
observed d_k.

Trajectories are keyed by (traj_id, attempt): ingestion is ``INSERT ... ON CONFLICT DO
NOTHING``, so a redelivered message or a second ingesting thread never adds a row. The token
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

from collections.abc import Iterable, Sequence

from sqlalchemy import and_, func, select

from mgrpo.store.base import StoreBase
from mgrpo.store.models import GroupStat, ObservedD, PlannerOutcome, Rollout, TrajectoryRow, utcnow
from mgrpo.store.models import Round as RoundRow
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


def trajectory_row(traj: Trajectory) -> dict:
    """Column values of a trajectory (token counts derived, arrays into ``payload``)."""
    if not len(traj.input_ids) == len(traj.response_mask) == len(traj.old_logprobs):
        raise ValueError(
            f"trajectory {traj.traj_id!r}: input_ids ({len(traj.input_ids)}), response_mask "
            f"({len(traj.response_mask)}) and old_logprobs ({len(traj.old_logprobs)}) must have "
            "one entry per token; fix the episode runner that built it")
    data = traj.model_dump(mode="json")
    row = {name: data[name] for name in _COLUMN_FIELDS}
    row["payload"] = {name: data[name] for name in PAYLOAD_FIELDS}
    row["n_tokens"] = len(traj.input_ids)
    row["n_response_tokens"] = int(sum(traj.response_mask))
    return row


def _completing(model, *extra):
    """Join condition: ``model``'s row belongs to the attempt that completed its rollout."""
    return and_(Rollout.round_id == model.round_id, Rollout.query_id == model.query_id,
                Rollout.rollout == model.rollout, Rollout.completed_attempt == model.attempt,
                *extra)


class TrainingMixin(StoreBase):
    def ingest_trajectory(self, traj: Trajectory) -> bool:
        """Store one trajectory; True if new, False if (traj_id, attempt) was already stored."""
        return self.ingest_trajectories([traj]) == 1

    def ingest_trajectories(self, trajs: Iterable[Trajectory]) -> int:
        """Store several trajectories in one transaction; returns how many were new."""
        rows = [trajectory_row(traj) for traj in trajs]
        inserted = 0
        with self._tx() as session:
            for row in rows:
                stmt = self._insert(TrajectoryRow).values(created_at=utcnow(), **row)
                inserted += self._written(session, stmt.on_conflict_do_nothing(
                    index_elements=["traj_id", "attempt"]))
        return inserted

    def round_trajectories(self, round_id: str, model: str,
                           agent: str | None = None) -> list[Trajectory]:
        """``model``'s trajectories of a round, ONLY those of each rollout's completing attempt.

        Ordered by (query_id, rollout, agent, invocation, turn) so groups come out together.
        """
        stmt = (select(TrajectoryRow).join(Rollout, _completing(TrajectoryRow))
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
        stmt = (select(TrajectoryRow).join(Rollout, _completing(TrajectoryRow))
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
                .join(Rollout, _completing(TrajectoryRow))
                .where(TrajectoryRow.round_id == round_id, TrajectoryRow.model == model))
        if agent is not None:
            stmt = stmt.where(TrajectoryRow.agent == agent)
        with self._tx() as session:
            return session.execute(stmt).scalar_one()

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

    def read_planner_outcomes(self, round_id: str) -> list[PlannerOutcomeRecord]:
        """Planner outcomes of the completing attempts: what sub-agent trainers use as
        r_correct_main (SPEC 1.2). Ordered by (query_id, rollout)."""
        stmt = (select(PlannerOutcome).join(Rollout, _completing(PlannerOutcome))
                .where(PlannerOutcome.round_id == round_id)
                .order_by(PlannerOutcome.query_id, PlannerOutcome.rollout))
        with self._tx() as session:
            return [PlannerOutcomeRecord.model_validate(r) for r in session.scalars(stmt)]

    def publish_group_stats(self, round_id: str, model: str, agent: str,
                            rows: Sequence[GroupStatIn], published_by: str) -> int:
        """Publish a trainer's group statistics; a re-publish (restarted trainer) overwrites."""
        with self._tx() as session:
            for row in rows:
                stmt = self._insert(GroupStat).values(
                    round_id=round_id, model=model, agent=agent, published_by=published_by,
                    created_at=utcnow(), **GroupStatIn.model_validate(row).model_dump())
                session.execute(stmt.on_conflict_do_update(
                    index_elements=["round_id", "model", "agent", "group_key"],
                    set_={name: getattr(stmt.excluded, name)
                          for name in ("n", "mean", "std", "published_by", "created_at")}))
        return len(rows)

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

    def record_d_counts(self, agent: str, round_id: str, counts: Sequence[DCount]) -> int:
        """Record observed d_k per rollout attempt for one sub-agent type; returns how many
        were new (first write of an attempt wins).

        A count without ``attempt`` is taken as the completing attempt's: the rollout must be
        completed already (else ``ValueError``). Workers that record d_k BEFORE
        ``complete_rollout`` (the planner worker) must pass the attempt they played.
        """
        inserted = 0
        with self._tx() as session:
            for count in counts:
                row = DCount.model_validate(count).model_dump()
                if row["attempt"] is None:
                    row["attempt"] = self._completed_attempt(session, round_id, row)
                stmt = self._insert(ObservedD).values(
                    agent=agent, round_id=round_id, created_at=utcnow(), **row)
                inserted += self._written(session, stmt.on_conflict_do_nothing(
                    index_elements=["agent", "round_id", "query_id", "rollout", "attempt"]))
        return inserted

    @staticmethod
    def _completed_attempt(session, round_id: str, row: dict) -> int:
        attempt = session.scalar(select(Rollout.completed_attempt).where(
            Rollout.round_id == round_id, Rollout.query_id == row["query_id"],
            Rollout.rollout == row["rollout"]))
        if attempt is None:
            raise ValueError(
                f"d_k of rollout ({round_id!r}, {row['query_id']!r}, {row['rollout']}) has "
                "attempt=None, which means 'the completing attempt', but that rollout is not "
                "completed; pass DCount(attempt=...) with the attempt that played it")
        return attempt

    def d_counts(self, agent: str, last_n: int | None = None,
                 run_id: str | None = None) -> list[int]:
        """Observed d_k of ``agent``, completing attempts only, newest first; ``last_n``
        keeps the newest n observations; ``run_id`` keeps that run's rounds only.

        Input of ``d: auto`` (SPEC 1.3: the 99th percentile of observed d_k), which reads
        one run's history (a shared store holds other runs' too).
        """
        stmt = (select(ObservedD.d).join(Rollout, _completing(ObservedD))
                .where(ObservedD.agent == agent).order_by(ObservedD.id.desc()))
        if run_id is not None:
            stmt = stmt.join(RoundRow, RoundRow.round_id == ObservedD.round_id).where(
                RoundRow.run_id == run_id)
        if last_n is not None:
            stmt = stmt.limit(last_n)
        with self._tx() as session:
            return list(session.scalars(stmt))

    def observed_d(self, round_id: str, agent: str) -> list[DCount]:
        """d_k of ``agent`` in one round, one per COMPLETED rollout (its completing attempt),
        ordered by (query_id, rollout): how many trajectories a sub-agent trainer waits for."""
        stmt = (select(ObservedD).join(Rollout, _completing(ObservedD))
                .where(ObservedD.round_id == round_id, ObservedD.agent == agent)
                .order_by(ObservedD.query_id, ObservedD.rollout))
        with self._tx() as session:
            return [DCount.model_validate(row) for row in session.scalars(stmt)]
