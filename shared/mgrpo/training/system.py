"""Assemble a runnable multi-agent system from a run config: models, engines, tools, runner.

Embedded mode builds everything in this process; every model is loaded once. With the torch
engine (the default) it is shared by its engine (sampling) and its trainer (updates), so
"weight sync" is a version bump (a LoRA model, ``models.<m>.lora``, is the same peft model in
both: the engine samples through the adapter being trained; LoRA models on one base folder
share its frozen weights, ``models.<m>.share_base``). Any other engine a role names
(``engines:``: vllm, a server URL, ``module:factory``; :mod:`mgrpo.engines.registry`) keeps
its own weights and loads each checkpoint the trainer writes. The services build the same
pieces, one model per process."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mgrpo.engines.registry import build_engine
from mgrpo.envs import load_benchmark
from mgrpo.envs import protocol as P
from mgrpo.envs.turn_formats import build_turn_format
from mgrpo.models import load_model
from mgrpo.models.lora import apply_lora
from mgrpo.models.shared_base import share_frozen_base
from mgrpo.sandbox.local import LocalSandbox
from mgrpo.tools import build_configured_tool
from mgrpo.tools.registry import ROLE_TOOLS
from mgrpo.training.config import RunConfig
from mgrpo.training.episodes import AgentRuntime, EpisodeRunner
from mgrpo.training.judging import build_expert_judges, verifier_for_run
from mgrpo.training.precision import make_optimizer, prepare_for_training
from mgrpo.training.subagents import LocalSubagentPool
from mgrpo.workflows.hierarchy import delegation_tree

log = logging.getLogger(__name__)

# How the planner describes the built-in roles; a user role is described by its name unless
# the sub-agent service registers a description (docs/extending.md).
ROLE_DESCRIPTIONS = {card.name: card.description for card in P.DEFAULT_AGENTS}


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: Any
    engine: Any
    optimizer: torch.optim.Optimizer | None = None
    version: int = 0
    ref_model: torch.nn.Module | None = None  # KL reference, built on first use (reference.py)
    ref_key: tuple | None = None  # (run id, resolved path, sharded) of ref_model


@dataclass
class System:
    cfg: RunConfig
    bench: Any
    models: dict[str, LoadedModel]
    tools: dict[str, Any]
    runtimes: dict[str, AgentRuntime]
    verifier: Any
    judge: Any
    extras: dict = field(default_factory=dict)

    def runner(self, greedy: bool = False) -> EpisodeRunner:
        """The planner's episode runner, as the algorithm's ``sub_agents`` plays them
        (:data:`SUB_AGENT_RUNNERS`)."""
        return SUB_AGENT_RUNNERS[self.cfg.algo.sub_agents](self, greedy)

    def delegating_runner(self, greedy: bool = False) -> EpisodeRunner:
        """The planner delegates to its sub-agents, each its own agent in a local pool."""
        subs = {r: self.runtimes[r] for r in self.cfg.algo.agent_roles(self.runtimes)}
        return EpisodeRunner(self.runtimes["planner"], self.cards(), self.cfg.sampling,
                             dispatch=LocalSubagentPool(subs, self.cfg.sampling, greedy=greedy,
                                                        entry=[c.name for c in self.cards()]))

    def inline_runner(self, greedy: bool = False) -> EpisodeRunner:
        """Single agent: the planner plays every role in its own context, calling their
        tools."""
        tools = {r: self.tools[r] for r in self.cfg.algo.inline_roles(self.runtimes)}
        return EpisodeRunner(self.runtimes["planner"], self.cards(), self.cfg.sampling,
                             inline_tools=tools)

    def cards(self) -> list:
        """The planner's cards: the sub-agents it calls (all of them unless the hierarchy
        nests)."""
        return role_cards(delegation_tree(self.cfg.agents, self.cfg.delegation)["planner"],
                          self.cfg.descriptions)


# who plays the sub-agent roles (``Algorithm.sub_agents``) -> the planner's runner
SUB_AGENT_RUNNERS = {"agents": System.delegating_runner, "inline": System.inline_runner}


def role_description(role: str, descriptions: dict[str, str] | None = None) -> str:
    """What the planner reads about sub-agent ``role``: the run config's ``descriptions``,
    else the built-in role's own, else the role name."""
    return (descriptions or {}).get(role) or ROLE_DESCRIPTIONS.get(role, role)


