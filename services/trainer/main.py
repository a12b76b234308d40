"""Entry point of ``mgrpo serve trainer --model M``: one model's trainer (a model with
``trainable: false`` in the run config is frozen: it serves health only). Thin: the logic is
``mgrpo.services.trainer``."""

from __future__ import annotations

from mgrpo.config import Settings


def main(settings: Settings, model: str) -> None:
    from mgrpo.services.context import load_service_config, make_bus, open_store
    from mgrpo.services.process import serve_until_signal, setup_logging
    from mgrpo.services.trainer import TrainerService

    setup_logging(settings, f"trainer-{model}")
    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = make_bus(settings, store)
    trainer = TrainerService(settings, cfg, store, bus, model)
    trainer.start()

    def stop() -> None:
        trainer.stop()
        bus.close()

    serve_until_signal(settings, f"trainer-{model}", {
        "mgrpo_trainer_rounds_trained": lambda: trainer.rounds_trained,
        "mgrpo_trainer_weights_version": lambda: trainer.lm.version if trainer.lm else 0,
        "mgrpo_trainer_lease_held": lambda: float(trainer.lease.held()),
    }, stop=stop, bus=bus)
