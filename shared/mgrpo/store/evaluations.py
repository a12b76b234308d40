"""Evaluation jobs of the planner API (``evaluation_jobs``): recorded when one starts, as it
plays and when it ends, so a restart of the API does not forget them and every replica
answers ``GET /v1/evaluations/{id}`` from the same rows.

Who is alive: the process that runs a job (its ``owner``) holds a store lease
(``mgrpo.store.leases``) while the job runs and renews it. :meth:`interrupt_orphaned_evaluations`
marks ``interrupted`` every running job whose owner does not hold that lease unexpired: one
``UPDATE ... WHERE NOT EXISTS (lease)``, atomic on PostgreSQL and SQLite alike, so two
replicas sweeping at once interrupt a job once. Expiry is read on the database's clock on
PostgreSQL (as leases are).

A job sent to the evaluation workers (``mgrpo.control.evaluate``) is recorded ``queued``
with no owner; the worker that plays it takes it with :meth:`claim_evaluation` (queued ->
running, its owner set, at most once). A queued job has no lease and is not swept as an
orphan; one whose task was dead-lettered ends ``failed`` (:meth:`fail_queued_evaluation`),
and so does one queued for too long (:meth:`expire_queued_evaluations`).

Writes of a running job (:meth:`update_evaluation`) only touch a row that is still
``running`` and still the caller's: an owner that was declared dead (its lease expired while
it was stalled) learns it from ``False`` and never overwrites the ``interrupted`` status.

What this module does NOT do: run evaluations or renew the lease
(``mgrpo.services.api.evaluation_jobs``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import exists, select, update

from mgrpo.store.leases import LeaseMixin
from mgrpo.store.models import EvaluationJob, Lease, utcnow
from mgrpo.store.records import EvaluationJobRecord

FINAL_STATUSES = ("done", "failed", "interrupted")


class EvaluationsMixin(LeaseMixin):
    def create_evaluation(self, evaluation_id: str, owner: str, request: dict[str, Any],
                          n_questions: int, status: str = "running") -> EvaluationJobRecord:
        """Record a new job: running (``owner``'s), or queued (``owner`` empty) for a
        worker to :meth:`claim_evaluation`."""
        if status not in ("running", "queued"):
            raise ValueError(f"an evaluation starts running or queued, not {status!r}")
        now = utcnow()
        row = EvaluationJob(evaluation_id=evaluation_id, status=status, owner=owner,
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

    def claim_evaluation(self, evaluation_id: str, owner: str) -> bool:
        """Take the queued job ``evaluation_id``: running, ``owner``'s. False when it is not
        queued (another worker took it, or it ended): nothing is written then."""
        stmt = (update(EvaluationJob)
                .where(EvaluationJob.evaluation_id == evaluation_id,
                       EvaluationJob.status == "queued")
                .values(status="running", owner=owner, updated_at=utcnow()))
        with self._tx() as session:
            return self._written(session, stmt) == 1

    def fail_queued_evaluation(self, evaluation_id: str, error: str) -> bool:
        """End the queued job ``evaluation_id`` as failed with ``error`` (its task will not
        run: dead-lettered). False when it is not queued."""
        now = utcnow()
        stmt = (update(EvaluationJob)
                .where(EvaluationJob.evaluation_id == evaluation_id,
                       EvaluationJob.status == "queued")
                .values(status="failed", error=error, updated_at=now, finished_at=now))
        with self._tx() as session:
            return self._written(session, stmt) == 1

    def expire_queued_evaluations(self, older_than_s: float, reason: str) -> list[str]:
        """End as failed (``error`` = ``reason``) the jobs queued more than ``older_than_s``
        seconds ago: their task was lost or will never run. The ids it ended."""
        now = utcnow()
        stmt = (update(EvaluationJob)
                .where(EvaluationJob.status == "queued",
                       EvaluationJob.created_at < now - timedelta(seconds=older_than_s))
                .values(status="failed", error=reason, updated_at=now, finished_at=now)
                .returning(EvaluationJob.evaluation_id))
        with self._tx() as session:
            return list(session.scalars(stmt))

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
