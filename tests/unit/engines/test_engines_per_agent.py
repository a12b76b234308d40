"""The engine of each agent comes from the run config (``engines: {role: torch | vllm | URL}``),
with a clear error when the named engine cannot run in the worker's process."""

from __future__ import annotations

import importlib.util

import pytest
from pydantic import ValidationError

from mgrpo.config import Settings
from mgrpo.engines.remote import RemoteEngine
from mgrpo.services.context import EngineUnavailable, agent_engine, load_engine
from mgrpo.training.config import RunConfig

MODELS = {"m": {"path": "x"}}
AGENTS = {"planner": "m", "searcher": "m"}


def test_engines_per_role_are_validated():
    cfg = RunConfig(agents=AGENTS, models=MODELS,
                    engines={"planner": "vllm", "searcher": "http://vllm-searcher:8000"})
    settings = Settings(engine="torch")
    assert agent_engine(cfg, "planner", settings) == "vllm"
    assert agent_engine(cfg, "searcher", settings) == "http://vllm-searcher:8000"
    assert agent_engine(RunConfig(agents=AGENTS, models=MODELS), "planner", settings) == "torch"
    with pytest.raises(ValidationError, match="engines.coder: not a role of `agents`"):
        RunConfig(agents=AGENTS, models=MODELS, engines={"coder": "torch"})
    with pytest.raises(ValidationError, match=r"engines.planner='sglang': use torch, vllm"):
        RunConfig(agents=AGENTS, models=MODELS, engines={"planner": "sglang"})


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_engine_without_vllm_is_a_clear_error(tiny_dir):
    with pytest.raises(EngineUnavailable, match=r"engine 'vllm' is not installed in .*"
                                                r"make vllm-venv"):
        load_engine(str(tiny_dir), "cpu", "vllm")


def test_url_engine_is_a_remote_engine_with_the_folders_tokenizer(tiny_dir):
    model, tokenizer, engine = load_engine(str(tiny_dir), "cpu", "http://127.0.0.1:9/")
    assert model is None and isinstance(engine, RemoteEngine)
    assert str(engine.client.base_url).rstrip("/") == "http://127.0.0.1:9"
    assert tokenizer.pad_token_id is not None and tokenizer("hi")["input_ids"]
    engine.close()


def test_embedded_mode_refuses_a_non_torch_engine():
    from mgrpo.training.system import build_system

    cfg = RunConfig(agents=AGENTS, models=MODELS, engines={"planner": "vllm"})
    with pytest.raises(ValueError, match="embedded mode samples with the torch engine only"):
        build_system(cfg)
