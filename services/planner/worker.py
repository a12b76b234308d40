"""Entry point of ``mgrpo serve planner-worker``: episodes from ``planner.episodes`` in
batches, delegations over the bus. Thin: the logic is ``mgrpo.services.planner_worker``."""

from __future__ import annotations

from mgrpo.config import Settings


def main(settings: Settings, batch_size: int = 64) -> None:
    from mgrpo.services.context import load_service_config, make_bus, open_store
    from mgrpo.services.dependencies import worker_needs
    from mgrpo.services.planner_worker import PlannerRuntime, PlannerWorker
    from mgrpo.services.process import serve_until_signal, setup_logging

    setup_logging(settings, "planner-worker")
    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = make_bus(settings, store)
    worker = PlannerWorker(PlannerRuntime.build(settings, cfg, store, bus), batch_size)
    worker.start()
    serve_until_signal(settings, "planner-worker", {
        "mgrpo_planner_episodes_done": lambda: worker.episodes_done,
        "mgrpo_planner_weights_version": lambda: worker.p.runtime.engine.version,
    }, stop=bus.close, bus=bus,  # grpo: the planner runs the tools (python: the sandbox)
        needs=worker_needs(store, settings.sandbox_url if cfg.algorithm == "grpo" else None))
