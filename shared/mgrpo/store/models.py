"""SQLAlchemy 2 table models of the stats store (docs/store.md, 'Tables').

The store is how decoupled trainers talk: the planner side writes rollouts, outcomes and
trajectories; each trainer reads its own model's trajectories of the attempt that completed
each rollout, publishes its group statistics, and records its checkpoint.

Every natural key is a UNIQUE constraint, so ingestion is ``INSERT ... ON CONFLICT`` and a
redelivered message can never add a second row. Token arrays live in ``trajectories.payload``
(JSON); ``payload_uri`` is reserved for payloads kept outside the database.

What this module does NOT do: queries and transactions (``mgrpo.store.store``), the schema
history (``mgrpo.store.migrations``: every change here needs a new Alembic revision).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

ID = String(200)  # round/query/run ids and trajectory ids are short strings
# BigInteger autoincrement is not a rowid on SQLite; Integer is, and still 64-bit there.
PK = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"
    run_id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    status: Mapped[str] = mapped_column(String(20), default="running")
    config: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Round(Base):
    __tablename__ = "rounds"
    round_id: Mapped[str] = mapped_column(ID, primary_key=True)
    run_id: Mapped[str] = mapped_column(ForeignKey("runs.run_id"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20), default="pending")
    config: Mapped[dict] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[str | None] = mapped_column(Text)
    # the outbox flag: False from creation until all its tasks are on the broker
    # (``mgrpo.services.rounds.publish_unpublished_rounds`` finishes a round left False)
    published: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    __table_args__ = (UniqueConstraint("run_id", "index", name="uq_rounds_run_index"),)


class Query(Base):
    __tablename__ = "queries"
    query_id: Mapped[str] = mapped_column(ID, primary_key=True)
    question: Mapped[str | None] = mapped_column(Text)
    answer: Mapped[str | None] = mapped_column(Text)
    meta: Mapped[dict] = mapped_column(JSON, default=dict)


class Rollout(Base):
    """One of the K rollouts of a query in a round; ``completed_attempt`` is the one that counts."""

    __tablename__ = "rollouts"
    id: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    round_id: Mapped[str] = mapped_column(ForeignKey("rounds.round_id"), index=True)
    query_id: Mapped[str] = mapped_column(ID)
    rollout: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # attempts begun so far
    completed_attempt: Mapped[int | None] = mapped_column(Integer)
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    __table_args__ = (
        UniqueConstraint("round_id", "query_id", "rollout", name="uq_rollouts_key"),)


class PlannerOutcome(Base):
    """The planner side's score of one attempt; sub-agent trainers read ``correct``.

    ``correct`` is r_correct_main (docs/algorithm.md, '1.2 Rewards') for the sub-agents that this
    rollout called.
    """

    __tablename__ = "planner_outcomes"
    id: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    round_id: Mapped[str] = mapped_column(ID, index=True)
    query_id: Mapped[str] = mapped_column(ID)
    rollout: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    format_ok: Mapped[bool] = mapped_column(Boolean)
    correct: Mapped[float] = mapped_column(Float)
    reward: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    __table_args__ = (UniqueConstraint("round_id", "query_id", "rollout", "attempt",
                                       name="uq_planner_outcomes_key"),)


class TrajectoryRow(Base):
    __tablename__ = "trajectories"
    id: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    traj_id: Mapped[str] = mapped_column(String(400))
    attempt: Mapped[int] = mapped_column(Integer)
    round_id: Mapped[str] = mapped_column(ID)
    query_id: Mapped[str] = mapped_column(ID)
    rollout: Mapped[int] = mapped_column(Integer)
    agent: Mapped[str] = mapped_column(String(100))
    model: Mapped[str] = mapped_column(String(100))
    invocation: Mapped[int] = mapped_column(Integer)
    turn: Mapped[int | None] = mapped_column(Integer)
    weights_version: Mapped[int] = mapped_column(Integer)
    n_tokens: Mapped[int] = mapped_column(Integer)
    n_response_tokens: Mapped[int] = mapped_column(Integer)
    format_ok: Mapped[bool] = mapped_column(Boolean)
    payload: Mapped[dict | None] = mapped_column(JSON)  # input_ids, response_mask, ...
    payload_uri: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    __table_args__ = (UniqueConstraint("traj_id", "attempt", name="uq_trajectories_key"),
                      Index("ix_trajectories_round_model", "round_id", "model"))


class GroupStat(Base):
    __tablename__ = "group_stats"
    id: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    round_id: Mapped[str] = mapped_column(ID, index=True)
    model: Mapped[str] = mapped_column(String(100))
    agent: Mapped[str] = mapped_column(String(100))
    group_key: Mapped[str] = mapped_column(String(400))
    n: Mapped[int] = mapped_column(Integer)
    mean: Mapped[float] = mapped_column(Float)
    std: Mapped[float] = mapped_column(Float)
    published_by: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    __table_args__ = (UniqueConstraint("round_id", "model", "agent", "group_key",
                                       name="uq_group_stats_key"),)


class Checkpoint(Base):
    """One written-once checkpoint version of a model IN A RUN: versions are per run, so two
    runs never share (or overwrite) a version; ``sha256`` is the manifest file's."""

    __tablename__ = "checkpoints"
    id: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ID, default="", server_default="")
    model: Mapped[str] = mapped_column(String(100))
    version: Mapped[int] = mapped_column(Integer)
    uri: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    round_id: Mapped[str | None] = mapped_column(ID)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    __table_args__ = (UniqueConstraint("run_id", "model", "version",
                                       name="uq_checkpoints_key"),)


