"""What every service process builds at start: settings, run config, store, bus, queue names,
and the models it serves (loaded from the newest checkpoint the store knows).

The services share ONE run config (``MGRPO_RUN_CONFIG``, a YAML ``RunConfig``); without it
they use the defaults, each model at ``<MGRPO_MODELS_DIR>/<model>``. The store is the source
of truth for weights: a worker asks it for the newest recorded checkpoint of its model
(``refresh_weights``) before each batch, so it never swaps weights mid-episode and never
depends on having heard an announcement.

What this module does NOT do: handle messages (``planner_worker``, ``subagent_worker``,
``trainer``) or HTTP (``api``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgrpo.bus.names import PLANNER_QUEUE, PLANNER_REPLY_QUEUE, subagent_queue, trainer_queue
from mgrpo.config import Settings
from mgrpo.training.config import ModelConfig, RunConfig, load_run_config

log = logging.getLogger(__name__)

DEFAULT_MODELS = ("planner", "searcher", "coder")


def load_service_config(settings: Settings) -> RunConfig:
    """The run config all services share: ``settings.run_config`` or the defaults."""
    if settings.run_config:
        path = Path(settings.run_config)
        if not path.exists():
            raise FileNotFoundError(f"MGRPO_RUN_CONFIG={settings.run_config!r} does not exist; "
                                    "point it at a YAML run config or unset it")
        return load_run_config(path)
    models = {name: ModelConfig(path=str(Path(settings.models_dir) / name))
              for name in DEFAULT_MODELS}
    return RunConfig(models=models)


@dataclass(frozen=True)
class Queues:
    """Work-queue names of one deployment (``settings.queue_prefix`` + the bus names)."""

    prefix: str = ""

    @property
    def episodes(self) -> str:
        return self.prefix + PLANNER_QUEUE

    def replies(self, worker_id: str) -> str:
        return f"{self.prefix}{PLANNER_REPLY_QUEUE}.{worker_id}"

    def trainer(self, model: str) -> str:
        return self.prefix + trainer_queue(model)

    def subagent(self, name: str) -> str:
        return self.prefix + subagent_queue(name)

    @property
    def dead_letter(self) -> str:
        return self.prefix + "mgrpo.dead_letter"


def open_store(settings: Settings):
    from mgrpo.store import Store

    store = Store(settings.database_url)
    store.upgrade()
    return store


def make_bus(settings: Settings, store):
    """KombuBus on RabbitMQ (distributed) or an InMemoryBus (embedded); both dedupe on the
    store."""
    if settings.mode == "distributed":
        from mgrpo.bus.kombu_bus import KombuBus

        return KombuBus(settings.broker_url, store,
                        dead_letter_queue_name=Queues(settings.queue_prefix).dead_letter)
    from mgrpo.bus import InMemoryBus

    return InMemoryBus(store)


def trained_models(round_config: dict) -> list[str]:
    """Models a round trains (written into the round's config by ``start_round``)."""
    return list(round_config.get("trained_models", []))


def load_engine(path: str, device: str, engine: str = "torch") -> tuple[Any, Any, Any]:
    """(model, tokenizer, engine) for a local HF folder. ``engine``: ``torch`` or a
    ``module:factory`` path (``MGRPO_ENGINE``) called as ``factory(path, device)``."""
    if engine != "torch":
        import importlib

        module, _, attr = engine.partition(":")
        if not attr:
            raise ValueError(f"MGRPO_ENGINE={engine!r} must be 'torch' or "
                             "'package.module:factory'")
        return getattr(importlib.import_module(module), attr)(path, device)
    from mgrpo.engines.torch_engine import TorchEngine
    from mgrpo.models import load_model

    model, tokenizer = load_model(path, device=device)
    model.eval()
    return model, tokenizer, TorchEngine(model, tokenizer, device=device)


def refresh_weights(store, engine, model_name: str) -> bool:
    """Load the newest checkpoint the store records for ``model_name`` if it is newer than
    the engine's; True if weights changed. Call between batches, never mid-episode."""
    record = store.latest_checkpoint(model_name)
    if record is None or record.version <= engine.version:
        return False
    engine.load_weights(record.uri, record.version)
    log.info("%s: loaded weights v%d from %s", model_name, record.version, record.uri)
    return True


def build_tool(cfg: RunConfig, tool: str, settings: Settings):
    """The tool of a sub-agent: ``search`` over the benchmark corpus, ``python`` through the
    sandbox service (``MGRPO_SANDBOX_URL``) or an in-process sandbox."""
    from mgrpo.tools import build_tool as registry_build

    if tool == "search":
        from mgrpo.envs import load_benchmark

        return registry_build("search", corpus=load_benchmark(cfg.bench_dir).corpus,
                              **cfg.tools.get("search", {}))
    if tool == "python":
        if settings.sandbox_url:
            from mgrpo.sandbox.client import SandboxClient

            return registry_build("python", executor=SandboxClient(settings.sandbox_url))
        from mgrpo.sandbox.local import LocalSandbox

        return registry_build("python", executor=LocalSandbox())
    return registry_build(tool)
