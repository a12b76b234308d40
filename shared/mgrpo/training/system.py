"""Assemble a runnable multi-agent system from a run config: models, engines, tools, runner.

Embedded mode builds everything in this process; every model is loaded once and shared by
its engine (sampling) and its trainer (updates), so "weight sync" is a version bump (a
LoRA model, ``models.<m>.lora``, is the same peft model in both: the engine samples through
the adapter being trained). The
services build the same pieces, one model per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mgrpo.envs import load_benchmark
from mgrpo.envs import protocol as P
from mgrpo.envs.rewards import ExactMatchVerifier
from mgrpo.tools.registry import ROLE_TOOLS
from mgrpo.training.config import RunConfig
from mgrpo.training.episodes import AgentRuntime, EpisodeRunner
from mgrpo.training.judging import build_expert_judges
from mgrpo.training.subagents import LocalSubagentPool

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
        planner = self.runtimes["planner"]
        subs = {r: rt for r, rt in self.runtimes.items() if r != "planner"}
        if self.cfg.algorithm == "grpo":  # single agent: the planner plays every role
            return EpisodeRunner(planner, self.cards(), self.cfg.sampling,
                                 inline_tools={r: self.tools[r] for r in subs})
        return EpisodeRunner(planner, self.cards(), self.cfg.sampling,
                             dispatch=LocalSubagentPool(subs, self.cfg.sampling, greedy=greedy))

    def cards(self) -> list:
        return role_cards(self.runtimes)


def role_cards(roles) -> list:
    """The planner header's agent cards for the sub-agent ``roles`` (the planner left out):
    the built-in roles in the experts' order (SFT saw it), then the others by name. Used by
    embedded mode and by the planner worker in single-agent mode."""
    known = [c.name for c in P.DEFAULT_AGENTS]
    ordered = sorted((r for r in roles if r != "planner"),
                     key=lambda r: (r not in known, known.index(r) if r in known else 0, r))
    return [P.AgentCard(name=r, description=ROLE_DESCRIPTIONS.get(r, r)) for r in ordered]


def build_tools(bench: Any, roles: list[str], sandbox: Any = None,
                tool_cfg: dict[str, dict] | None = None,
                role_tools: dict[str, str] | None = None) -> dict[str, Any]:
    """role -> tool instance. ``tool_cfg``: per-tool keyword config; ``role_tools``: role ->
    tool name, over the built-in :data:`mgrpo.tools.ROLE_TOOLS`."""
    from mgrpo.sandbox.local import LocalSandbox
    from mgrpo.tools import build_tool

    tools = {}
    for role in roles:
        name = (role_tools or {}).get(role) or ROLE_TOOLS.get(role)
        if name is None:
            raise ValueError(f"sub-agent role {role!r} has no tool: add `role_tools: "
                             f"{{{role}: <tool>}}` to the run config (registered tools: "
                             f"see mgrpo.tools.registered_tools())")
        extra = dict((tool_cfg or {}).get(name, {}))
        if name == "search":
            tools[role] = build_tool("search", corpus=bench.corpus, **extra)
        else:
            tools[role] = build_tool(name, executor=sandbox or LocalSandbox(), **extra)
    return tools


def build_system(cfg: RunConfig, device: str = "cpu", sandbox: Any = None) -> System:
    from mgrpo.engines.torch_engine import TorchEngine
    from mgrpo.models import load_model
    from mgrpo.models.lora import apply_lora, trainable_parameters

    other = {role: e for role, e in cfg.engines.items() if e != "torch"}
    if other:
        raise ValueError(f"engines {other}: the embedded mode samples with the torch engine "
                         "only; run the services (`mgrpo up`) for vllm or server engines")
    torch.manual_seed(cfg.seed)
    bench = load_benchmark(cfg.bench_dir)
    models: dict[str, LoadedModel] = {}
    for name in dict.fromkeys(cfg.agents.values()):
        mcfg = cfg.models[name]
        model, tokenizer = load_model(mcfg.path, device=device)
        if mcfg.lora is not None:  # only the adapter trains; the engine samples through it
            model = apply_lora(model, mcfg.lora)
        model.eval()
        engine = TorchEngine(model, tokenizer, device=device)
        optimizer = (torch.optim.Adam(trainable_parameters(model), lr=mcfg.lr)
                     if mcfg.trainable else None)
        models[name] = LoadedModel(name, model, tokenizer, engine, optimizer)
    sub_roles = [r for r in cfg.agents if r != "planner"]
    tools = build_tools(bench, sub_roles, sandbox, cfg.tools, cfg.role_tools)
    runtimes = {}
    for role, model_name in cfg.agents.items():
        lm = models[model_name]
        runtimes[role] = AgentRuntime(role=role, model=model_name, engine=lm.engine,
                                      tokenizer=lm.tokenizer, tool=tools.get(role),
                                      description=ROLE_DESCRIPTIONS.get(role, role))
    judge = build_expert_judges(cfg, bench, {name: (lm.engine, lm.tokenizer)
                                             for name, lm in models.items()}, device=device)
    return System(cfg=cfg, bench=bench, models=models, tools=tools, runtimes=runtimes,
                  verifier=ExactMatchVerifier(), judge=judge)


def out_path(cfg: RunConfig, *parts: str) -> Path:
    path = Path(cfg.out_dir).joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