class Agent(Base):
    __tablename__ = "agents"
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    tool: Mapped[str | None] = mapped_column(String(100))
    description: Mapped[str] = mapped_column(Text, default="")
    queue: Mapped[str] = mapped_column(String(200))
    model: Mapped[str] = mapped_column(String(100))
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ProcessedMessage(Base):
    __tablename__ = "processed_messages"
    key: Mapped[str] = mapped_column(String(400), primary_key=True)  # idempotency key
    consumer: Mapped[str] = mapped_column(String(200), default="")
    processed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Metric(Base):
    __tablename__ = "metrics"
    id: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(ID, index=True)
    round_id: Mapped[str] = mapped_column(ID)
    key: Mapped[str] = mapped_column(String(200))
    value: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    __table_args__ = (UniqueConstraint("run_id", "round_id", "key", name="uq_metrics_key"),)


class ObservedD(Base):
    """d_k: how many times ``attempt`` of rollout k called sub-agent type ``agent``.

    Keyed by attempt like trajectories and outcomes: a worker writes d_k BEFORE completing
    the rollout, so a crash in between leaves a row of an attempt that never completes and
    is never read; readers join on ``rollouts.completed_attempt``.
    """

    __tablename__ = "observed_d"
    id: Mapped[int] = mapped_column(PK, primary_key=True, autoincrement=True)
    agent: Mapped[str] = mapped_column(String(100), index=True)
    round_id: Mapped[str] = mapped_column(ID)
    query_id: Mapped[str] = mapped_column(ID)
    rollout: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    d: Mapped[int] = mapped_column(Integer)
    # the answered calls' invocation numbers (d of them); None: only the count was recorded
    invocations: Mapped[list | None] = mapped_column(JSON, nullable=True, default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    __table_args__ = (UniqueConstraint("agent", "round_id", "query_id", "rollout", "attempt",
                                       name="uq_observed_d_key"),)


class Lease(Base):
    """A named lease with an expiry (``mgrpo.store.leases``): e.g. ``trainer:<model>``, so
    that only one trainer process of a model trains at a time."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(ID, primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    acquired_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    renewed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # what keeps the holder from its work (a trainer's full checkpoint disk); None: nothing
    problem: Mapped[str | None] = mapped_column(Text, nullable=True, default=None)


class EvaluationJob(Base):
    """A background evaluation of the planner API (``mgrpo.store.evaluations``): written when
    it starts, as it plays (``played``) and when it ends, so any replica answers for it and a
    restart does not forget it. ``owner`` is the API process that runs it (empty while
    queued)."""

    __tablename__ = "evaluation_jobs"
    evaluation_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    status: Mapped[str] = mapped_column(String(20), index=True)  # queued|running|done|...
    owner: Mapped[str] = mapped_column(String(200))
    request: Mapped[dict] = mapped_column(JSON)
    n_questions: Mapped[int] = mapped_column(Integer)
    played: Mapped[int] = mapped_column(Integer, default=0)
    result: Mapped[dict | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
