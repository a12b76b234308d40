"""Evaluation jobs of the planner API (``evaluation_jobs``): recorded when one starts, as it
plays and when it ends, so a restart of the API does not forget them and every replica
answers ``GET /v1/evaluations/{id}`` from the same rows.

Who is alive: the process that runs a job (its ``owner``) holds a store lease
(``mgrpo.store.leases``) while the job runs and renews it. :meth:`interrupt_orphaned_evaluations`
marks ``interrupted`` every running job whose owner does not hold that lease unexpired: one
``UPDATE ... WHERE NOT EXISTS (lease)``, atomic on PostgreSQL and SQLite alike, so two
replicas sweeping at once interrupt a job once. Expiry is read on the database's clock on
PostgreSQL (as leases are).

Writes of a running job (:meth:`update_evaluation`) only touch a row that is still
``running`` and still the caller's: an owner that was declared dead (its lease expired while
it was stalled) learns it from ``False`` and never overwrites the ``interrupted`` status.

What this module does NOT do: run evaluations or renew the lease
(``mgrpo.services.api.evaluation_jobs``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import exists, select, update

from mgrpo.store.leases import LeaseMixin
from mgrpo.store.models import EvaluationJob, Lease, utcnow
from mgrpo.store.records import EvaluationJobRecord

FINAL_STATUSES = ("done", "failed", "interrupted")


class EvaluationsMixin(LeaseMixin):
    def create_evaluation(self, evaluation_id: str, owner: str, request: dict[str, Any],
                          n_questions: int) -> EvaluationJobRecord:
        """Record a new running job of ``owner``."""
        now = utcnow()
        row = EvaluationJob(evaluation_id=evaluation_id, status="running", owner=owner,
                            request=request, n_questions=n_questions, played=0,
                            created_at=now, updated_at=now)
        with self._tx() as session:
            session.add(row)
            session.flush()
            return EvaluationJobRecord.model_validate(row)

    def update_evaluation(self, evaluation_id: str, owner: str, *, played: int | None = None,
                          n_questions: int | None = None, status: str | None = None,
                          result: dict[str, Any] | None = None,
                          error: str | None = None) -> bool:
        """Write progress (``played``, ``n_questions``) or the end (``status`` done, failed
        or interrupted, with ``result`` or ``error``) of ``owner``'s running job. False when
        the job is no longer running or not ``owner``'s: nothing is written then."""
        if status is not None and status not in FINAL_STATUSES:
            raise ValueError(f"an evaluation ends as one of {FINAL_STATUSES}, not {status!r}")
        now = utcnow()
        values: dict[str, Any] = {"updated_at": now}
        for name, value in (("played", played), ("n_questions", n_questions),
                            ("status", status), ("result", result), ("error", error)):
            if value is not None:
                values[name] = value
        if status is not None:
            values["finished_at"] = now
        stmt = (update(EvaluationJob)
                .where(EvaluationJob.evaluation_id == evaluation_id,
                       EvaluationJob.owner == owner, EvaluationJob.status == "running")
                .values(**values))
        with self._tx() as session:
            return self._written(session, stmt) == 1

    def get_evaluation(self, evaluation_id: str) -> EvaluationJobRecord | None:
        with self._tx() as session:
            row = session.get(EvaluationJob, evaluation_id)
            return EvaluationJobRecord.model_validate(row) if row else None

    def list_evaluations(self, limit: int = 20,
                         status: str | None = None) -> list[EvaluationJobRecord]:
        """The newest ``limit`` jobs (optionally of one ``status``), newest first."""
        stmt = select(EvaluationJob).order_by(EvaluationJob.created_at.desc(),
                                              EvaluationJob.evaluation_id).limit(limit)
        if status is not None:
            stmt = stmt.where(EvaluationJob.status == status)
        with self._tx() as session:
            return [EvaluationJobRecord.model_validate(row) for row in session.scalars(stmt)]

    def interrupt_orphaned_evaluations(self, lease: str, reason: str) -> list[str]:
        """Mark ``interrupted`` (``error`` = ``reason``) every running job whose owner does not
        hold lease ``lease`` unexpired; the ids it marked."""
        with self._tx() as session:
            now = self._now(session)
            owner_alive = exists().where(Lease.name == lease,
                                         Lease.holder == EvaluationJob.owner,
                                         Lease.expires_at >= now)
            stmt = (update(EvaluationJob)
                    .where(EvaluationJob.status == "running", ~owner_alive)
                    .values(status="interrupted", error=reason, updated_at=utcnow(),
                            finished_at=utcnow())
                    .returning(EvaluationJob.evaluation_id))
            return list(session.scalars(stmt))
