"""Named leases with an expiry: how "only one of these may act" is enforced across processes
(one active trainer per model). A lease row is taken by one atomic
``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` (PostgreSQL and SQLite alike): it succeeds when
the name is free, already ours (a renewal), or expired. A holder that dies stops renewing, so
its lease expires after ``ttl_s`` and another process may take it.

Time: on PostgreSQL the database's clock (``now()``) decides expiry, so hosts' clocks do not
matter; on SQLite (one host) the process clock does.

What this module does NOT do: renew in the background or stop work when a lease is lost
(``mgrpo.services.trainer.lease``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import case, delete, func, or_, select, update

from mgrpo.store.base import StoreBase
from mgrpo.store.models import Lease, utcnow
from mgrpo.store.records import LeaseRecord


class LeaseMixin(StoreBase):
    def _now(self, session) -> datetime:
        if self.dialect == "postgresql":
            return session.scalar(select(func.now()))
        return utcnow()

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take or renew lease ``name`` for ``holder`` until now + ``ttl_s``. True when
        ``holder`` holds it afterwards; False while another holder's lease is unexpired."""
        if ttl_s <= 0:
            raise ValueError(f"lease ttl_s must be > 0, got {ttl_s}")
        with self._tx() as session:
            now = self._now(session)
            stmt = self._insert(Lease).values(name=name, holder=holder, acquired_at=now,
                                              renewed_at=now,
                                              expires_at=now + timedelta(seconds=ttl_s))
            stmt = stmt.on_conflict_do_update(
                index_elements=["name"],
                set_={"holder": stmt.excluded.holder,
                      "acquired_at": case((Lease.holder == stmt.excluded.holder,
                                           Lease.acquired_at), else_=stmt.excluded.acquired_at),
                      "renewed_at": stmt.excluded.renewed_at,
                      # a renewal keeps the holder's problem; a new holder starts without
                      "problem": case((Lease.holder == stmt.excluded.holder, Lease.problem),
                                      else_=None),
                      "expires_at": stmt.excluded.expires_at},
                where=or_(Lease.holder == holder, Lease.expires_at < now))
            return self._written(session, stmt) == 1

    def release_lease(self, name: str, holder: str) -> bool:
        """Give lease ``name`` back (only ``holder``'s own); True if it was held."""
        with self._tx() as session:
            return self._written(session, delete(Lease).where(
                Lease.name == name, Lease.holder == holder)) == 1

    def set_lease_problem(self, name: str, holder: str, problem: str | None) -> bool:
        """Record what keeps ``holder`` from the work of lease ``name`` (None: nothing); only
        the holder's own lease row is written. True if it was."""
        with self._tx() as session:
            return self._written(session, update(Lease).where(
                Lease.name == name, Lease.holder == holder).values(problem=problem)) == 1

    def lease_problem(self, name: str) -> str | None:
        """The problem the holder of lease ``name`` reports, while its lease is unexpired."""
        with self._tx() as session:
            return session.scalar(select(Lease.problem).where(
                Lease.name == name, Lease.expires_at >= self._now(session)))

    def lease_holder(self, name: str) -> str | None:
        """Who holds lease ``name`` now (unexpired, by the store's clock); None: nobody."""
        with self._tx() as session:
            return session.scalar(select(Lease.holder).where(
                Lease.name == name, Lease.expires_at >= self._now(session)))

    def get_lease(self, name: str) -> LeaseRecord | None:
        """The lease row (expired or not), or None when nobody took it."""
        with self._tx() as session:
            row = session.get(Lease, name)
            return LeaseRecord.model_validate(row) if row else None
