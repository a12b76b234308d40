"""Entry point of ``mgrpo serve subagent --name N --tool T --model PATH``: one tool
sub-agent deployment. Thin: the logic is ``mgrpo.services.subagent_worker``."""

from __future__ import annotations

from mgrpo.config import Settings


def main(settings: Settings, name: str, tool: str, model: str | None = None,
         description: str = "", batch_size: int = 64) -> None:
    from mgrpo.services.context import load_service_config, make_bus, open_store
    from mgrpo.services.dependencies import worker_needs
    from mgrpo.services.process import serve_until_signal, setup_logging
    from mgrpo.services.subagent_worker import SubagentWorker

    setup_logging(settings, f"subagent-{name}")
    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = make_bus(settings, store)
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
