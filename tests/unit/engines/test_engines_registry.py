"""One engine registry for both modes (``mgrpo.engines.registry``): a spec names its kind, an
unknown spec lists the valid ones, and each kind builds its engine."""

from __future__ import annotations

import pytest

from mgrpo.engines.registry import (
    ENGINES,
    BuiltEngine,
    build_engine,
    engine_kind,
    register_engine,
)
from mgrpo.engines.remote import RemoteEngine
from mgrpo.engines.torch_engine import TorchEngine

VALID = r"use torch, vllm, an http\(s\):// URL \(remote\) or 'package.module:factory'"


@pytest.mark.parametrize(("spec", "kind"), [
    ("torch", "torch"), ("vllm", "vllm"), ("http://vllm-searcher:8001", "remote"),
    ("https://example.org/v1", "remote"), ("my_pkg.engines:make", "factory"),
    ("mod:factory", "factory")])
def test_each_spec_names_its_kind(spec, kind):
    assert engine_kind(spec) == kind


@pytest.mark.parametrize("spec", ["sglang", "", "remote", "factory", "pkg:", ":make",
                                  "pkg.mod:make:x", "a-b:make", "Torch"])
def test_an_unknown_spec_lists_the_valid_ones(spec):
    with pytest.raises(ValueError, match=f"unknown engine {spec!r}: {VALID}"):
        engine_kind(spec)
    with pytest.raises(ValueError, match=VALID):
        build_engine(spec, "unused")


def test_the_run_config_refuses_an_unknown_engine_with_the_valid_ones():
    from pydantic import ValidationError

    from mgrpo.training.config import RunConfig

    with pytest.raises(ValidationError, match=f"engines.planner: unknown engine 'sglang': "
                                              f"{VALID}"):
        RunConfig(agents={"planner": "m"}, models={"m": {"path": "x"}},
                  engines={"planner": "sglang"})


def test_torch_shares_a_given_model_and_loads_one_otherwise(tiny_dir):
    from mgrpo.models import load_model

    model, tok = load_model(tiny_dir)
    built = build_engine("torch", str(tiny_dir), model=model, tokenizer=tok)
    assert built.model is model and built.engine.model is model and built.tokenizer is tok
    loaded, tokenizer, engine = build_engine("torch", str(tiny_dir))
    assert isinstance(engine, TorchEngine) and engine.model is loaded and loaded is not model
    assert tokenizer("hi")["input_ids"]


def test_a_server_refuses_a_lora_model(tiny_dir):
    from mgrpo.models.lora import LoraSpec

    with pytest.raises(ValueError, match="is a server: models.<m>.lora needs the torch or vllm"):
        build_engine("http://127.0.0.1:9", str(tiny_dir), lora=LoraSpec(r=4))
    _, _, engine = build_engine("http://127.0.0.1:9", str(tiny_dir))
    assert isinstance(engine, RemoteEngine)
    engine.close()


def test_a_registered_name_builds_and_taken_names_are_refused(tiny_dir, monkeypatch):
    monkeypatch.setattr(ENGINES, "_entries", dict(ENGINES._entries))  # gone after the test
    calls = []

    def builder(spec, path, device, **kw):
        calls.append((spec, path, device))
        return BuiltEngine(None, None, "engine")

    register_engine("mine", builder)
    assert engine_kind("mine") == "mine"
    assert build_engine("mine", "p", "cpu").engine == "engine"
    assert calls == [("mine", "p", "cpu")]
    register_engine("mine", builder)  # the same again (a module imported twice): fine
    with pytest.raises(ValueError, match="engine 'torch' is already registered"):
        register_engine("torch", builder)
    for form in ("a:b", "http://x", "remote", "factory"):
        with pytest.raises(ValueError, match="is not a plain name"):
            register_engine(form, builder)
