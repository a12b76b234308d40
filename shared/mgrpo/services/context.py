"""What every service process builds at start: settings, run config, store, bus, queue names,
and the models it serves (loaded from the newest checkpoint the store knows).

The services share ONE run config (``MGRPO_RUN_CONFIG``, a YAML ``RunConfig``); without it
they use the defaults, each model at ``<MGRPO_MODELS_DIR>/<model>``. The store is the source
of truth for weights: a worker asks it for the newest recorded checkpoint of its model IN THE
RUN of the work at hand (``refresh_weights``) before each batch, so it never swaps weights
mid-episode, never samples from another run's weights, and never depends on having heard an
announcement.

What this module does NOT do: handle messages (``planner.worker``, ``subagent.worker``,
``trainer``) or HTTP (``api``).
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from pathlib import Path

from mgrpo.bus import InMemoryBus
from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.names import PLANNER_QUEUE, PLANNER_REPLY_QUEUE, subagent_queue, trainer_queue
from mgrpo.config import Settings
from mgrpo.models.loading import folder_weights
from mgrpo.sandbox.client import SandboxClient
from mgrpo.store import Store
from mgrpo.tools import build_configured_tool
from mgrpo.training.config import ModelConfig, RunConfig
from mgrpo.training.config_files import load_run_config
from mgrpo.training.round_spec import RoundSpec, run_config_of
from mgrpo.training.system import tool_resources
from mgrpo.workflows import refuse_outside_services

log = logging.getLogger(__name__)

DEFAULT_MODELS = ("planner", "searcher", "coder")


def load_service_config(settings: Settings) -> RunConfig:
    """The run config all services share: ``settings.run_config`` or the defaults."""
    if settings.run_config:
        path = Path(settings.run_config)
        if not path.exists():
            raise FileNotFoundError(f"MGRPO_RUN_CONFIG={settings.run_config!r} does not exist; "
                                    "point it at a YAML run config or unset it")
        cfg = load_run_config(path)
        refuse_outside_services(cfg)
        return cfg
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
    store = Store(settings.database_url)
    store.upgrade()
    return store


def make_bus(settings: Settings, store):
    """KombuBus on RabbitMQ (distributed) or an InMemoryBus (embedded); both dedupe on the
    store."""
    if settings.mode == "distributed":
        return KombuBus(settings.broker_url, store,
                        dead_letter_queue_name=Queues(settings.queue_prefix).dead_letter)
    return InMemoryBus(store)


def round_spec(record, default: RunConfig | None = None) -> RoundSpec | None:
    """The :class:`RoundSpec` of a stored round ``record`` (None for None): the one place a
    round's config is parsed as it leaves the store. A round stored without a run config
    takes ``default``'s settings (None when there is no default either)."""
    if record is None:
        return None
    return RoundSpec.from_stored(record.config, default)


def stored_run_config(store, run_id: str) -> RunConfig | None:
    """The run config ``run_id`` was created with; None when the store holds no such run or
    it was created without one."""
    return run_config_of(store.get_run(run_id))


def agent_engine(cfg: RunConfig, role: str, settings: Settings) -> str:
    """The engine of ``role``: the run config's ``engines.<role>``, else ``MGRPO_ENGINE``."""
    return cfg.engines.get(role, settings.engine)


def initial_weights(store, model_name: str, cfg: RunConfig | None) -> str:
    """Where a run starts, before its first checkpoint of ``model_name``: the checkpoint
    ``cfg.init_from`` names (another run's: never implicit), else the model's own folder
    (``models.<m>.path``). Returns that checkpoint's URI or the folder's path; cheap (a store
    lookup), nothing is loaded."""
    init = cfg.init_from if cfg is not None else None
    if init is not None:
        record = (store.get_checkpoint(model_name, init.version, run_id=init.run_id)
                  if init.version else
                  store.latest_checkpoint(model_name, run_id=init.run_id))
        if record is not None:
            return record.uri
        if init.version:
            raise ValueError(f"init_from names {model_name} v{init.version} of run "
                             f"{init.run_id!r}, which the store does not record; list "
                             "them with GET /v1/checkpoints?run_id=...")
    model = cfg.models.get(model_name) if cfg is not None else None
    path = model.path if model is not None else None
    if not path:
        raise ValueError(f"the config of this run has no models.{model_name}.path to start "
                         "from")
    return path


# id(engine) -> (the engine, weakly; the (run id, checkpoint source) refresh_weights last put
# in it). By identity, so any engine object works (one with __eq__ and no __hash__ too).
_LOADED: dict[int, tuple[weakref.ref, tuple[str, str]]] = {}


def loaded_weights(engine) -> tuple[str, str] | None:
    """The (run id, source) :func:`refresh_weights` last put in ``engine``; None if none."""
    entry = _LOADED.get(id(engine))
    return entry[1] if entry is not None and entry[0]() is engine else None


def refresh_weights(store, engine, model_name: str, run_id: str,
                    cfg: RunConfig | None = None) -> bool:
    """Put ``run_id``'s newest recorded checkpoint of ``model_name`` in the engine (or, before
    the run has one, its :func:`initial_weights`); True if the weights changed. Weights of
    another run are never used unless this run's ``init_from`` names them. Call between
    batches, never mid-episode. :func:`loaded_weights` says what an engine holds."""
    record = store.latest_checkpoint(model_name, run_id=run_id)
    if record is not None:
        source, version = record.uri, record.version
    else:
        if cfg is None:
            cfg = stored_run_config(store, run_id)
        source, version = initial_weights(store, model_name, cfg), 0
    key = (run_id, source)
    if loaded_weights(engine) == key:
        return False
    by_reference = getattr(engine, "loads_by_reference", False)  # a server reads the folder
    engine.load_weights(folder_weights(source) if version == 0 and not by_reference
                        else source, version)
    _LOADED[id(engine)] = (weakref.ref(engine), key)
    log.info("%s: run %s samples from v%d (%s)", model_name, run_id, version, source)
    return True


def tool_for_run(cfg: RunConfig, tool: str, settings: Settings):
    """The tool of a sub-agent, from the run config's ``tools:`` as in embedded mode
    (``mgrpo.tools.build_configured_tool``): a tool that asks for an ``executor`` gets the
    sandbox service (``MGRPO_SANDBOX_URL``) or an in-process sandbox."""
    sandbox = None
    if settings.sandbox_url:
        sandbox = SandboxClient(settings.sandbox_url)
    return build_configured_tool(tool, cfg.tools, tool_resources(cfg.bench_dir, sandbox))