def role_cards(roles, descriptions: dict[str, str] | None = None) -> list:
    """The planner header's agent cards for the sub-agent ``roles`` (the planner left out):
    the built-in roles in the experts' order (SFT saw it), then the others by name, each
    described by :func:`role_description`. Used by embedded mode and by the planner worker
    in single-agent mode."""
    known = [c.name for c in P.DEFAULT_AGENTS]
    ordered = sorted((r for r in roles if r != "planner"),
                     key=lambda r: (r not in known, known.index(r) if r in known else 0, r))
    return [P.AgentCard(name=r, description=role_description(r, descriptions))
            for r in ordered]


def role_tool_name(role: str, role_tools: dict[str, str] | None = None) -> str:
    """The tool of sub-agent ``role``: ``role_tools``, else the built-in
    :data:`mgrpo.tools.ROLE_TOOLS`."""
    name = (role_tools or {}).get(role) or ROLE_TOOLS.get(role)
    if name is None:
        raise ValueError(f"sub-agent role {role!r} has no tool: add `role_tools: "
                         f"{{{role}: <tool>}}` to the run config (a registered tool or a "
                         "`tools:` entry with a `class:`)")
    return name


def tool_resources(bench_dir: str, sandbox: Any = None) -> dict[str, Any]:
    """Factories of the resources a tool's constructor may ask for (``mgrpo.tools.PROVIDED``):
    the benchmark's corpus and the sandbox executor (``sandbox``, default an in-process
    ``LocalSandbox``). Each is made only when a tool asks for it."""
    def corpus():
        return load_benchmark(bench_dir).corpus

    def executor():
        return sandbox if sandbox is not None else LocalSandbox()

    return {"corpus": corpus, "executor": executor}


def build_tools(bench: Any, roles: list[str], sandbox: Any = None,
                tool_cfg: dict[str, dict] | None = None,
                role_tools: dict[str, str] | None = None) -> dict[str, Any]:
    """role -> tool instance, each built by ``mgrpo.tools.build_configured_tool`` from the
    run config's ``tools:`` (``tool_cfg``) and ``role_tools``."""
    resources = {"corpus": lambda: bench.corpus,
                 "executor": tool_resources("", sandbox)["executor"]}
    return {role: build_configured_tool(role_tool_name(role, role_tools), tool_cfg, resources)
            for role in roles}


def model_engines(cfg: RunConfig) -> dict[str, str]:
    """model -> the engine spec of its roles (``engines.<role>``, default ``torch``): embedded
    mode builds one engine per model, so the roles of one model must name the same one."""
    specs: dict[str, dict[str, str]] = {}
    for role, model_name in cfg.agents.items():
        specs.setdefault(model_name, {})[role] = cfg.engines.get(role, "torch")
    for model_name, by_role in specs.items():
        if len(set(by_role.values())) > 1:
            raise ValueError(f"model {model_name!r}: its roles name different engines "
                             f"({by_role}); embedded mode samples each model with one engine")
    return {m: next(iter(by_role.values())) for m, by_role in specs.items()}


