"""Runs, queries, rounds and rollouts: which attempt of a rollout counts (SPEC 2.2).

A rollout is attempted until one attempt completes; :meth:`RoundsMixin.complete_rollout` is
a compare-and-set, so the FIRST attempt to complete wins and a zombie attempt that finishes
later is ignored. Trainers then read only the trajectories of that attempt.

What this module does NOT do: trajectories, rewards or statistics (``mgrpo.store.training``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import func, select, update

from mgrpo.store.base import StoreBase
from mgrpo.store.models import Query, Rollout, Round, Run, utcnow
from mgrpo.store.records import (
    TERMINAL_ROUND_STATUSES,
    QueryRecord,
    RolloutRecord,
    RoundProgress,
    RoundRecord,
    RoundStatus,
    RunRecord,
)


class RoundsMixin(StoreBase):
    def create_run(self, run_id: str, name: str = "", config: dict | None = None) -> bool:
        """Create a run; False (and nothing changed) if ``run_id`` exists already."""
        stmt = self._insert(Run).values(run_id=run_id, name=name, config=config or {},
                                        status="running", created_at=utcnow())
        with self._tx() as session:
            return self._written(
                session, stmt.on_conflict_do_nothing(index_elements=["run_id"])) == 1

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._tx() as session:
            row = session.get(Run, run_id)
            return RunRecord.model_validate(row) if row else None

    def list_runs(self) -> list[RunRecord]:
        """Every run, oldest first (the dashboard's run list)."""
        with self._tx() as session:
            return [RunRecord.model_validate(row)
                    for row in session.scalars(select(Run).order_by(Run.created_at))]

    def upsert_queries(self, queries: Iterable[QueryRecord]) -> int:
        """Insert or update queries (question, gold answer, meta); returns how many were given."""
        count = 0
        with self._tx() as session:
            for query in queries:
                stmt = self._insert(Query).values(**query.model_dump())
                session.execute(stmt.on_conflict_do_update(
                    index_elements=["query_id"],
                    set_={"question": stmt.excluded.question, "answer": stmt.excluded.answer,
                          "meta": stmt.excluded.meta}))
                count += 1
        return count

    def get_query(self, query_id: str) -> QueryRecord | None:
        with self._tx() as session:
            row = session.get(Query, query_id)
            return QueryRecord.model_validate(row) if row else None

    def create_round(self, run_id: str, round_id: str, index: int, query_ids: Sequence[str],
                     k: int, config: dict | None = None) -> bool:
        """Write a round and its ``len(query_ids) * k`` pending rollouts in one transaction.

        Idempotent: a second call with the same ``round_id`` returns False and changes nothing.
        Unknown query ids get a bare ``queries`` row (fill it with :meth:`upsert_queries`).
        """
        if k < 1:
            raise ValueError(f"k={k}: a round needs at least one rollout per query (k >= 1)")
        if len(set(query_ids)) != len(query_ids):
            raise ValueError(f"query_ids of round {round_id!r} repeat an id: {list(query_ids)}; "
                             "pass each query once and use k for repeated rollouts")
        with self._tx() as session:
            inserted = self._written(session, self._insert(Round).values(
                round_id=round_id, run_id=run_id, index=index, k=k, status="pending",
                config=config or {}, created_at=utcnow(),
            ).on_conflict_do_nothing(index_elements=["round_id"]))
            if inserted != 1:
                return False
            for query_id in query_ids:
                session.execute(self._insert(Query).values(query_id=query_id, meta={})
                                .on_conflict_do_nothing(index_elements=["query_id"]))
            session.add_all(Rollout(round_id=round_id, query_id=query_id, rollout=r,
                                    status="pending", attempts=0)
                            for query_id in query_ids for r in range(k))
            return True

    def get_round(self, round_id: str) -> RoundRecord | None:
        with self._tx() as session:
            row = session.get(Round, round_id)
            return RoundRecord.model_validate(row) if row else None

    def list_rounds(self, run_id: str | None = None) -> list[RoundRecord]:
        stmt = select(Round).order_by(Round.created_at, Round.index)
        if run_id is not None:
            stmt = stmt.where(Round.run_id == run_id)
        with self._tx() as session:
            return [RoundRecord.model_validate(row) for row in session.scalars(stmt)]

    def set_round_status(self, round_id: str, status: RoundStatus,
                         error: str | None = None) -> None:
        """Move a round to ``status``; stamps started_at (first 'running') and finished_at."""
        with self._tx() as session:
            row = session.get(Round, round_id)
            if row is None:
                raise KeyError(f"round {round_id!r} does not exist; create it with create_round")
            row.status = status
            row.error = error
            if status == "running" and row.started_at is None:
                row.started_at = utcnow()
            if status in TERMINAL_ROUND_STATUSES:
                row.finished_at = utcnow()

    def begin_attempt(self, round_id: str, query_id: str, rollout: int) -> int | None:
        """Start a new attempt of a rollout and return its number (0, 1, ...).

        None if the rollout is already completed (nothing to re-run). Atomic: two workers
        beginning the same rollout get different attempt numbers.
        """
        stmt = (update(Rollout)
                .where(Rollout.round_id == round_id, Rollout.query_id == query_id,
                       Rollout.rollout == rollout, Rollout.status != "completed")
                .values(attempts=Rollout.attempts + 1, status="running")
                .returning(Rollout.attempts))
        with self._tx() as session:
            attempts = session.execute(stmt).scalar_one_or_none()
        return None if attempts is None else attempts - 1

    def complete_rollout(self, round_id: str, query_id: str, rollout: int, attempt: int) -> bool:
        """Mark ``attempt`` as the one that counts; True if it won, False if one already had."""
        stmt = (update(Rollout)
                .where(Rollout.round_id == round_id, Rollout.query_id == query_id,
                       Rollout.rollout == rollout, Rollout.status != "completed")
                .values(status="completed", completed_attempt=attempt, completed_at=utcnow()))
        with self._tx() as session:
            return self._written(session, stmt) == 1

    def rollouts(self, round_id: str) -> list[RolloutRecord]:
        stmt = (select(Rollout).where(Rollout.round_id == round_id)
                .order_by(Rollout.query_id, Rollout.rollout))
        with self._tx() as session:
            return [RolloutRecord.model_validate(row) for row in session.scalars(stmt)]

    def round_progress(self, round_id: str) -> RoundProgress:
        """How many of the round's rollouts exist and how many are completed."""
        completed = func.count().filter(Rollout.status == "completed")
        stmt = select(func.count(), completed).where(Rollout.round_id == round_id)
        with self._tx() as session:
            total, done = session.execute(stmt).one()
        return RoundProgress(total=total, completed=done or 0)
