"""Engines by spec: the one place an engine is chosen and built, for both modes.

An engine spec is a string (``engines.<role>`` of the run config, ``MGRPO_ENGINE``):

- ``torch``: :class:`~mgrpo.engines.torch_engine.TorchEngine` (transformers, in-process);
- ``vllm``: :class:`~mgrpo.engines.vllm_engine.VLLMEngine` (vLLM's offline ``LLM``; vLLM must
  be installed in this Python);
- an ``http(s)://`` URL: :class:`~mgrpo.engines.remote.RemoteEngine` (an OpenAI-compatible
  server that returns logprobs);
- ``package.module:factory``: a user engine, ``factory(model_path, device)`` returning
  ``(model, tokenizer, engine)``.

:func:`engine_kind` names a spec's kind (a registered name such as ``torch`` or ``vllm``,
``remote``, ``factory``) or raises a ``ValueError`` that lists the valid specs;
:func:`build_engine` builds it. The services build each role's engine with it
(``mgrpo.services.context``), embedded mode each model's
(``mgrpo.training.system.load_models``), and the run config validates its ``engines:`` with
:func:`engine_kind`. The named kinds are a :class:`~mgrpo.registry.Registry`:
``register_engine(name, builder)`` (or as a decorator) adds one, ``get_engine`` and
``engine_names`` look them up; a URL and an import path are spec forms, not names.

A torch engine samples from a torch model that :func:`build_engine` loads (or from the one
passed as ``model=``: embedded mode's trained model, so a weight update is a version bump).
Every other kind keeps its weights to itself and takes new ones through ``load_weights``.

What it does NOT do: load weights of a run (the services' ``refresh_weights`` and embedded
mode's ``sync_sampler`` do), or start a server.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

from mgrpo.models import load_model, load_tokenizer
from mgrpo.models.lora import apply_lora, reset_adapter
from mgrpo.registry import Registry

URL_PREFIXES = ("http://", "https://")
FORM_KINDS = ("remote", "factory")  # the kinds of the spec forms that are not names


class EngineUnavailable(RuntimeError):
    """The engine a spec names cannot run in this process (not installed)."""


class BuiltEngine(NamedTuple):
    """What :func:`build_engine` returns. ``model``: the torch model the engine samples from
    (None when the weights live in the engine: vllm, a server, a factory without one)."""

    model: Any
    tokenizer: Any
    engine: Any


# builder(spec, path, device, lora, model, tokenizer) -> BuiltEngine
Builder = Callable[..., BuiltEngine]
ENGINES: Registry[Builder] = Registry(
    "engine", hint="an engine of your own: register_engine in a module named under `plugins:`, "
                   "or the spec 'package.module:factory'")
get_engine = ENGINES.get
engine_names = ENGINES.names


def register_engine(name: str, builder: Builder | None = None):  # type: ignore[no-untyped-def]
    """Make ``name`` an engine spec built by ``builder(spec, path, device, lora=, model=,
    tokenizer=)`` -> :class:`BuiltEngine`; without ``builder``, a decorator that does. A name
    that reads as a URL or an import path (the other spec forms) is refused."""
    if ":" in name or name.startswith(URL_PREFIXES) or name in FORM_KINDS:
        raise ValueError(f"engine {name!r} is not a plain name: an http(s):// URL is a server "
                         "and 'package.module:factory' a factory")
    return ENGINES.register(name, builder)


def lora_rank_cap(r: int) -> int:
    """vLLM's ``max_lora_rank`` for an adapter of rank ``r``: the smallest power of two
    >= max(r, 8)."""
    cap = 8
    while cap < r:
        cap *= 2
    return cap


def _tokenizer(path: str, tokenizer: Any) -> Any:
    if tokenizer is not None:
        return tokenizer

    return load_tokenizer(path)


@register_engine("torch")
def _torch(spec: str, path: str, device: str, lora: Any = None, model: Any = None,
           tokenizer: Any = None) -> BuiltEngine:
    # here, not at the top: an import circle through mgrpo.engines.torch_engine
    from mgrpo.engines.torch_engine import TorchEngine

    if model is None:
        model, tokenizer = load_model(path, device=device)
        if lora is not None:
            model = apply_lora(model, lora)
            reset_adapter(model)  # the same initial adapter in every process
        model.eval()
    tokenizer = _tokenizer(path, tokenizer)
    return BuiltEngine(model, tokenizer, TorchEngine(model, tokenizer, device=device))


@register_engine("vllm")
def _vllm(spec: str, path: str, device: str, lora: Any = None, model: Any = None,
          tokenizer: Any = None) -> BuiltEngine:
    # here, not at the top: an import circle through mgrpo.engines.vllm_engine
    from mgrpo.engines.vllm_engine import INSTALL_HINT, VLLMEngine

    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailable(f"engine 'vllm' is not installed in {sys.executable}. "
                                f"{INSTALL_HINT}")
    lora_kwargs = ({} if lora is None else
                   {"enable_lora": True, "max_lora_rank": lora_rank_cap(lora.r),
                    "max_loras": VLLM_ADAPTER_SLOTS})
    return BuiltEngine(None, _tokenizer(path, tokenizer), VLLMEngine(path, **lora_kwargs))


# adapters one vLLM instance holds at once: agents on one base (VLLMEngine.adapter_engine)
# up to this many never swap adapters in and out (each slot is r x the layers' widths)
VLLM_ADAPTER_SLOTS = 4


def _remote(spec: str, path: str, device: str, lora: Any = None, model: Any = None,
            tokenizer: Any = None) -> BuiltEngine:
    # here, not at the top: an import circle through mgrpo.engines.remote
    from mgrpo.engines.remote import RemoteEngine

    if lora is not None:
        raise ValueError(f"engine {spec!r} is a server: models.<m>.lora needs the torch or "
                         "vllm engine for every role of that model (a server reloads full "
                         "weights only)")
    return BuiltEngine(None, _tokenizer(path, tokenizer), RemoteEngine(spec))


def _factory(spec: str, path: str, device: str, lora: Any = None, model: Any = None,
             tokenizer: Any = None) -> BuiltEngine:
    """``factory(path, device)`` -> (model, tokenizer, engine); a LoRA model's engine gets
    the adapter checkpoints in ``load_weights`` and must handle them itself."""
    module, _, attr = spec.partition(":")
    built = getattr(importlib.import_module(module), attr)(path, device)
    return BuiltEngine(*built)


_SPEC_FORMS: dict[str, Builder] = {"remote": _remote, "factory": _factory}


def valid_specs() -> str:
    """The engine specs this process takes, in words: the registered names and the two
    spec forms."""
    return f"{', '.join(engine_names())}, an http(s):// URL (remote) or 'package.module:factory'"


def engine_kind(spec: str) -> str:
    """The registry key of ``spec``; a ``ValueError`` listing the valid specs otherwise."""
    if spec.startswith(URL_PREFIXES):
        return "remote"
    if spec in ENGINES:
        return spec
    module, sep, attr = spec.partition(":")
    if sep and module and attr and all(p.isidentifier() for p in module.split(".")) \
            and attr.isidentifier():
        return "factory"
    raise ValueError(f"unknown engine {spec!r}: use {valid_specs()}")


def build_engine(spec: str, path: str, device: str = "cpu", *, lora: Any = None,
                 model: Any = None, tokenizer: Any = None) -> BuiltEngine:
    """The engine ``spec`` names, for the HF folder ``path`` (the tokenizer and, for torch
    and vllm, the initial weights). ``lora`` (a ``LoraSpec``): torch wraps its model in that
    adapter, vllm is built with ``enable_lora``, a server refuses it. ``model`` (and
    ``tokenizer``): an already loaded torch model (already wrapped, for a LoRA model) for a
    torch engine to sample from; the other kinds do not use it."""
    kind = engine_kind(spec)
    builder = _SPEC_FORMS.get(kind) or get_engine(kind)
    return builder(spec, str(path), device, lora=lora, model=model, tokenizer=tokenizer)
