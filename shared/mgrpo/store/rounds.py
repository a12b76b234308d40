"""Runs, queries, rounds and rollouts: which attempt of a rollout counts (docs/store.md,
'Tables').

A rollout is attempted until one attempt completes; :meth:`RoundsMixin.complete_rollout` is
a compare-and-set, so the FIRST attempt to complete wins and a zombie attempt that finishes
later is ignored. Trainers then read only the trajectories of that attempt.

What this module does NOT do: trajectories, rewards or statistics (``mgrpo.store.training``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import UTC, datetime

from sqlalchemy import Integer, String, column, func, select, update, values

from mgrpo.store.base import StoreBase
from mgrpo.store.errors import RunBusy
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
        """Insert or update queries (question, gold answer, meta) in one multi-row statement
        (an id given twice: the last wins); returns how many were given."""
        queries = list(queries)
        if not queries:
            return 0
        with self._tx() as session:
            session.execute(self._upsert_queries(queries))
        return len(queries)

    def _upsert_queries(self, queries: Sequence[QueryRecord]):
        rows = [query.model_dump() for query in queries]
        stmt = self._insert(Query).values(list({row["query_id"]: row for row in rows}.values()))
        return stmt.on_conflict_do_update(
            index_elements=["query_id"],
            set_={"question": stmt.excluded.question, "answer": stmt.excluded.answer,
                  "meta": stmt.excluded.meta})

    def get_query(self, query_id: str) -> QueryRecord | None:
        with self._tx() as session:
            row = session.get(Query, query_id)
            return QueryRecord.model_validate(row) if row else None

    def create_round(self, run_id: str, round_id: str, index: int, query_ids: Sequence[str],
                     k: int, config: dict | None = None, *,
                     queries: Sequence[QueryRecord] = (), running: bool = False,
                     unfinished: Collection[str] | None = None,
                     published: bool = True) -> bool:
        """Write a round and its ``len(query_ids) * k`` pending rollouts in one transaction.

        Idempotent: a second call with the same ``round_id`` returns False and changes nothing.
        Unknown query ids get a bare ``queries`` row (fill it with :meth:`upsert_queries`).
        ``queries``: their full rows, written (as :meth:`upsert_queries` does) in the same
        transaction; ``running``: the round starts as 'running' (``started_at`` stamped), as
        :meth:`set_round_status` would. One commit for a round's start instead of three (a
        commit is a WAL flush, ~6 ms on this machine's PostgreSQL). ``published=False``: its
        tasks are still to be sent (the outbox flag; :meth:`mark_round_published`).

        ``unfinished``: the run's unfinished rounds the caller decided with (none: a
        synchronous run). In the same transaction, under a lock on the run's row (SQLite:
        the database lock of ``BEGIN IMMEDIATE``), an unfinished round of the run that is
        not among them raises :class:`~mgrpo.store.errors.RunBusy`: of concurrent starts
        that read the same state, one creates its round and the others see it.
        """
        if k < 1:
            raise ValueError(f"k={k}: a round needs at least one rollout per query (k >= 1)")
        if len(set(query_ids)) != len(query_ids):
            raise ValueError(f"query_ids of round {round_id!r} repeat an id: {list(query_ids)}; "
                             "pass each query once and use k for repeated rollouts")
        now = utcnow()
        with self._tx() as session:
            if unfinished is not None:
                session.execute(select(Run.run_id).where(Run.run_id == run_id)
                                .with_for_update())
                busy = session.scalars(select(Round.round_id).where(
                    Round.run_id == run_id,
                    Round.status.not_in(list(TERMINAL_ROUND_STATUSES)))).all()
                others = sorted(set(busy) - set(unfinished))
                if others:
                    raise RunBusy(run_id, others)
            inserted = self._written(session, self._insert(Round).values(
                round_id=round_id, run_id=run_id, index=index, k=k,
                status="running" if running else "pending", config=config or {},
                created_at=now, started_at=now if running else None, published=published,
            ).on_conflict_do_nothing(index_elements=["round_id"]))
            if inserted != 1:
                return False
            if queries:
                session.execute(self._upsert_queries(queries))
            if query_ids:
                session.execute(self._insert(Query).values(
                    [{"query_id": query_id, "meta": {}} for query_id in query_ids])
                    .on_conflict_do_nothing(index_elements=["query_id"]))
            session.add_all(Rollout(round_id=round_id, query_id=query_id, rollout=r,
                                    status="pending", attempts=0)
                            for query_id in query_ids for r in range(k))
            return True

    def mark_round_published(self, round_id: str) -> None:
        """Every task of ``round_id`` is on the broker."""
        with self._tx() as session:
            session.execute(update(Round).where(Round.round_id == round_id)
                            .values(published=True))

    def unpublished_rounds(self, created_before: datetime) -> list[RoundRecord]:
        """Running rounds created before ``created_before`` whose tasks are not all on the
        broker (their creator died while publishing), oldest first."""
        stmt = (select(Round).where(Round.published.is_(False), Round.status == "running",
                                    Round.created_at < created_before)
                .order_by(Round.created_at))
        with self._tx() as session:
            return [RoundRecord.model_validate(row) for row in session.scalars(stmt)]

    def get_round(self, round_id: str) -> RoundRecord | None:
        with self._tx() as session:
            row = session.get(Round, round_id)
            return RoundRecord.model_validate(row) if row else None

    def list_rounds(self, run_id: str | None = None,
                    statuses: Sequence[str] | None = None) -> list[RoundRecord]:
        """Rounds (of ``run_id``; with one of ``statuses``), oldest first."""
        stmt = select(Round).order_by(Round.created_at, Round.index)
        if run_id is not None:
            stmt = stmt.where(Round.run_id == run_id)
        if statuses is not None:
            stmt = stmt.where(Round.status.in_(list(statuses)))
        with self._tx() as session:
            return [RoundRecord.model_validate(row) for row in session.scalars(stmt)]

    def set_round_status(self, round_id: str, status: RoundStatus,
                         error: str | None = None,
                         only_from: Sequence[str] | None = None) -> bool:
        """Move a round to ``status``; stamps started_at (first 'running') and finished_at.

        With ``only_from``, a compare-and-set: the round moves only if its status is one of
        those (read under a row lock), so a writer that decided on a stale read cannot undo
        another's later move (the planner's 'training' after a trainer's 'done'). Returns
        whether it moved."""
        with self._tx() as session:
            row = session.get(Round, round_id, with_for_update=only_from is not None)
            if row is None:
                raise KeyError(f"round {round_id!r} does not exist; create it with create_round")
            if only_from is not None and row.status not in only_from:
                return False
            row.status = status
            row.error = error
            if status == "running" and row.started_at is None:
                row.started_at = utcnow()
            if status in TERMINAL_ROUND_STATUSES:
                row.finished_at = utcnow()
            return True

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

    def begin_attempts(self, rollouts: Sequence[tuple[str, str, int]]) -> list[int | None]:
        """:meth:`begin_attempt` of several (round_id, query_id, rollout), in ONE
        transaction; the attempt numbers in the same order (None: already completed). On
        PostgreSQL one ``UPDATE ... FROM (VALUES ...)`` whatever the batch size (a rollout
        named twice: one statement each, in order, as before)."""
        keys = [tuple(key) for key in rollouts]
        with self._tx() as session:
            if self.dialect == "postgresql" and keys and len(set(keys)) == len(keys):
                todo = values(column("round_id", String), column("query_id", String),
                              column("rollout", Integer), name="todo").data(keys)
                begun = {(r, q, k): n - 1 for r, q, k, n in session.execute(
                    update(Rollout).where(
                        Rollout.round_id == todo.c.round_id,
                        Rollout.query_id == todo.c.query_id,
                        Rollout.rollout == todo.c.rollout, Rollout.status != "completed")
                    .values(attempts=Rollout.attempts + 1, status="running")
                    .returning(Rollout.round_id, Rollout.query_id, Rollout.rollout,
                               Rollout.attempts))}
                return [begun.get(key) for key in keys]
            out: list[int | None] = []
            for round_id, query_id, rollout in keys:
                attempts = session.execute(
                    update(Rollout)
                    .where(Rollout.round_id == round_id, Rollout.query_id == query_id,
                           Rollout.rollout == rollout, Rollout.status != "completed")
                    .values(attempts=Rollout.attempts + 1, status="running")
                    .returning(Rollout.attempts)).scalar_one_or_none()
                out.append(None if attempts is None else attempts - 1)
        return out

    def get_queries(self, query_ids: Iterable[str]) -> dict[str, QueryRecord]:
        """The stored queries among ``query_ids`` (one query), by id."""
        ids = list(set(query_ids))
        if not ids:
            return {}
        with self._tx() as session:
            return {row.query_id: QueryRecord.model_validate(row)
                    for row in session.scalars(select(Query).where(Query.query_id.in_(ids)))}

    def complete_rollout(self, round_id: str, query_id: str, rollout: int, attempt: int) -> bool:
        """Mark ``attempt`` as the one that counts; True if it won, False if one already had."""
        stmt = (update(Rollout)
                .where(Rollout.round_id == round_id, Rollout.query_id == query_id,
                       Rollout.rollout == rollout, Rollout.status != "completed")
                .values(status="completed", completed_attempt=attempt, completed_at=utcnow()))
        with self._tx() as session:
            return self._written(session, stmt) == 1

    def rollout_keys(self, round_id: str, query_ids: Iterable[str]) -> set[tuple[str, int]]:
        """The (query_id, rollout) pairs of ``round_id`` among ``query_ids`` (one query)."""
        stmt = select(Rollout.query_id, Rollout.rollout).where(
            Rollout.round_id == round_id, Rollout.query_id.in_(sorted(set(query_ids))))
        with self._tx() as session:
            return {(query_id, rollout) for query_id, rollout in session.execute(stmt)}

    def rollouts(self, round_id: str) -> list[RolloutRecord]:
        stmt = (select(Rollout).where(Rollout.round_id == round_id)
                .order_by(Rollout.query_id, Rollout.rollout))
        with self._tx() as session:
            return [RolloutRecord.model_validate(row) for row in session.scalars(stmt)]

    def stalled_seconds(self) -> dict[str, float]:
        """Seconds since each unfinished round last progressed (it started, a rollout
        completed, a model published its group statistics), by the store's clock."""
        # here, not at the top: an import circle through mgrpo.store.models
        from mgrpo.store.models import GroupStat

        last_rollout = (select(func.max(Rollout.completed_at))
                        .where(Rollout.round_id == Round.round_id).scalar_subquery())
        last_stat = (select(func.max(GroupStat.created_at))
                     .where(GroupStat.round_id == Round.round_id).scalar_subquery())
        stmt = select(Round.round_id, func.coalesce(Round.started_at, Round.created_at),
                      last_rollout, last_stat).where(
            Round.status.not_in(list(TERMINAL_ROUND_STATUSES)))
        with self._tx() as session:
            rows = session.execute(stmt).all()
            now = session.execute(select(func.now())).scalar() \
                if self.dialect == "postgresql" else utcnow()
        return {round_id: max(0.0, (_aware(now) - max(_aware(t) for t in times if t is not None))
                              .total_seconds())
                for round_id, *times in rows}

    def round_progress(self, round_id: str) -> RoundProgress:
        """How many of the round's rollouts exist and how many are completed."""
        completed = func.count().filter(Rollout.status == "completed")
        stmt = select(func.count(), completed).where(Rollout.round_id == round_id)
        with self._tx() as session:
            total, done = session.execute(stmt).one()
        return RoundProgress(total=total, completed=done or 0)


def _aware(moment: datetime) -> datetime:
    """SQLite hands timestamps back without their zone; they are UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