def load_models(cfg: RunConfig, device: str = "cpu") -> dict[str, LoadedModel]:
    """Every model an agent uses, loaded once (the torch model, its optimizer when trainable,
    and the engine its roles name, built by :func:`mgrpo.engines.registry.build_engine`),
    seeded by the run's seed: embedded mode's models, whatever the workflow. A torch engine
    samples from the trained model itself; any other engine starts on ``models.<m>.path`` and
    gets each new checkpoint through its ``load_weights``
    (:func:`mgrpo.training.run_state.sync_sampler`). LoRA models on the same base folder and
    dtype (``models.<m>.share_base``, default on) hold one copy of the frozen base weights
    (:func:`mgrpo.models.shared_base.share_frozen_base`), one INFO line per group; when they
    sample with vllm, one vLLM instance serves them all, an adapter per agent."""
    specs = model_engines(cfg)
    torch.manual_seed(cfg.seed)
    models: dict[str, LoadedModel] = {}
    groups: dict[tuple[str, str], list[str]] = {}  # (base folder, dtype) -> LoRA models
    saved: dict[tuple[str, str], int] = {}
    for name in dict.fromkeys(cfg.agents.values()):
        mcfg = cfg.models[name]
        model, tokenizer = load_model(mcfg.path, device=device)
        if mcfg.lora is not None:  # only the adapter trains; the engine samples through it
            model = apply_lora(model, mcfg.lora)
            if mcfg.share_base:  # tied at once: the duplicate base is freed before the next
                key = (os.path.realpath(mcfg.path), mcfg.dtype)
                group = groups.setdefault(key, [])
                if group:  # one folder, one load: equal values (a check would read them all)
                    shared = share_frozen_base([models[group[0]].model, model],
                                               check_values=False)
                    saved[key] = saved.get(key, 0) + shared.bytes_saved
                group.append(name)
        model.eval()
        engine = _shared_vllm(models, groups, specs, name, mcfg)
        if engine is None:
            engine = build_engine(specs[name], mcfg.path, device, lora=mcfg.lora, model=model,
                                  tokenizer=tokenizer).engine
        optimizer = None
        if mcfg.trainable:
            prepare_for_training(model, mcfg)  # gradient checkpointing when asked
            optimizer = make_optimizer(model, mcfg)
        models[name] = LoadedModel(name, model, tokenizer, engine, optimizer)
    for (path, dtype), names in groups.items():
        if len(names) > 1:
            log.info("models %s share one copy of the base weights of %s (%s): %.1f MB saved",
                     ", ".join(names), path, dtype, saved[(path, dtype)] / 1e6)
    return models


def _shared_vllm(models: dict[str, LoadedModel], groups: dict[tuple[str, str], list[str]],
                 specs: dict[str, str], name: str, mcfg: Any) -> Any:
    """For a LoRA model on a shared base whose group's first model already samples with
    vLLM: an adapter engine on that vLLM instance (one base, an adapter per agent, named per
    request); else None."""
    if mcfg.lora is None or not mcfg.share_base or specs[name] != "vllm":
        return None
    group = groups.get((os.path.realpath(mcfg.path), mcfg.dtype), [])
    first = models.get(group[0]) if group and group[0] != name else None
    if first is None or specs[first.name] != "vllm":
        return None
    return first.engine.adapter_engine()


def build_system(cfg: RunConfig, device: str = "cpu", sandbox: Any = None) -> System:
    models = load_models(cfg, device)
    bench = load_benchmark(cfg.bench_dir)
    tree = delegation_tree(cfg.agents, cfg.delegation)
    # a sub-agent that delegates has no tool unless role_tools names one
    tool_roles = [r for r in cfg.agents if r != "planner" and (not tree[r] or r in cfg.role_tools)]
    tools = build_tools(bench, tool_roles, sandbox, cfg.tools, cfg.role_tools)
    formats = {name: build_turn_format(cfg.protocol.format, lm.tokenizer,
                                       cfg.protocol.tool_call_format,
                                       cfg.protocol.template_text())
               for name, lm in models.items()}
    runtimes = {}
    for role, model_name in cfg.agents.items():
        lm = models[model_name]
        runtimes[role] = AgentRuntime(role=role, model=model_name, engine=lm.engine,
                                      tokenizer=lm.tokenizer, tool=tools.get(role),
                                      description=role_description(role, cfg.descriptions),
                                      turn_format=formats[model_name],
                                      calls=tuple(role_cards(tree[role], cfg.descriptions))
                                      if role != "planner" else ())
    engines = {name: (lm.engine, lm.tokenizer) for name, lm in models.items()}
    judge = build_expert_judges(cfg, bench, engines, device=device)
    return System(cfg=cfg, bench=bench, models=models, tools=tools, runtimes=runtimes,
                  verifier=verifier_for_run(cfg, engines, device=device), judge=judge)


def out_path(cfg: RunConfig, *parts: str) -> Path:
    path = Path(cfg.out_dir).joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
