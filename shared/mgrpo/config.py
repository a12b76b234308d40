"""Process settings: one pydantic-settings class, read from env vars (prefix ``MGRPO_``).

Built by the cached :func:`get_settings`, never at import time, so tests can override the
environment and call ``get_settings.cache_clear()``. Training hyper-parameters do not live
here: they are in the YAML run config (``mgrpo.training.config``).

Secrets can also come as files: with ``MGRPO_SECRETS_DIR`` set, a file named like the env var
(``MGRPO_DATABASE_URL``, ``MGRPO_BROKER_URL``, ``MGRPO_API_TOKEN`` ...) in that folder gives
the value, so a Kubernetes Secret can be mounted as a volume instead of exposed as env vars.
An env var wins over a file of the same name.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Literal

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MGRPO_", env_file=None, extra="ignore")

    mode: Literal["embedded", "distributed"] = Field(
        "embedded", description="embedded: one process, in-memory bus, SQLite. "
        "distributed: RabbitMQ + PostgreSQL, one process per service.")
    database_url: str = Field(
        "sqlite:///runs/mgrpo.db",
        description="SQLAlchemy URL of the stats store, e.g. "
        "postgresql+psycopg://postgres@127.0.0.1:5432/mgrpo")
    broker_url: str = Field("amqp://guest:guest@127.0.0.1:5672//",
                            description="Celery broker (RabbitMQ) URL.")
    checkpoint_uri: str = Field("runs/checkpoints",
                                description="fsspec URI of the checkpoint root.")
    models_dir: str = Field("runs/models", description="Local folder of initial model weights.")
    sandbox_url: str | None = Field(
        None, description="Sandbox service URL. Unset: code runs in an in-process sandbox.")
    api_token: str | None = Field(
        None, description="Bearer token required on mutating REST endpoints. Unset: "
        "mutating endpoints refuse every call (403) in distributed mode.")
    health_port: int = Field(9100, description="Health/metrics port of worker services.")
    plugins: str = Field(
        "", description="Comma-separated Python modules `mgrpo` imports before any command or "
        "service builds anything (your tools and verifiers; mgrpo.plugins), besides the run "
        "config's `plugins:`.")
    consumer_grace_s: float = Field(
        30.0, ge=0, description="How long a worker's (or the planner API's) bus consumer may "
        "be disconnected (reconnecting after a broker restart) before its /healthz says 503; "
        "/readyz says 503 at once.")
    round_needs_workers: bool = Field(
        True, description="POST /v1/rounds (distributed mode) refuses a round with 409 while "
        "a role it needs has no live worker in the store: a sub-agent with no heartbeat "
        "within 30 s, a trained model whose trainer holds no lease or reports that it "
        "cannot finish a round (a full checkpoint disk). False: the round is "
        "created anyway and its tasks wait in the queues for workers that start later.")
    trainer_heartbeat_s: float = Field(
        15.0, gt=0, description="AMQP heartbeat of a trainer's ingest consumer: a trainer "
        "that hangs without dying (SIGSTOP, a stuck kernel call) keeps its prefetched "
        "trajectories (up to 256) until the broker misses ~2 heartbeats and requeues them for "
        "the standby. Its handler is one store transaction, so it can be short; the workers "
        "keep 120 s (a batched generation runs between heartbeats).")
    handler_deadline_s: float = Field(
        120.0, gt=0, description="How long a planner or sub-agent worker's batch handler may "
        "run before it counts as hung: its consumer connection is then closed, so the broker "
        "redelivers the batch to another worker at once (instead of after ~2 missed 120 s AMQP "
        "heartbeats, about 4 minutes), and the worker's /readyz (at once) and /healthz (after "
        "MGRPO_CONSUMER_GRACE_S) say 503. A batch must end well within it (it cannot outlast "
        "~240 s anyway: its heartbeats wait for it).")
    trainer_lease_s: float = Field(
        30.0, gt=0, description="Expiry of a trainer's lease on its model (one active trainer "
        "per model): renewed every third of it; a second trainer of the model waits, and "
        "takes over at its next try (every third of it) once the first one released the lease "
        "(a clean stop), or once the lease expired (the first one died).")
    trainer_nproc: int = Field(
        1, ge=1, description="Ranks of a trainer on this node: `mgrpo serve trainer` with N > "
        "1 starts itself under `torchrun --standalone --nproc-per-node N` (data-parallel, "
        "one rank per GPU: set it to the GPUs of the pod). Ignored inside a torchrun job.")
    trainer_strategy: Literal["fsdp", "ddp"] | None = Field(
        None, description="How a trainer of N > 1 ranks splits its model: fsdp (FSDP2 "
        "fully_shard: parameters, gradients and Adam state sharded over the ranks) or ddp "
        "(a whole replica per rank). Unset: fsdp, or ddp for a LoRA model.")
    tensorboard_dir: str | None = Field(
        None, description="Trainer services also write TensorBoard events of each trained "
        "round to <dir>/<run_id>/<model>/ (step = round index). Unset: store only.")
    device: str = Field("cpu", description="torch device for models: cpu, cuda, cuda:1 ...")
    log_level: str = "INFO"
    run_config: str | None = Field(
        None, description="YAML run config (mgrpo.training.config.RunConfig) the services "
        "share: agents -> models, k, rewards, sampling, bench_dir. Unset: the defaults, with "
        "each model at <models_dir>/<model>.")
    engine: str = Field(
        "torch", description="Inference engine of the agent workers (the run config's "
        "engines.<role> overrides it per role): torch (TorchEngine), vllm (VLLMEngine, needs "
        "vLLM in the worker's Python), an http(s):// URL of an OpenAI-compatible server "
        "(RemoteEngine), or 'package.module:factory' with factory(model_path, device) -> "
        "(model, tokenizer, engine) for a custom engine (a scripted test policy).")
    max_body_bytes: int = Field(
        1_048_576, ge=1024, description="Largest request body the REST API accepts; a larger "
        "one gets 413 before it is read and before the token is checked.")
    max_queries_in_flight: int = Field(
        16, ge=1, le=4096, description="POST /v1/queries admitted at once (playing + "
        "waiting); the next one gets 429 with Retry-After.")
    query_batch_size: int = Field(
        8, ge=1, le=256, description="Waiting queries played together as one batched run "
        "of the planner.")
    queue_prefix: str = Field(
        "", description="Prefix of every work queue name (e.g. 'staging.'): several "
        "deployments (or tests) can share one RabbitMQ. Empty in production.")
    control_prune: bool = Field(
        False, description="Trainers send their keep_checkpoints pruning to the control "
        "worker (`mgrpo serve control`, task mgrpo.control.prune_checkpoints) instead of "
        "deleting old checkpoints themselves after each save. Set it where a control worker "
        "runs (compose, k8s): the deletion leaves the trainer's path, and runs when the "
        "worker is back if it is down.")
    evaluation_queue: bool = Field(
        False, description="The planner API sends each evaluation (POST /v1/evaluations) "
        "as the Celery task mgrpo.control.evaluate to <prefix>mgrpo.evaluations, and "
        "consumes that queue with a Celery worker in its own process, which plays it on the "
        "model the API holds (mgrpo.services.api.evaluation_worker). Off: the API process "
        "that answers the POST plays it. Needs MGRPO_BROKER_URL.")
    secrets_dir: str | None = Field(
        None, description="Folder of secret files named like the env vars (MGRPO_DATABASE_URL "
        "...), e.g. a mounted Kubernetes Secret. Env vars win over files.")

    @classmethod
    def settings_customise_sources(
            cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """init > env > .env > files in ``MGRPO_SECRETS_DIR`` (read when the object is built)."""
        secrets_dir = os.environ.get("MGRPO_SECRETS_DIR")
        if secrets_dir:
            file_secret_settings = SecretsSettingsSource(settings_cls, secrets_dir=secrets_dir)
        return init_settings, env_settings, dotenv_settings, file_secret_settings


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
