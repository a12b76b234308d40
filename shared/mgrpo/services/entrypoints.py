"""The service processes' entry points: what ``mgrpo serve <service>`` runs and what each
container shell (``services/<name>/``) calls. Each builds its service from settings and the
shared run config, starts it, and serves health and metrics until a signal.

- :func:`serve_api`: the planner's REST API (uvicorn over ``mgrpo.services.api.app``); with
  ``MGRPO_EVALUATION_QUEUE`` also the Celery worker of ``mgrpo.evaluations`` in the same
  process, on a thread (``mgrpo.services.api.evaluation_worker``).
- :func:`serve_planner_worker`: episodes from ``planner.episodes`` in batches
  (``mgrpo.services.planner.worker``).
- :func:`serve_subagent`: one tool sub-agent (``mgrpo.services.subagent.worker``).
- :func:`serve_trainer`: one model's trainer (``mgrpo.services.trainer.service``); under
  ``torchrun`` with ``WORLD_SIZE`` > 1 one rank of a data-parallel trainer job: rank 0 is the
  service, the other ranks follow it (``mgrpo.parallel.ranks``; FSDP2 or DDP:
  ``MGRPO_TRAINER_STRATEGY``). A model with ``trainable: false`` is frozen: it scores only.
- :func:`serve_control`: the control plane's Celery worker (``mgrpo.services.control``):
  checkpoint pruning, dead-letter replays and round commands from ``mgrpo.control``, one task
  at a time (the solo pool, prefetch 1: control tasks are rare and each is a whole job; more
  replicas compete for the queue). Celery owns the main thread and its signals: SIGTERM is a
  warm shutdown (the running task ends, then the process).

What this module does NOT do: parse command lines (``mgrpo.cli.serve``) or hold any service
logic (the modules named above).
"""

from __future__ import annotations

import logging

import uvicorn
from prometheus_client import CollectorRegistry, Gauge

from mgrpo.bus.app import control_app, worker_name
from mgrpo.config import Settings
from mgrpo.parallel.ranks import Ranks, world_size
from mgrpo.services.api.app import create_app
from mgrpo.services.api.routes.health import embedded_problem
from mgrpo.services.context import Queues, load_service_config, make_bus, open_store
from mgrpo.services.control.sweep import start_round_sweep
from mgrpo.services.control.tasks import HANDLERS, ControlContext, register_control_tasks
from mgrpo.services.dependencies import worker_needs
from mgrpo.services.health import serve_health
from mgrpo.services.planner.team import TeamWorker
from mgrpo.services.planner.worker import PlannerRuntime, PlannerWorker
from mgrpo.services.process import serve_until_signal, setup_logging
from mgrpo.services.subagent.role import RoleWorker
from mgrpo.services.subagent.worker import SubagentWorker
from mgrpo.services.team import is_team
from mgrpo.services.trainer.ranks import follower_model, strategy_for, trainer_work
from mgrpo.services.trainer.service import TrainerService
from mgrpo.web.server import server_options


def serve_api(settings: Settings, host: str, port: int) -> None:
    setup_logging(settings, "planner")
    if (problem := embedded_problem(settings)) is not None:
        logging.getLogger("mgrpo.planner").warning(problem)
    uvicorn.run(create_app(settings=settings), **server_options(
        host=host, port=port, log_level=settings.log_level.lower(), log_config=None))  # ours


def serve_planner_worker(settings: Settings, batch_size: int = 64) -> None:
    setup_logging(settings, "planner-worker")
    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = make_bus(settings, store)
    if is_team(cfg):  # a turn team: the coordinator (mgrpo.services.planner.team)
        team = TeamWorker(settings, cfg, store, bus, batch_size)
        team.start()
        serve_until_signal(settings, "planner-worker", {
            "mgrpo_planner_episodes_done": lambda: team.episodes_done,
        }, stop=bus.close, bus=bus, needs=worker_needs(store, settings.sandbox_url))
        return
    worker = PlannerWorker(PlannerRuntime.build(settings, cfg, store, bus), batch_size)
    worker.start()
    serve_until_signal(settings, "planner-worker", {
        "mgrpo_planner_episodes_done": lambda: worker.episodes_done,
        "mgrpo_planner_weights_version": lambda: worker.p.runtime.engine.version,
    }, stop=bus.close, bus=bus,  # the planner runs the tools of the roles it plays inline
        needs=worker_needs(store, settings.sandbox_url if cfg.algo.inline_roles(cfg.agents)
                           else None))


