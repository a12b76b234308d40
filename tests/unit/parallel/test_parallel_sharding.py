"""How a trainer of N ranks splits its model (``mgrpo.parallel.sharding.strategy``,
``MGRPO_TRAINER_STRATEGY``): FSDP2 unless told otherwise, DDP for a LoRA model, and a typo
or an unsupported pair refused in one line (by the settings, and by the function itself for
callers that bypass them)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mgrpo.config import Settings
from mgrpo.parallel.sharding import strategy


def test_defaults_and_choices():
    assert strategy(None, lora=False) == "fsdp"
    assert strategy(None, lora=True) == "ddp"
    assert strategy("ddp", lora=False) == "ddp"
    assert strategy("ddp", lora=True) == "ddp"
    assert strategy("fsdp", lora=False) == "fsdp"


def test_typos_and_unsupported_pairs_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^MGRPO_TRAINER_STRATEGY='fsdp2' is not one of "
                                         r"fsdp, ddp$"):
        strategy("fsdp2", lora=False)
    with pytest.raises(ValueError, match="with a LoRA model is not supported; use ddp"):
        strategy("fsdp", lora=True)


def test_settings_read_and_validate_the_env_var(monkeypatch):
    monkeypatch.setenv("MGRPO_TRAINER_STRATEGY", "ddp")
    assert Settings().trainer_strategy == "ddp"
    monkeypatch.delenv("MGRPO_TRAINER_STRATEGY")
    assert Settings().trainer_strategy is None
    monkeypatch.setenv("MGRPO_TRAINER_STRATEGY", "fdsp")
    with pytest.raises(ValidationError, match="trainer_strategy"):
        Settings()


def test_an_update_runs_the_ddp_wrapper_when_the_rank_has_one():
    import torch

    from mgrpo.parallel.sharding import DataParallel

    model, wrapper = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    assert DataParallel().module(model) is model  # one process
    assert DataParallel(1, 2).module(model) is model  # FSDP2: sharded in place
    assert DataParallel(1, 2, wrapper=wrapper).module(model) is wrapper
    assert DataParallel(1, 2, wrapper=wrapper) == DataParallel(1, 2)  # a place, not a model
    assert not DataParallel(1, 2).fsdp(model) and not DataParallel().fsdp(model)
