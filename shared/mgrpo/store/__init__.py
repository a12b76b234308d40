"""The stats store (SQLAlchemy 2 + Alembic): how decoupled trainers exchange rewards and
group statistics. ``Store(url).upgrade()`` then the methods in docs/store.md."""

from mgrpo.store.errors import is_transient_db_error  # registers them as transient
from mgrpo.store.records import (
    AgentRecord,
    CheckpointRecord,
    DCount,
    EvaluationJobRecord,
    GroupStatIn,
    GroupStatRecord,
    LeaseRecord,
    PlannerOutcomeIn,
    PlannerOutcomeRecord,
    QueryRecord,
    RolloutRecord,
    RoundProgress,
    RoundRecord,
    RunRecord,
)
from mgrpo.store.store import Store

__all__ = [
    "AgentRecord", "CheckpointRecord", "DCount", "EvaluationJobRecord", "GroupStatIn",
    "GroupStatRecord", "LeaseRecord",
    "PlannerOutcomeIn", "PlannerOutcomeRecord", "QueryRecord", "RolloutRecord",
    "RoundProgress", "RoundRecord", "RunRecord", "Store", "is_transient_db_error",
]
