"""Build the run's r_expert judges (``mgrpo.envs.judges``) from the run config's ``judges:``.

One builder for both modes: embedded mode passes the engines of every model it has loaded,
a trainer service passes its own model's engine. An llm judge uses, in this order: the server
at ``url`` (any OpenAI-compatible completions server, e.g. vLLM: whatever weights it serves),
an engine already loaded in this process for ``model`` (an agent's model: its current
weights, shared with sampling), or ``models.<model>.path`` loaded here with a torch engine.
Several roles judged by the same model share one engine.

One behaviour in both modes: a judge on a model the run trains judges with that model's
current weights. Embedded mode holds every model; a distributed trainer or worker that does
not hold it calls :func:`refresh_judge_weights` before each round, which loads the model's
latest checkpoint of the run into the judge's engine (full-weight checkpoints; a LoRA
adapter checkpoint loads into the base model's adapter only when the judge model has one).
A judge model no agent uses stays at its ``path`` (frozen).

What this module does not do: score (``mgrpo.training.scoring``) or update judge weights.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from mgrpo.engines.torch_engine import TorchEngine
from mgrpo.envs.judges import (
    DEFAULT_EXPERT_PROMPT,
    ExpertJudges,
    LLMExpertJudge,
    RuleVerdicts,
    build_judge,
)
from mgrpo.envs.rewards import DEFAULT_JUDGE_PROMPT, RuleExpertJudge
from mgrpo.envs.verifiers import GuardedVerifier, build_verifier
from mgrpo.models import load_model, load_tokenizer
from mgrpo.training.config import JudgeConfig, LLMVerifierConfig, RunConfig

log = logging.getLogger(__name__)
_LOAD_LOCK = threading.Lock()


def _judge_engine(cfg: RunConfig, judge: JudgeConfig | LLMVerifierConfig,
                  engines: dict[str, tuple[Any, Any]], device: str) -> tuple[Any, Any]:
    path = cfg.models[judge.model].path
    if judge.url:
        # on use: keeps httpx out of this module's import
        from mgrpo.engines.remote import RemoteEngine

        return RemoteEngine(judge.url, model=judge.model), load_tokenizer(path)
    if judge.model in engines:
        return engines[judge.model]

    with _LOAD_LOCK:  # from_pretrained is not thread-safe (trainers share a process in tests)
        model, tokenizer = load_model(path, device=device)
    log.info("r_expert judge: loaded model %r from %s in this process (frozen)", judge.model,
             path)
    return TorchEngine(model, tokenizer, device=device), tokenizer


def build_expert_judges(cfg: RunConfig, bench: Any,
                        engines: dict[str, tuple[Any, Any]] | None = None,
                        device: str = "cpu", roles: list[str] | None = None) -> ExpertJudges:
    """``engines``: model name -> (engine, tokenizer) already loaded in this process.
    ``roles``: build llm judges only for these (a trainer: the roles of its model), so a
    process never loads a judge model it will not use."""
    loaded: dict[tuple[str | None, str | None], tuple[Any, Any]] = {}
    by_role: dict[str, LLMExpertJudge] = {}
    own: dict[str, Any] = {}
    for role, judge in cfg.judges.items():
        if roles is not None and role not in roles or judge.kind == "rule":
            continue
        if judge.kind != "llm":  # checked when the config was validated
            by_role[role] = build_judge(judge.kind)
            continue
        key = (judge.model, judge.url)
        if key not in loaded:
            loaded[key] = _judge_engine(cfg, judge, engines or {}, device)
            if not judge.url and judge.model not in (engines or {}):
                own[judge.model] = loaded[key][0]
        engine, tokenizer = loaded[key]
        by_role[role] = build_judge("llm", engine=engine,
                                    prompt_path=judge.prompt or DEFAULT_EXPERT_PROMPT,
                                    tokenizer=tokenizer, max_new_tokens=judge.max_new_tokens,
                                    max_result_chars=judge.max_result_chars)
    judges = ExpertJudges(RuleVerdicts(RuleExpertJudge(bench)), by_role)
    judges.own_engines = own
    return judges


def refresh_judge_weights(judges: ExpertJudges, cfg: RunConfig, latest) -> list[str]:
    """Bring each judge engine this process loaded for a model the run trains to that
    model's newest checkpoint: ``latest(model)`` gives ``(uri, version)`` or None (none yet:
    the starting weights stay). Returns the models reloaded."""
    trained = set(cfg.trained_models())
    done = []
    for model, engine in getattr(judges, "own_engines", {}).items():
        found = latest(model) if model in trained else None
        if found is not None and found[1] != getattr(engine, "version", None):
            engine.load_weights(found[0], found[1])
            log.info("r_expert judge: model %r at its checkpoint v%d", model, found[1])
            done.append(model)
    return done


def verifier_for_run(cfg: RunConfig, engines: dict[str, tuple[Any, Any]] | None = None,
                     device: str = "cpu") -> GuardedVerifier:
    """The run's r_correct verifier (``verifier:``), guarded (``mgrpo.envs.verifiers``): the
    same in embedded mode, the planner worker and evaluation jobs. ``llm`` takes its engine
    as an llm judge does (``verifier_llm``: url, an engine loaded here, or the model loaded
    frozen)."""
    if cfg.verifier != "llm":
        return GuardedVerifier(build_verifier(cfg.verifier), cfg.verifier)
    spec = cfg.verifier_llm
    engine, tokenizer = _judge_engine(cfg, spec, engines or {}, device)
    return GuardedVerifier(build_verifier("llm", engine=engine,
                                          prompt_path=spec.prompt or DEFAULT_JUDGE_PROMPT,
                                          tokenizer=tokenizer,
                                          max_new_tokens=spec.max_new_tokens), "llm")
