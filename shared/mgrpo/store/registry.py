"""Checkpoints, the agent registry, processed message ids and metrics.

What this module does NOT do: write checkpoint files (``mgrpo.models``) or serve metrics
(the planner's ``/metrics``): it only records what happened.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

from sqlalchemy import delete, select, update

from mgrpo.store.base import StoreBase
from mgrpo.store.models import Agent, Checkpoint, Metric, ProcessedMessage, utcnow
from mgrpo.store.records import AgentRecord, CheckpointRecord


class CheckpointConflict(ValueError):
    """A (run, model, version) is already recorded with another file: versions are written
    once, so two different checkpoints under one key mean something overwrote files."""


class RegistryMixin(StoreBase):
    def record_checkpoint(self, model: str, version: int, uri: str, sha256: str,
                          round_id: str | None = None, run_id: str = "") -> bool:
        """Record a written checkpoint of ``model`` in ``run_id``; True if new, False if this
        exact record (same uri and sha256) exists already (a retry).

        Raises :class:`CheckpointConflict` when (run_id, model, version) is recorded with
        another sha256 or uri: a recorded version is immutable, never silently kept or
        replaced.
        """
        if len(sha256) != 64:
            raise ValueError(f"sha256 {sha256!r} of {model} v{version} is not a 64-character "
                             "hex digest; pass hashlib.sha256(...).hexdigest()")
        stmt = self._insert(Checkpoint).values(run_id=run_id, model=model, version=version,
                                               uri=uri, sha256=sha256, round_id=round_id,
                                               created_at=utcnow())
        with self._tx() as session:
            if self._written(session, stmt.on_conflict_do_nothing(
                    index_elements=["run_id", "model", "version"])) == 1:
                return True
            row = session.scalars(select(Checkpoint).where(
                Checkpoint.run_id == run_id, Checkpoint.model == model,
                Checkpoint.version == version)).one()
            if (row.sha256, row.uri) != (sha256, uri):
                raise CheckpointConflict(
                    f"checkpoint {model} v{version} of run {run_id!r} is already recorded "
                    f"(sha256 {row.sha256[:12]}..., {row.uri}); refusing sha256 "
                    f"{sha256[:12]}..., {uri}: a version is written once, save a new one")
            return False

    def forget_checkpoints(self, model: str, versions: Sequence[int], run_id: str = "") -> int:
        """Delete the records of ``versions`` of ``model`` in ``run_id`` (their files are
        being deleted: ``keep_checkpoints``); returns how many were deleted."""
        if not versions:
            return 0
        stmt = delete(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.model == model,
                                        Checkpoint.version.in_(list(versions)))
        with self._tx() as session:
            return session.execute(stmt).rowcount

    def latest_checkpoint(self, model: str, run_id: str = "") -> CheckpointRecord | None:
        """The newest recorded version of ``model`` in ``run_id`` (never another run's)."""
        stmt = (select(Checkpoint).where(Checkpoint.model == model, Checkpoint.run_id == run_id)
                .order_by(Checkpoint.version.desc()).limit(1))
        with self._tx() as session:
            row = session.scalars(stmt).first()
            return CheckpointRecord.model_validate(row) if row else None

    def get_checkpoint(self, model: str, version: int, run_id: str = "") -> CheckpointRecord | None:
        stmt = select(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.model == model,
                                        Checkpoint.version == version)
        with self._tx() as session:
            row = session.scalars(stmt).first()
            return CheckpointRecord.model_validate(row) if row else None

    def list_checkpoints(self, model: str | None = None,
                         run_id: str | None = None) -> list[CheckpointRecord]:
        stmt = select(Checkpoint).order_by(Checkpoint.run_id, Checkpoint.model,
                                           Checkpoint.version)
        if model is not None:
            stmt = stmt.where(Checkpoint.model == model)
        if run_id is not None:
            stmt = stmt.where(Checkpoint.run_id == run_id)
        with self._tx() as session:
            return [CheckpointRecord.model_validate(row) for row in session.scalars(stmt)]

    def register_agent(self, name: str, model: str, queue: str, tool: str | None = None,
                       description: str = "") -> None:
        """Register (or re-register, updating every field) an agent; also a heartbeat."""
        now = self._clock()
        stmt = self._insert(Agent).values(name=name, model=model, queue=queue, tool=tool,
                                          description=description, registered_at=now,
                                          heartbeat_at=now)
        with self._tx() as session:
            session.execute(stmt.on_conflict_do_update(
                index_elements=["name"],
                set_={field: getattr(stmt.excluded, field)
                      for field in ("model", "queue", "tool", "description", "heartbeat_at")}))

    def heartbeat(self, name: str) -> bool:
        """Stamp the agent alive now; False if no agent of that name is registered."""
        stmt = update(Agent).where(Agent.name == name).values(heartbeat_at=self._clock())
        with self._tx() as session:
            return self._written(session, stmt) == 1

    def list_agents(self, alive_within_s: float | None = None) -> list[AgentRecord]:
        """Registered agents by name; with ``alive_within_s`` only those heard from since.
        Heartbeats are stamped and aged by the store's clock (:meth:`_clock`)."""
        stmt = select(Agent).order_by(Agent.name)
        if alive_within_s is not None:
            stmt = stmt.where(Agent.heartbeat_at
                              >= self._clock() - timedelta(seconds=alive_within_s))
        with self._tx() as session:
            return [AgentRecord.model_validate(row) for row in session.scalars(stmt)]

    def claim_message(self, key: str, consumer: str = "") -> bool:
        """Record a message (idempotency) key as processed; True the first time only."""
        stmt = self._insert(ProcessedMessage).values(key=key, consumer=consumer,
                                                     processed_at=utcnow())
        with self._tx() as session:
            return self._written(session, stmt.on_conflict_do_nothing(
                index_elements=["key"])) == 1

    def message_seen(self, key: str) -> bool:
        with self._tx() as session:
            return session.get(ProcessedMessage, key) is not None

    def messages_seen(self, keys: Sequence[str]) -> set[str]:
        """Which of ``keys`` are recorded as processed: one query for a batch."""
        if not keys:
            return set()
        stmt = select(ProcessedMessage.key).where(ProcessedMessage.key.in_(list(set(keys))))
        with self._tx() as session:
            return set(session.scalars(stmt))

    def claim_messages(self, keys: Sequence[str], consumer: str = "") -> int:
        """:meth:`claim_message` for a batch, in one statement; returns how many were new."""
        if not keys:
            return 0
        now = utcnow()
        stmt = self._insert(ProcessedMessage).values(
            [{"key": key, "consumer": consumer, "processed_at": now}
             for key in dict.fromkeys(keys)])
        with self._tx() as session:
            return self._written(session, stmt.on_conflict_do_nothing(index_elements=["key"]))

    def record_metrics(self, run_id: str, round_id: str, metrics: Mapping[str, float]) -> None:
        """Upsert metrics of one round (keys ``"{agent}/{quantity}"``, docs/metrics.md), in
        one multi-row statement."""
        if not metrics:
            return
        now = utcnow()
        stmt = self._insert(Metric).values([
            {"run_id": run_id, "round_id": round_id, "key": key, "value": float(value),
             "created_at": now} for key, value in metrics.items()])
        with self._tx() as session:
            session.execute(stmt.on_conflict_do_update(
                index_elements=["run_id", "round_id", "key"],
                set_={"value": stmt.excluded.value, "created_at": stmt.excluded.created_at}))

    def metrics(self, run_id: str, round_id: str | None = None) -> dict[str, dict[str, float]]:
        """``{round_id: {key: value}}`` of a run, rounds in the order they were recorded."""
        stmt = select(Metric).where(Metric.run_id == run_id).order_by(Metric.id)
        if round_id is not None:
            stmt = stmt.where(Metric.round_id == round_id)
        result: dict[str, dict[str, float]] = {}
        with self._tx() as session:
            for row in session.scalars(stmt):
                result.setdefault(row.round_id, {})[row.key] = row.value
        return result
