"""Observed d_k (docs/store.md, 'Tables'): how many times, and which, sub-agent calls each
rollout attempt made, per sub-agent type. The planner worker writes them with its outcomes
(``TrainingMixin.finish_episodes``); trainers read the completing attempts' rows to know
which trajectories a round holds, and ``d: auto`` reads a run's history.

What this module does NOT do: align trajectories to d slots (``mgrpo.algo.alignment``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import select

from mgrpo.store.base import StoreBase
from mgrpo.store.models import ObservedD, Rollout, utcnow
from mgrpo.store.models import Round as RoundRow
from mgrpo.store.records import DCount
from mgrpo.store.training import completing


class CallCountsMixin(StoreBase):
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

        Input of ``d: auto`` (the 99th percentile of observed d_k), which reads
        one run's history (a shared store holds other runs' too).
        """
        stmt = (select(ObservedD.d).join(Rollout, completing(ObservedD))
                .where(ObservedD.agent == agent).order_by(ObservedD.id.desc()))
        if run_id is not None:
            stmt = stmt.join(RoundRow, RoundRow.round_id == ObservedD.round_id).where(
                RoundRow.run_id == run_id)
        if last_n is not None:
            stmt = stmt.limit(last_n)
        with self._tx() as session:
            return list(session.scalars(stmt))

    def recorded_invocations(self, agent: str, keys: Iterable[tuple[str, str, int, int]]
                             ) -> dict[tuple[str, str, int, int], list[int] | None]:
        """Of (round_id, query_id, rollout, attempt) ``keys``: those whose rollout is completed
        by that attempt and has ``agent``'s d_k row, each with the invocation numbers that row
        records as answered (None: the count only). Other keys are absent (a rollout not
        completed yet, another attempt's). One query."""
        keys = set(keys)
        if not keys:
            return {}
        stmt = (select(ObservedD.round_id, ObservedD.query_id, ObservedD.rollout,
                       ObservedD.attempt, ObservedD.invocations)
                .join(Rollout, completing(ObservedD))
                .where(ObservedD.agent == agent,
                       ObservedD.round_id.in_({k[0] for k in keys}),
                       ObservedD.query_id.in_({k[1] for k in keys})))
        with self._tx() as session:
            rows = session.execute(stmt).all()
        return {key: invocations for *rest, invocations in rows
                if (key := tuple(rest)) in keys}

    def observed_d(self, round_id: str, agent: str) -> list[DCount]:
        """d_k of ``agent`` in one round, one per COMPLETED rollout (its completing attempt),
        ordered by (query_id, rollout): how many trajectories a sub-agent trainer waits for."""
        stmt = (select(ObservedD).join(Rollout, completing(ObservedD))
                .where(ObservedD.round_id == round_id, ObservedD.agent == agent)
                .order_by(ObservedD.query_id, ObservedD.rollout))
        with self._tx() as session:
            return [DCount.model_validate(row) for row in session.scalars(stmt)]
