"""Embedded mode builds each model's engine from its roles' spec (``engines:``), through the
one registry the services use: a ``module:factory`` user engine samples the round, and the
checkpoint the trainer writes after the step reaches it through its ``load_weights``."""

from __future__ import annotations

import sys

import pytest
import torch
from training_testkit import run_config_dict

from mgrpo.training.config import RunConfig

USER_ENGINE = '''
from mgrpo.engines.torch_engine import TorchEngine
from mgrpo.models import load_model
from mgrpo.models.checkpoint import read_checkpoint_dir

BUILT = []


class UserEngine:
    """Samples with its own torch copy; takes weights only through load_weights."""

    def __init__(self, path, device):
        net, self.tokenizer = load_model(path, device=device)
        self._inner = TorchEngine(net, self.tokenizer, device=device)
        self.version, self.loads, self.generated = 0, [], 0

    def generate(self, requests):
        self.generated += len(requests)
        return self._inner.generate(requests)

    def load_weights(self, source, version):
        self.loads.append((source, version))
        state = read_checkpoint_dir(source)[0]
        self._inner.model.load_state_dict(state, strict=False)
        self.version = self._inner.version = version


def make(path, device):
    engine = UserEngine(path, device)
    BUILT.append(engine)
    return None, engine.tokenizer, engine
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"mgrpo_user_engine_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_a_factory_engine_samples_an_embedded_round_and_gets_the_new_weights(
        tmp_path, tiny_dir, bench_dir, user_module):
    from mgrpo.models.checkpoint import read_checkpoint_dir
    from mgrpo.training.loop import run_training

    cfg = RunConfig.model_validate(run_config_dict(
        tmp_path, tiny_dir, bench_dir, engines={"planner": f"{user_module}:make"},
        stages=[{"stage": 1, "rounds": 1}], eval_questions=1))
    assert run_training(cfg, progress=False).rounds == 1
    (engine,) = sys.modules[user_module].BUILT  # one engine, for the planner's model
    assert engine.generated > 0  # the planner's turns were sampled by the user engine
    assert [version for _, version in engine.loads] == [1]
    source = engine.loads[0][0]  # the checkpoint URI, not the trainer's tensors
    assert isinstance(source, str) and source.rstrip("/").endswith("/planner/v000001")
    trained = read_checkpoint_dir(source)[0]  # the trainer's v1 (tied lm_head left out)
    sampler = engine._inner.model.state_dict()
    assert trained and all(torch.equal(sampler[k], trained[k]) for k in trained)
    assert engine.version == 1


def test_roles_of_one_model_must_name_one_engine(tmp_path, tiny_dir, bench_dir):
    from mgrpo.training.system import model_engines

    raw = run_config_dict(tmp_path, tiny_dir, bench_dir)
    raw["agents"] = {"planner": "shared", "searcher": "shared", "coder": "coder"}
    raw["models"] = {"shared": raw["models"]["planner"], "coder": raw["models"]["coder"]}
    cfg = RunConfig.model_validate({**raw, "engines": {"searcher": "vllm"}})
    with pytest.raises(ValueError, match=r"model 'shared': its roles name different engines "
                                         r"\(\{'planner': 'torch', 'searcher': 'vllm'\}\)"):
        model_engines(cfg)
    cfg = RunConfig.model_validate({**raw, "engines": {"searcher": "vllm", "planner": "vllm"}})
    assert model_engines(cfg) == {"shared": "vllm", "coder": "torch"}
