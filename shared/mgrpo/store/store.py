"""The stats store's one repository class: :class:`Store` (docs/store.md, 'API (`Store`)').

Every method is one short transaction. Concurrency safety comes from UNIQUE constraints and
``INSERT ... ON CONFLICT`` (PostgreSQL) / the same statement on SQLite, never from
read-then-write in Python, so several trainers and workers can share one PostgreSQL database.

What this module does NOT do: create the database itself (only its tables, via
:meth:`Store.upgrade`), or know about the bus.
"""

from __future__ import annotations

from alembic import command
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from mgrpo.store.call_counts import CallCountsMixin
from mgrpo.store.evaluations import EvaluationsMixin
from mgrpo.store.leases import LeaseMixin
from mgrpo.store.migrate import alembic_config
from mgrpo.store.registry import RegistryMixin
from mgrpo.store.rounds import RoundsMixin
from mgrpo.store.training import TrainingMixin

# Serialises concurrent `upgrade` calls of services starting together (PostgreSQL only).
_MIGRATION_LOCK_ID = 0x6D6772706F  # "mgrpo"


class Store(RoundsMixin, TrainingMixin, CallCountsMixin, RegistryMixin, EvaluationsMixin,
            LeaseMixin):
    """Repository over the stats store: ``Store(url)``, then ``store.upgrade()`` once.

    Methods (see docs/store.md): runs/rounds/rollouts (``create_run``, ``create_round``,
    ``begin_attempt``, ``complete_rollout``, ``round_progress``, ...), training exchange
    (``ingest_trajectory``, ``round_trajectories``, ``write_planner_outcomes``,
    ``read_planner_outcomes``, ``publish_group_stats``, ``publish_model_stats``,
    ``read_group_stats``,
    ``record_d_counts``, ``d_counts``, ``observed_d``), registry (``record_checkpoint``,
    ``latest_checkpoint``, ``register_agent``, ``heartbeat``, ``list_agents``,
    ``claim_message``, ``record_metrics``, ``metrics``), leases (``acquire_lease``,
    ``release_lease``, ``get_lease``), evaluation jobs (``create_evaluation``,
    ``update_evaluation``, ``get_evaluation``, ``list_evaluations``,
    ``interrupt_orphaned_evaluations``).
    """

    def upgrade(self, revision: str = "head") -> None:
        """``alembic upgrade <revision>`` on this store's database (safe to call repeatedly)."""
        config = alembic_config(self.url)
        with self.engine.begin() as connection:
            if self.dialect == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:id)"),
                                   {"id": _MIGRATION_LOCK_ID})
            config.attributes["connection"] = connection
            command.upgrade(config, revision)

    def current_revision(self) -> str | None:
        """The database's Alembic revision (None before the first upgrade)."""
        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
