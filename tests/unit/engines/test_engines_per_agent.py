"""The engine of each agent comes from the run config (``engines: {role: torch | vllm | URL |
module:factory}``), with a clear error when the named engine cannot run in the process that
samples (a service worker, or the embedded run)."""

from __future__ import annotations

import importlib.util

import pytest
from pydantic import ValidationError

from mgrpo.config import Settings
from mgrpo.engines.registry import EngineUnavailable, build_engine
from mgrpo.engines.remote import RemoteEngine
from mgrpo.services.context import agent_engine
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
    with pytest.raises(ValidationError, match=r"engines.planner: unknown engine 'sglang': use "
                                              r"torch, vllm"):
        RunConfig(agents=AGENTS, models=MODELS, engines={"planner": "sglang"})


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_engine_without_vllm_is_a_clear_error(tiny_dir):
    with pytest.raises(EngineUnavailable, match=r"engine 'vllm' is not installed in .*"
                                                r"make vllm-venv"):
        build_engine("vllm", str(tiny_dir))


def test_url_engine_is_a_remote_engine_with_the_folders_tokenizer(tiny_dir):
    model, tokenizer, engine = build_engine("http://127.0.0.1:9/", str(tiny_dir))
    assert model is None and isinstance(engine, RemoteEngine)
    assert str(engine.client.base_url).rstrip("/") == "http://127.0.0.1:9"
    assert tokenizer.pad_token_id is not None and tokenizer("hi")["input_ids"]
    engine.close()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_embedded_mode_builds_the_vllm_engine_a_role_names(tiny_dir):
    """Embedded mode asks the registry for the role's engine: without vLLM in this Python that
    is the registry's one-line error, not a refusal of every engine but torch."""
    from mgrpo.training.system import build_system

    cfg = RunConfig(agents=AGENTS, models={"m": {"path": str(tiny_dir)}},
                    engines={"planner": "vllm", "searcher": "vllm"})
    with pytest.raises(EngineUnavailable, match=r"engine 'vllm' is not installed in "):
        build_system(cfg)


def test_refresh_weights_loads_once_per_run_and_source_into_any_engine(tiny_dir, tmp_path):
    """What an engine holds is kept beside it, not set on it: an engine that compares by
    value (a dataclass, unhashable) is refreshed once per (run, source), each engine on its
    own."""
    from dataclasses import dataclass, field

    from mgrpo.services.context import loaded_weights, refresh_weights
    from mgrpo.store import Store

    @dataclass
    class Recorder:
        version: int = 0
        loads: list = field(default_factory=list)

        def generate(self, requests):
            return []

        def load_weights(self, source, version):
            self.loads.append(version)
            self.version = version

    store = Store(f"sqlite:///{tmp_path}/stats.db")
    store.upgrade()
    cfg = RunConfig(agents={"planner": "m"}, models={"m": {"path": str(tiny_dir)}})
    one, two = Recorder(), Recorder()
    assert one == two and loaded_weights(one) is None
    assert refresh_weights(store, one, "m", "run-a", cfg)
    assert not refresh_weights(store, one, "m", "run-a", cfg)  # same run, same source
    assert loaded_weights(one) == ("run-a", str(tiny_dir)) and loaded_weights(two) is None
    assert refresh_weights(store, two, "m", "run-a", cfg)  # another engine: its own load
    assert refresh_weights(store, one, "m", "run-b", cfg)  # another run: loaded again
    assert one.loads == [0, 0] and two.loads == [0]
    assert not hasattr(one, "weights_of")
    store.close()
