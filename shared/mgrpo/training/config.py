"""The run configuration: one YAML file, every option documented here.

``mgrpo train --config FILE`` reads it (``mgrpo.training.config_files.load_run_config``);
:class:`RunConfig` validates it and rejects bad combinations with a message that names the
value, the rule and the fix. Its sections live by concept and are read from here:
``loss`` and ``rewards`` (:mod:`~mgrpo.training.loss_config`), ``models`` and ``sampling``
(:mod:`~mgrpo.training.model_config`), ``stages``, ``judges``, ``verifier_llm``,
``protocol`` and ``init_from`` (:mod:`~mgrpo.training.run_sections`).
Process settings (URLs, tokens, devices) are not here: see ``mgrpo.config.Settings``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from mgrpo.algo.algorithms import Algorithm, algorithm_names, get_algorithm
from mgrpo.algo.estimators import get_estimator
from mgrpo.engines.registry import engine_kind
from mgrpo.envs.judges import check_judge_kind
from mgrpo.envs.verifiers import check_verifier
from mgrpo.plugins import import_plugins
from mgrpo.tools import check_tool
from mgrpo.training import aliases
from mgrpo.training.loss_config import LossConfig, RewardWeights
from mgrpo.training.metric_names import namespace_clash
from mgrpo.training.model_config import ModelConfig, SamplingConfig
from mgrpo.training.run_sections import (
    MAX_VERSION,
    RUN_ID_PATTERN,
    InitFrom,
    JudgeConfig,
    LLMVerifierConfig,
    ProtocolConfig,
    StageConfig,
)
from mgrpo.validation import StrictModel
from mgrpo.workflows import get_workflow, prepare_run_data
from mgrpo.workflows.config import WorkflowConfig
from mgrpo.workflows.hierarchy import delegation_tree

__all__ = ["MAX_VERSION", "RUN_ID_PATTERN", "InitFrom", "JudgeConfig", "LLMVerifierConfig",
           "LossConfig", "ModelConfig", "ProtocolConfig", "RewardWeights", "RunConfig",
           "SamplingConfig", "StageConfig", "check_plugin_specs"]


class RunConfig(StrictModel):
    key_aliases: ClassVar[dict[str, tuple[str, str]]] = aliases.RUN

    name: str = Field("run", pattern=RUN_ID_PATTERN,
                      description="Run id: checkpoints are kept per run, under this name.")
    init_from: InitFrom | None = Field(
        None, description="Start from another run's weights (never implicit).")
    seed: int = 0
    cpu_kernels: Literal["avx2", "native"] = Field(
        "native", description="CPU kernels of torch and MKL for `mgrpo train` and `mgrpo "
        "eval` (mgrpo.training.numerics): avx2 pins them to the AVX2 ones every x86-64 CPU "
        "has, so the same seed gives the same numbers on CPUs with other vector units "
        "(AVX-512); native: each machine's best. The demo writes avx2 (its own setting) into "
        "demo.yaml, so evaluating a demo run takes its kernels. Long-lived services take "
        "their kernels from their environment (ATEN_CPU_CAPABILITY, MKL_CBWR).")
    cpu_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads for `mgrpo train` and `mgrpo eval` "
        "(None: torch's default, from OMP_NUM_THREADS). Reductions split by thread, so "
        "another count gives other float sums; the demo writes its `threads` here.")
    algorithm: str = Field(
        "mgrpo", description="A registered algorithm (mgrpo.algo.algorithms): mgrpo: planner "
        "+ sub-agents, per-agent groups with alignment. at_grpo: tree sampling, groups (query, "
        "agent, turn). grpo: single agent, the planner calls the tools itself.")
    agents: dict[str, str] = Field(
        default_factory=lambda: {"planner": "planner", "searcher": "searcher",
                                 "coder": "coder"},
        description="agent role -> model name. Map several roles to one model to share it. "
        "An agent that delegates is written {model: NAME, calls: [roles]} (a nested "
        "hierarchy: planner -> researcher -> searcher); its calls go to `delegation`. "
        "{model: NAME, description: TEXT} gives the planner's card of a sub-agent "
        "(`descriptions`).")
    delegation: dict[str, list[str]] = Field(
        default_factory=dict, description="agent role -> the sub-agents it may call, from "
        "`agents`' {model, calls} entries (mgrpo.workflows.hierarchy). The planner calls "
        "every sub-agent no other agent calls, unless it lists its own; each sub-agent has "
        "one caller; a role calling itself, a cycle, or more than MAX_DEPTH levels below "
        "the planner are refused. A delegating sub-agent has no tool unless `role_tools` "
        "names one.")
    descriptions: dict[str, str] = Field(
        default_factory=dict, description="Sub-agent role -> the one line the planner reads "
        "about it (its card: the description of its tool in the chat template's `tools=`, "
        "a line of the markup header), in both modes; also written in `agents:` as {model: "
        "NAME, description: ...}. Roles not listed: the built-in roles' own (searcher: look "
        "up facts, coder: run python), else the role name.")
    workflow: WorkflowConfig | None = Field(
        None, description="The workflow (mgrpo.workflows): None = the hierarchy of `agents`; "
        "{kind: turn_team, world: plan_path, roles: {tool: m1, plan: m2}} = a team taking "
        "turns on a world (its roles replace `agents`; algorithm at_grpo).")
    models: dict[str, ModelConfig]
    engines: dict[str, str] = Field(
        default_factory=dict, description="Agent role -> inference engine of its rollouts, "
        "in both modes (roles not listed: torch embedded, MGRPO_ENGINE in the services): "
        "`torch` (TorchEngine), `vllm` (VLLMEngine in the sampling process: vLLM must be "
        "installed there), the http(s) URL of an OpenAI-compatible server serving that "
        "role's model (vLLM's: `python -m vllm.entrypoints.openai.api_server`, "
        "docs/models.md), e.g. http://vllm-searcher:8001, or `package.module:factory` "
        "(factory(model_path, device) -> (model, tokenizer, engine)); mgrpo.engines.registry. "
        "Embedded mode needs one engine per model. The trainer always trains with torch; a "
        "non-torch engine loads each new checkpoint.")
    k: int = Field(8, ge=2, description="Rollouts per query (paper: 8).")
    queries_per_round: int = Field(16, ge=1)
    d: int | Literal["auto"] = Field(
        "auto", description="Sub-agent alignment slots per rollout; auto = 99th pct of d_k.")
    plugins: list[str] = Field(
        default_factory=list, description="Python modules every process of the run imports "
        "before it builds anything (e.g. [acme_task.tools]), so their @register_tool and "
        "functions are found; services also take MGRPO_PLUGINS (comma-separated).")
    role_tools: dict[str, str] = Field(
        default_factory=dict, description="Sub-agent role -> tool: a registered tool name or "
        "a key of `tools:`, for roles beyond the built-in searcher (search) and coder "
        "(python).")
    tools: dict[str, dict] = Field(
        default_factory=dict, description="Per-tool keyword config, e.g. {search: {k: 1}}, "
        "or a tool by import path: {websearch: {class: 'acme.tools:WebSearch', url: ...}}; "
        "the keywords go to the constructor in both modes; mgrpo fills only the parameters "
        "named corpus and executor, when the constructor declares them. A plain function: "
        "{calc: {function: 'acme.tools:calc', description: ...}}, its schema from its "
        "signature and docstring (mgrpo.tools.function). The warm-start "
        "demonstrations must have been written with the same settings.")
    verifier: str = Field(
        "exact", description="r_correct of the planner's final answer: exact (normalised "
        "exact match), llm (a model grades it: `verifier_llm`), or 'pkg.mod:function' "
        "taking (question, answer, gold) -> float in [0, 1]. A verifier that raises or "
        "returns anything else scores 0, counted as planner/verifier_errors.")
    verifier_llm: LLMVerifierConfig | None = Field(
        None, description="verifier: llm: the grading model (model, url, prompt).")
    rewards: RewardWeights = Field(default_factory=RewardWeights)
    judges: dict[str, JudgeConfig] = Field(
        default_factory=dict, description="Sub-agent role -> its r_expert judge "
        "({kind: rule} or {kind: llm, model: ...}); roles not listed use the rule judge.")
    loss: LossConfig = Field(default_factory=LossConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    protocol: ProtocolConfig = Field(default_factory=ProtocolConfig)
    stages: list[StageConfig] = Field(default_factory=lambda: [StageConfig()])
    at_grpo_alpha: float = Field(1.0, description="AT-GRPO turn reward r = alpha*r_team + r_local")
    eval_questions: int = Field(200, ge=1, description="Held-out (test split) questions.")
    eval_stage: int | None = Field(
        None, description="Benchmark stage of the held-out questions (None: all stages).")
    eval_every: int = Field(
        0, ge=0, description="Also evaluate held-out accuracy (greedy) every N rounds "
        "(0: only before the first round and after the last, sampled and greedy).")
    max_staleness: int = Field(
        0, ge=0, description="Asynchronous mode: round n+1 is sampled while round n trains, "
        "by weights at most this many updates behind the trainer (per model: "
        "models.<m>.max_staleness overrides it). 0 = synchronous rounds. > 0 needs "
        "loss.rollout_is (decoupled PPO correction) and algorithm mgrpo or grpo; the services "
        "then admit a round while earlier ones are unfinished.")
    keep_checkpoints: int = Field(
        3, ge=1, description="Checkpoint versions kept per model (older ones are deleted).")
    report_to: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["tensorboard"],
        description="Where round metrics go besides the stats store (and, embedded, "
        "metrics.csv): tensorboard (embedded: <out_dir>/tensorboard; trainer services: only "
        "with MGRPO_TENSORBOARD_DIR set), wandb (Weights & Biases, off by default: needs "
        "`pip install 'mgrpo[wandb]'`, configured by WANDB_* env vars, e.g. "
        "WANDB_MODE=offline). [] for neither.")
    log_completions: int = Field(
        2, ge=0, description="Episodes per round of an embedded `mgrpo train` that plays "
        "episodes (algorithms mgrpo and grpo; AT-GRPO's trees and turn teams write none), "
        "chosen by the seed, written as people read them (each agent's turns, tool calls "
        "and results, the planner's reward): to <out_dir>/completions.jsonl, TensorBoard's "
        "text tab and a W&B table (`report_to`), shown by the dashboard. 0: none. As TRL's "
        "log_completions.")
    bench_dir: str = "runs/bench"
    out_dir: str = "runs/run"

    @field_validator("algorithm")
    @classmethod
    def _registered(cls, name: str) -> str:
        get_algorithm(name)  # an unknown name lists the valid ones
        return name

    @model_validator(mode="before")
    @classmethod
    def _agent_calls(cls, data):
        """``agents: {role: {model: m, calls: [...], description: ...}}`` -> ``agents[role]
        = m``, ``delegation[role] = [...]`` and ``descriptions[role]``."""
        if not isinstance(data, dict) or not isinstance(data.get("agents"), dict):
            return data
        agents, delegation = {}, dict(data.get("delegation") or {})
        descriptions = dict(data.get("descriptions") or {})
        for role, entry in data["agents"].items():
            if isinstance(entry, dict):
                unknown = sorted(set(entry) - {"model", "calls", "description"})
                if unknown or "model" not in entry:
                    raise ValueError(f"agents.{role}: an agent written out is {{model: NAME, "
                                     "calls: [roles], description: TEXT}} (calls and "
                                     f"description optional; got keys {sorted(entry)})")
                if "description" in entry:
                    descriptions[role] = entry["description"]
                calls = entry.get("calls") or []
                if not isinstance(calls, list) or not all(isinstance(c, str) for c in calls):
                    raise ValueError(f"agents.{role}.calls: a list of agent roles, got "
                                     f"{calls!r}")
                agents[role] = entry["model"]
                if calls:
                    delegation[role] = calls
            else:
                agents[role] = entry
        return {**data, "agents": agents, "delegation": delegation,
                **({"descriptions": descriptions} if descriptions else {})}

    @model_validator(mode="before")
    @classmethod
    def _workflow_fields(cls, data):
        """What the workflow implies (a turn_team's `agents` from its roles)."""
        if isinstance(data, dict) and isinstance(data.get("workflow"), WorkflowConfig):
            data = {**data, "workflow": data["workflow"].model_dump(exclude_unset=True)}
        if isinstance(data, dict) and isinstance(data.get("workflow"), dict):
            return prepare_run_data(data)
        return data

    @property
    def flow(self):
        """The registered :class:`~mgrpo.workflows.Workflow` this run plays."""
        return get_workflow(self.workflow.kind if self.workflow else "hierarchy")

    @property
    def algo(self) -> Algorithm:
        """The registered :class:`~mgrpo.algo.algorithms.Algorithm` this run trains with."""
        return get_algorithm(self.algorithm)

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        missing = sorted(set(self.agents.values()) - set(self.models))
        if missing:
            raise ValueError(f"agents map to models {missing} that are not in `models` "
                             f"(have {sorted(self.models)}); add them under `models:`.")
        if (clash := namespace_clash(self.agents)) is not None:
            raise ValueError(clash)
        self.flow.check(self)  # the hierarchy: a planner; a turn team: its world's roles
        self._check_algorithm()
        if self.verifier == "llm" and self.verifier_llm is None:
            raise ValueError("verifier: llm needs `verifier_llm: {model: ...}` naming an entry "
                             f"of `models` (have {sorted(self.models)})")
        if self.verifier_llm is not None and self.verifier_llm.model not in self.models:
            raise ValueError(f"verifier_llm.model={self.verifier_llm.model!r} is not an entry "
                             f"of `models` (have {sorted(self.models)})")
        for role, judge in self.judges.items():
            if role == "planner" or role not in self.agents:
                raise ValueError(f"judges.{role}: not a sub-agent role of `agents` "
                                 f"({sorted(r for r in self.agents if r != 'planner')}); "
                                 "r_expert is judged per sub-agent")
            if judge.kind == "llm" and judge.model not in self.models:
                raise ValueError(f"judges.{role}: kind llm needs `model:` naming an entry of "
                                 f"`models` (have {sorted(self.models)}), got {judge.model!r}")
            if judge.kind != "llm" and (judge.model or judge.url or judge.prompt):
                raise ValueError(f"judges.{role}: kind {judge.kind} takes no "
                                 "model/url/prompt; set kind: llm to use a model")
        for role in self.descriptions:
            if role == "planner" or role not in self.agents:
                raise ValueError(f"descriptions.{role}: not a sub-agent role of `agents` "
                                 f"({sorted(r for r in self.agents if r != 'planner')}); the "
                                 "planner reads a description of each agent it calls")
        for role, engine in self.engines.items():
            if role not in self.agents:
                raise ValueError(f"engines.{role}: not a role of `agents` "
                                 f"({sorted(self.agents)})")
            try:
                kind = engine_kind(engine)
            except ValueError as exc:
                raise ValueError(f"engines.{role}: {exc}") from None
            if kind == "remote" and self.models[self.agents[role]].lora is not None:
                raise ValueError(f"engines.{role} is a server URL but model "
                                 f"{self.agents[role]!r} trains a LoRA adapter: a server "
                                 "reloads full weights only; use torch or vllm for that role")
        stale = {m: n for m in self.trained_models() if (n := self.staleness(m)) > 0}
        if self.loss.rollout_is == "auto":
            self.loss.rollout_is = "token" if stale or self.bf16_models() else "none"
        if stale and self.loss.rollout_is == "none":
            raise ValueError(f"max_staleness {stale} needs loss.rollout_is: token or sequence: "
                             "stale samples are corrected by truncated importance weights "
                             "pi_old / pi_rollout (decoupled PPO); without them the update "
                             "is biased")
        for name in self.trained_models():
            mcfg = self.models[name]
            if mcfg.lr_schedule != "constant" and mcfg.warmup_steps >= self.optimizer_steps(name):
                raise ValueError(f"models.{name}: warmup_steps={mcfg.warmup_steps} >= the "
                                 f"run's {self.optimizer_steps(name)} optimizer steps (rounds "
                                 "x mini_batches x ppo_epochs): the schedule would never leave "
                                 "its warm-up; shorten it or set lr_total_steps")
        if self.loss.eps_low >= 1:
            raise ValueError(f"loss.eps_low={self.loss.eps_low} must be < 1 (clip at 1-eps).")
        return self

    def _check_algorithm(self) -> None:
        """The options and workflow the algorithm takes (its entry's declarative fields, the
        one place they are checked): its workflow, nested delegation, the protocol's format,
        asynchronous rounds and a KL penalty in the reward."""
        algo, kind = self.algo, self.workflow.kind if self.workflow else "hierarchy"
        # a user's workflow is of the built-in kinds it derives from (its class's ancestors);
        # one derived from none trains itself (Workflow.train), whatever the algorithm
        lineage = {c.__dict__.get("name") for c in type(self.flow).__mro__} - {None, ""}
        known = {w for name in algorithm_names() for w in get_algorithm(name).workflows}
        family = lineage & known
        if family and not family & set(algo.workflows):
            raise ValueError(f"workflow {kind} trains with algorithm "
                             f"{_algorithms(lambda a: bool(family & set(a.workflows)))}, "
                             f"not {self.algorithm}")
        tree = delegation_tree(self.agents, self.delegation) if self.delegation else {}
        nested = {r: list(cs) for r, cs in tree.items() if r != "planner" and cs}
        if nested and not algo.nests:
            raise ValueError(f"agents {nested}: nested delegation trains with algorithm "
                             f"{_algorithms(lambda a: a.nests)}, not {self.algorithm}")
        if self.protocol.format != "markup" and algo.markup_only:
            raise ValueError(f"protocol.format: {self.protocol.format} plays algorithm "
                             f"{_algorithms(lambda a: not a.markup_only)}; {self.algorithm} "
                             "renders the markup only (set protocol.format: markup)")
        stale = {m: n for m in self.trained_models() if (n := self.staleness(m)) > 0}
        if stale and not algo.asynchronous:
            runs = [n for n in algorithm_names() if get_algorithm(n).asynchronous]
            raise ValueError(f"max_staleness {stale}: the asynchronous mode runs "
                             f"{' and '.join(runs)} rounds; {algo.title}'s rounds are "
                             "synchronous (set max_staleness: 0 or algorithm: mgrpo)")
        if self.loss.kl_in_reward and not algo.kl_in_reward:
            takes = [n for n in algorithm_names() if get_algorithm(n).kl_in_reward]
            raise ValueError(f"loss.kl_in_reward with algorithm {self.algorithm}: the KL "
                             f"penalty is applied to {' and '.join(takes)} rewards only; put "
                             "the KL in the loss (kl_in_reward: false, kl_estimator: k3+) or "
                             "use mgrpo")

    def bf16_models(self) -> list[str]:
        """Trained models with ``dtype: bfloat16``: their trainer's logprobs differ from a
        float32 sampler's (up to ~0.5 nats a token measured at 135M)."""
        return [m for m in self.trained_models() if self.models[m].dtype == "bfloat16"]

    def precision_warnings(self) -> list[str]:
        """One line per trained bf16 model whose sampler/trainer gap goes uncorrected."""
        if self.loss.rollout_is != "none":
            return []
        return [f"models.{m}: dtype bfloat16 trains on logprobs that differ from the "
                "sampler's (float32) and loss.rollout_is is none, so nothing corrects the "
                "gap; set loss.rollout_is: token (or auto)" for m in self.bf16_models()]

    @model_validator(mode="after")
    def _plugins(self) -> RunConfig:
        """Import ``plugins`` and resolve every import-path spec now, so a missing module,
        attribute or wrong signature is refused before anything runs."""
        import_plugins(self.plugins)
        check_plugin_specs(self)
        return self

    def loss_norm_length(self) -> int:
        """Dr. GRPO's constant L: ``loss.norm_length``, else the most tokens one trajectory
        can generate: ``max_new_tokens`` times its turns (M-GRPO: the planner's or a
        sub-agent's turn limit, whichever is larger; GRPO: the planner also plays every
        sub-agent turn inline; AT-GRPO: a sample is one turn). A constant, so the loss scale
        does not depend on the padded width of the batch."""
        if self.loss.norm_length is not None:
            return self.loss.norm_length
        s = self.sampling
        return s.max_new_tokens * self.algo.max_turns(s.planner_max_turns,
                                                      s.subagent_max_turns)

    def advantage_estimator(self) -> str:
        """The registered advantage estimator this run's trainers call
        (``mgrpo.algo.estimators``): ``loss.advantage_estimator``, else the algorithm's."""
        return self.loss.advantage_estimator or self.algo.estimator

    def optimizer_steps(self, model: str) -> int:
        """The optimizer steps model ``model`` takes over the run: every stage's rounds x
        ``mini_batches`` x ``ppo_epochs`` (or its ``lr_total_steps``): the span of a linear
        or cosine learning-rate schedule."""
        mcfg = self.models[model]
        if mcfg.lr_total_steps is not None:
            return mcfg.lr_total_steps
        rounds = sum(stage.rounds for stage in self.stages)
        return max(1, rounds * mcfg.mini_batches * mcfg.ppo_epochs)

    def staleness(self, model: str) -> int:
        """Model ``model``'s staleness bound: its own ``max_staleness``, else the run's."""
        own = self.models[model].max_staleness
        return self.max_staleness if own is None else own

    def trained_models(self) -> list[str]:
        used = dict.fromkeys(self.agents.values())
        return [m for m in used if self.models[m].trainable]


def _algorithms(takes) -> str:
    """The registered algorithms that ``takes`` (an Algorithm -> bool), each with its
    description: ``mgrpo (planner + sub-agents, ...)``."""
    return " or ".join(f"{n} ({get_algorithm(n).description})" for n in algorithm_names()
                       if takes(get_algorithm(n)))


def check_plugin_specs(cfg: RunConfig) -> None:
    """Resolve the config's tools, role_tools, verifier and judges (one-line errors naming
    the key, the spec and what was found)."""
    for name in dict.fromkeys([*cfg.tools, *cfg.role_tools.values()]):
        check_tool(name, cfg.tools)
    check_verifier(cfg.verifier)
    try:
        get_estimator(cfg.advantage_estimator())
    except ValueError as exc:
        raise ValueError(f"loss.advantage_estimator: {exc}") from None
    for role, judge in cfg.judges.items():
        check_judge_kind(judge.kind, f"judges.{role}.kind")