def serve_subagent(settings: Settings, name: str, tool: str, model: str | None = None,
                   description: str = "", batch_size: int = 64) -> None:
    setup_logging(settings, f"subagent-{name}")
    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = make_bus(settings, store)
    if is_team(cfg):  # a turn team's role: samples its turns (mgrpo.services.subagent.role)
        role = RoleWorker(settings, cfg, store, bus, name, batch_size, model_path=model)
        role.start()
        serve_until_signal(settings, f"subagent-{name}", {
            "mgrpo_subagent_calls_done": lambda: role.calls_done,
            "mgrpo_subagent_weights_version": lambda: role.engine.version,
        }, stop=bus.close, bus=bus, needs=worker_needs(store, None))
        return
    if not tool and not cfg.delegation.get(name):  # a sub-agent that delegates needs none
        raise ValueError(f"sub-agent {name!r} needs --tool (search, python, ...)")
    worker = SubagentWorker(settings, cfg, store, bus, name, tool, model, description,
                            batch_size=batch_size)
    worker.start()

    def stop() -> None:
        worker.stop()
        bus.close()

    serve_until_signal(settings, f"subagent-{name}", {
        "mgrpo_subagent_calls_done": lambda: worker.calls_done,
        "mgrpo_subagent_weights_version": lambda: worker.runtime.engine.version,
    }, stop=stop, bus=bus,
        needs=worker_needs(store, settings.sandbox_url if tool == "python" else None))


def serve_trainer(settings: Settings, model: str) -> None:
    ranks = None
    if world_size() > 1:
        ranks = Ranks(settings.device, trainer_work())
        settings = settings.model_copy(update={"device": ranks.device})
    if ranks is not None and ranks.rank > 0:
        setup_logging(settings, f"trainer-{model}-rank{ranks.rank}")
        cfg = load_service_config(settings)
        lm = follower_model(settings, cfg, model)
        ranks.wrap(lm.model, strategy_for(settings, cfg, model))
        ranks.follow(lm)
        return
    setup_logging(settings, f"trainer-{model}")
    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = make_bus(settings, store)
    trainer = TrainerService(settings, cfg, store, bus, model)
    if ranks is not None:
        trainer.load()
        ranks.wrap(trainer.lm.model, strategy_for(settings, cfg, model))
        ranks.lead(trainer.lm)
    trainer.start()

    def stop() -> None:
        trainer.stop()
        if ranks is not None:
            ranks.stop()
        bus.close()

    serve_until_signal(settings, f"trainer-{model}", {
        "mgrpo_trainer_rounds_trained": lambda: trainer.rounds_trained,
        "mgrpo_trainer_weights_version": lambda: trainer.lm.version if trainer.lm else 0,
        "mgrpo_trainer_lease_held": lambda: float(trainer.lease.held()),
        "mgrpo_trainer_ranks": lambda: float(ranks.world if ranks else 1),
    }, stop=stop, bus=bus, needs=trainer.not_ready)


def serve_control(settings: Settings) -> None:
    setup_logging(settings, "control")
    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = make_bus(settings, store)
    ctx = ControlContext(settings, store, bus, cfg, Queues(settings.queue_prefix))
    app = control_app(settings)
    register_control_tasks(app, ctx)
    worker = app.Worker(pool="solo", concurrency=1, queues=[app.conf.mgrpo_control_queue],
                        hostname=worker_name("control"),
                        loglevel=settings.log_level.upper(), without_mingle=True,
                        without_gossip=True, optimization="fair")
    registry = CollectorRegistry()
    for name in HANDLERS:
        Gauge(f"mgrpo_control_{name.rsplit('.', 1)[-1]}_done", f"{name} tasks run to the end",
              registry=registry).set_function(lambda name=name: ctx.done.get(name, 0))
    server = serve_health(settings.health_port, registry, alive=lambda: True,
                          info=lambda: {"service": "control"}, not_ready=worker_needs(store))
    sweep = start_round_sweep(ctx)  # rounds whose creator died before publishing
    try:
        worker.start()  # blocks until a signal (warm shutdown)
    finally:
        sweep.set()
        server.shutdown()
        bus.close()
        store.close()
