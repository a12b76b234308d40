"""The trainer's side of a torchrun job (the rank protocol is :mod:`mgrpo.parallel.ranks`):
what a rank does with its model (:func:`trainer_work`), which strategy shards it
(:func:`strategy_for`) and the model a follower rank trains (:func:`follower_model`).

What this module does NOT do: send or follow the commands, shard, or checkpoint
(:mod:`mgrpo.parallel`).
"""

from __future__ import annotations

from mgrpo.engines.registry import build_engine
from mgrpo.parallel.ranks import RankWork
from mgrpo.parallel.sharding import strategy
from mgrpo.services.trainer.weights import TrainedModel, put_state
from mgrpo.training.precision import fresh_optimizer, make_optimizer, prepare_for_training
from mgrpo.training.rounds import local_update


def trainer_work() -> RankWork:
    """The trainer's load (a replica's: :func:`put_state`) and update
    (:func:`mgrpo.training.rounds.local_update`) for :class:`mgrpo.parallel.ranks.Ranks`."""
    return RankWork(put_state=put_state, fresh_optimizer=fresh_optimizer, update=local_update)


def strategy_for(settings, cfg, model: str) -> str:
    """``fsdp`` or ``ddp`` for ``model``'s trainer job (``MGRPO_TRAINER_STRATEGY``; unset:
    fsdp, or ddp for a LoRA model: :func:`mgrpo.parallel.sharding.strategy`)."""
    return strategy(settings.trainer_strategy, lora=cfg.models[model].lora is not None)


def follower_model(settings, cfg, model: str) -> TrainedModel:
    """Ranks > 0: the model (and Adam) a follower trains; its weights come with ``load``."""
    net, tokenizer, engine = build_engine("torch", cfg.models[model].path, settings.device,
                                          lora=cfg.models[model].lora)
    optimizer = make_optimizer(prepare_for_training(net, cfg.models[model]), cfg.models[model])
    return TrainedModel(model, net, tokenizer, engine, optimizer, engine.version)
