"""Entry point of ``mgrpo serve trainer --model M``: one model's trainer (a model with
``trainable: false`` in the run config is frozen: it serves health only). Under ``torchrun``
with ``WORLD_SIZE`` > 1 it is one rank of a data-parallel trainer job: rank 0 is the service,
the other ranks follow it (``mgrpo.services.trainer_ranks``; FSDP2 or DDP:
``MGRPO_TRAINER_STRATEGY``). Thin: the logic is
``mgrpo.services.trainer``."""

from __future__ import annotations

from mgrpo.config import Settings


def main(settings: Settings, model: str) -> None:
    from mgrpo.services.context import load_service_config, make_bus, open_store
    from mgrpo.services.process import serve_until_signal, setup_logging
    from mgrpo.services.trainer import TrainerService
    from mgrpo.services.trainer_ranks import (
        Ranks,
        follower_model,
        strategy_for,
        world_size,
    )

    ranks = None
    if world_size() > 1:
        ranks = Ranks(settings.device)
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
