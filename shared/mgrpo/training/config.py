"""The run configuration: one YAML file, every option documented here.

``mgrpo train --config FILE`` reads it (``mgrpo.training.config_files.load_run_config``);
:class:`RunConfig` validates it and rejects bad combinations with a message that names the
value, the rule and the fix.
Process settings (URLs, tokens, devices) are not here: see ``mgrpo.config.Settings``.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from mgrpo.algo.algorithms import Algorithm, algorithm_names, get_algorithm
from mgrpo.algo.kl import KL_LOSS_ESTIMATORS
from mgrpo.models.lora import LoraSpec
from mgrpo.training import aliases
from mgrpo.validation import StrictModel
from mgrpo.workflows.config import WorkflowConfig


class RewardWeights(StrictModel):
    """SPEC 1.2 (paper Eq. 4-5). Planner: a = (format, correct); sub-agent: b = (format,
    correct_main, expert)."""

    planner: tuple[float, float] = (0.1, 0.9)
    subagent: tuple[float, float, float] = (0.1, 0.4, 0.5)


class LossConfig(StrictModel):
    """SPEC 1.4. ``agg``: token-mean (DAPO, default) weighs every token equally;
    seq-mean-token-mean (original GRPO) weighs every sequence equally, so short answers pull
    harder; seq-mean-token-sum-norm (Dr. GRPO) removes the length bias of both."""

    key_aliases: ClassVar[dict[str, tuple[str, str]]] = aliases.LOSS

    eps_low: float = Field(0.2, gt=0)
    eps_high: float = Field(0.28, gt=0)
    agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    kl_coef: float = Field(0.0, ge=0, description="KL to a frozen reference model (each "
                           "model's `ref_path`, default its starting `path`); 0 = off.")
    kl_estimator: Literal["k1", "k2", "k3", "k1+", "k3+"] = Field(
        "k3+", description="Per-token KL estimator (verl's names, mgrpo.algo.kl). In the loss "
        "only k2, k1+ and k3+ have the gradient of KL(pi||pi_ref) (k1+/k3+: value of k1/k3, "
        "gradient of k2); k1 (gradient 0) and k3 (gradient of the reverse KL) are refused "
        "there. In the reward (kl_in_reward) only the value counts: k1 is the usual choice.")
    kl_in_reward: bool = Field(
        False, description="Subtract kl_coef * k_t per generated token from the reward before "
        "the advantages (verl use_kl_in_reward: a sequence's reward falls by kl_coef * "
        "sum_t k_t, pi = the sampler's logprobs) instead of adding a KL term to the loss.")
    kl_control: Literal["fixed", "adaptive"] = Field(
        "fixed", description="The kl_in_reward coefficient: fixed at kl_coef, or adaptive "
        "(mgrpo.algo.kl_control; Ziegler et al. 2019, TRL AdaptiveKLController, verl "
        "kl_ctrl.type): starts at kl_coef and after each round's batch of n sequences of mean "
        "KL kl becomes coef * (1 + clip(kl / kl_target - 1, -0.2, 0.2) * n / kl_horizon). Kept "
        "per model with its optimizer state, so a resumed run continues with it.")
    kl_target: float | None = Field(
        None, gt=0, description="Target KL per sequence (sum over its tokens) of "
        "kl_control: adaptive (verl kl_ctrl.target_kl).")
    kl_horizon: int = Field(10000, ge=1, description="Sequences over which kl_control: "
                            "adaptive moves the coefficient by at most 20% (verl "
                            "kl_ctrl.horizon).")
    entropy_coef: float = Field(
        0.0, ge=0, description="Entropy bonus: the loss subtracts entropy_coef * agg(H) over "
        "the trained tokens (verl entropy_coeff). 0 = off (entropy is still reported).")
    rollout_is: Literal["none", "token", "sequence"] = Field(
        "none", description="Truncated importance sampling pi_old / pi_rollout on the policy "
        "loss (verl's rollout correction): per token, per sequence, or off.")
    rollout_is_threshold: float = Field(2.0, ge=1.0, description="Cap C of the IS weights.")
    scale: Literal["std", "none"] = Field(
        "std", description="std: GRPO advantage (r-mu)/(sigma+eps). none: Dr. GRPO, r-mu.")
    dynamic_sampling: bool = Field(
        False, description="DAPO: drop groups whose rewards are all equal (no signal).")
    eps: float = 1e-6

    def kl_in_loss(self) -> bool:
        """Whether the policy loss carries a KL term (on, and not moved into the reward)."""
        return self.kl_coef > 0 and not self.kl_in_reward
    norm_length: int | None = Field(
        None, ge=1, description="Dr. GRPO's constant L in sum(m*l) / (B*L) "
        "(seq-mean-token-sum-norm; verl: loss_scale_factor). None = the generation budget, "
        "RunConfig.loss_norm_length().")

    @model_validator(mode="after")
    def _kl_in_loss(self) -> LossConfig:
        if self.kl_coef > 0 and not self.kl_in_reward \
                and self.kl_estimator not in KL_LOSS_ESTIMATORS:
            why = {"k1": "its expected gradient is 0 (it regularises nothing)",
                   "k3": "its expected gradient is that of the reverse KL(pi_ref||pi)"}
            plus = "k1+" if self.kl_estimator == "k1" else "k3+"
            raise ValueError(f"loss.kl_estimator={self.kl_estimator} in the loss: "
                             f"{why[self.kl_estimator]}; use {plus} (its value, the gradient "
                             "of KL(pi||pi_ref)) or k2, or set loss.kl_in_reward: true")
        if self.kl_control == "adaptive":
            if not (self.kl_in_reward and self.kl_coef > 0):
                raise ValueError("loss.kl_control=adaptive steers the KL in the reward: set "
                                 "loss.kl_in_reward: true and loss.kl_coef > 0 (its start "
                                 "value), or kl_control: fixed")
            if self.kl_target is None:
                raise ValueError("loss.kl_control=adaptive needs loss.kl_target (the KL per "
                                 "sequence to steer toward, e.g. 6.0 as TRL's default)")
        return self


class ModelConfig(StrictModel):
    """One trainable model. Several agents may share one model (``agents`` mapping)."""

    key_aliases: ClassVar[dict[str, tuple[str, str]]] = aliases.MODEL

    path: str = Field(description="Local HF folder (or checkpoint) to start from.")
    lr: float = Field(2e-4, gt=0, description="Adam lr. Calibrated: 2e-4 stable on tiny "
                      "models; 5e-4 collapsed (SPEC 3).")
    grad_clip: float = 1.0
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per epoch over a round's "
                              "samples.")
    ppo_epochs: int = Field(1, ge=1, description="Passes over a round's samples (each "
                            "reshuffled into `mini_batches`), all against the same pi_old: "
                            "mini_batches * ppo_epochs optimizer steps per round (verl "
                            "ppo_epochs, TRL num_iterations).")
    micro_batch_size: int = Field(16, ge=1, description="Sequences per forward/backward.")
    micro_batch_tokens: int | None = Field(
        None, ge=1, description="Token budget per forward/backward: a micro-batch takes "
        "sequences while rows x its longest sequence stays within it (at least one; at most "
        "micro_batch_size), and is cut to that width. Same gradient as fixed-size "
        "micro-batches; bounds activation memory on long, uneven rollouts. None: by count.")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="bfloat16: the trained model's forward passes run under "
        "torch.autocast(bfloat16) (CPU and GPU) with float32 master weights, gradients and "
        "optimizer state; the frozen KL reference is held in bfloat16. float32: no autocast.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute each decoder layer's activations in the backward pass "
        "(Hugging Face gradient_checkpointing_enable, non-reentrant): less memory, about one "
        "more forward of time; same gradients.")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Learning rate per optimizer step after the warm-up "
        "(mgrpo.algo.schedules, Hugging Face's formulas): constant, linear to 0 or cosine to "
        "0 over the run's optimizer steps (lr_total_steps).")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up from 0 over this many "
                              "optimizer steps.")
    lr_total_steps: int | None = Field(
        None, ge=1, description="Optimizer steps the linear/cosine schedule spans; None: the "
        "run's, sum of stage rounds x mini_batches x ppo_epochs.")
    weight_decay: float = Field(0.0, ge=0, description="Decoupled weight decay (AdamW); 0 = "
                                "Adam.")
    trainable: bool = Field(True, description="False freezes it (main-only ablation).")
    ref_path: str | None = Field(
        None, description="KL reference (loss.kl_coef > 0): a local HF folder or checkpoint "
        "version folder; default `path`, i.e. the starting weights.")
    max_staleness: int | None = Field(
        None, ge=0, description="Asynchronous mode for this model: how many updates its "
        "trainer may be ahead of the weights that sampled a round (None: the run's "
        "`max_staleness`).")
    lora: LoraSpec | None = Field(
        None, description="Train a LoRA adapter instead of the full weights, e.g. {r: 8, "
        "alpha: 16, target_modules: [q_proj, v_proj]}: only the adapter is in the optimizer "
        "and in each checkpoint (kind lora), the KL reference is the base with the adapter "
        "disabled, and engines load only the adapter (vllm: enable_lora). None: full weights.")

    @model_validator(mode="after")
    def _lora(self) -> ModelConfig:
        if self.lora is not None and not self.trainable:
            raise ValueError("lora is set on a model with trainable: false; a frozen model "
                             "trains no adapter: drop `lora` or set trainable: true")
        if self.lr_total_steps is not None and self.warmup_steps >= self.lr_total_steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} >= lr_total_steps="
                             f"{self.lr_total_steps}: the warm-up would never end; shorten it")
        if self.lr_schedule == "constant" and self.lr_total_steps is not None:
            raise ValueError(f"lr_total_steps={self.lr_total_steps} with lr_schedule constant "
                             "does nothing; set lr_schedule: linear or cosine, or drop it")
        if self.micro_batch_tokens is not None and not self.trainable:
            raise ValueError("micro_batch_tokens on a model with trainable: false; it is "
                             "never trained: drop micro_batch_tokens")
        if self.lora is not None and self.ref_path is not None:
            raise ValueError(f"ref_path={self.ref_path!r} with lora: the KL reference of a "
                             "LoRA model is its base with the adapter disabled; drop ref_path")
        return self


class SamplingConfig(StrictModel):
    """How training rollouts are sampled. The trainer trains ``softmax(logits / temperature)``,
    the distribution the engine samples from; top-p / top-k truncation is refused because
    the trainer cannot put the tokens outside the kept set back (no correction exists)."""

    key_aliases: ClassVar[dict[str, tuple[str, str]]] = aliases.SAMPLING

    temperature: float = Field(1.0, gt=0, description="> 0; greedy is for evaluation only.")
    top_p: float = 1.0
    top_k: int = 0
    planner_max_turns: int = 5
    subagent_max_turns: int = 3
    max_new_tokens: int = 32  # per turn

    @model_validator(mode="after")
    def _untruncated(self) -> SamplingConfig:
        if self.top_p != 1.0 or self.top_k != 0:
            raise ValueError(
                f"sampling.top_p={self.top_p}, top_k={self.top_k}: training samples must come "
                "from the full softmax at `temperature` (the distribution the trainer trains); "
                "top-p/top-k sampling drops tokens no importance weight can restore. Set "
                "top_p: 1.0 and top_k: 0 (use temperature to sharpen).")
        return self


class StageConfig(StrictModel):
    """A curriculum stage (SPEC 1.6): which training questions, for how many rounds.
    ``max_success``: keep only queries whose success rate under the system at the start of
    the stage is below this threshold (1.0 = keep all)."""

    stage: int | None = Field(1, description="Benchmark stage (1 easy, 2 hard, None all).")
    rounds: int = Field(10, ge=0)
    max_success: float = Field(1.0, gt=0, le=1.0)
    filter_samples: int = Field(4, ge=1, description="Rollouts per query for the filter.")


class JudgeConfig(StrictModel):
    """How r_expert of one sub-agent role is judged (paper Eq. 5; ``mgrpo.envs.judges``).
    rule: ground truth from the benchmark (0, counted as ``{role}/expert_no_truth``, when a
    task has none). llm: a model asked yes/no from ``prompt`` (replies that are neither are
    0, counted as ``{role}/judge_parse_failures``). ``"pkg.mod:function"``: your function
    ``(role, task, result) -> float`` in [0, 1] (one that raises or returns anything else
    scores 0, counted as ``{role}/judge_errors``)."""

    kind: str = Field("rule", description="rule, llm, or 'pkg.mod:function'")
    model: str | None = Field(
        None, description="llm: the entry under `models:` that serves the judge: one of the "
        "agents' models (its current weights) or a separate entry no agent uses (frozen).")
    url: str | None = Field(
        None, description="llm: an OpenAI-compatible completions server (vLLM's, "
        "docs/models.md, or mgrpo.engines.openai_server) that serves `model`; the tokenizer "
        "is read from models.<model>.path. None: the model runs in the trainer's process.")
    prompt: str | None = Field(
        None, description="llm: prompt file with {task}, {result} (and optionally {role}, "
        "{evidence}: the sub-agent's tool observations); None = "
        "mgrpo/envs/prompts/llm_expert_judge.txt. Sent as the user turn of the judge "
        "tokenizer's chat template when it has one; task, result and evidence are escaped "
        "(& < >) and capped.")
    max_new_tokens: int = Field(4, ge=1)
    max_result_chars: int = Field(
        2000, ge=16, description="llm: the longest result shown to the judge (longer ones "
        "are cut, the cut said); each observation gets half, all of them together this.")


class LLMVerifierConfig(StrictModel):
    """``verifier: llm``: the model that grades the planner's final answer against the gold
    one (``mgrpo.envs.rewards.LLMJudgeVerifier``, yes/no from ``prompt``)."""

    model: str = Field(description="An entry of `models:` (an agent's model: its current "
                       "weights; a separate entry: frozen).")
    url: str | None = Field(None, description="An OpenAI-compatible completions server "
                            "serving `model`; None: the model runs in this process.")
    prompt: str | None = Field(None, description="Prompt file with {question}, {gold}, "
                               "{pred}; None = mgrpo/envs/prompts/llm_judge.txt.")
    max_new_tokens: int = Field(4, ge=1)


RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,80}$"
MAX_VERSION = 2**31 - 1  # a checkpoint version is a 32-bit integer column in the store


class ProtocolConfig(StrictModel):
    """How agent contexts are rendered and turns parsed (mgrpo.envs.turn_formats)."""

    format: Literal["markup", "chat_template"] = Field(
        "markup", description="markup: the agent protocol's special tokens (<call>, <tool>, "
        "...; the tiny models and `mgrpo model import` speak it). chat_template: each agent's "
        "conversation through its tokenizer's chat template, delegations and tool calls as "
        "the model's native tool calls (apply_chat_template(..., tools=...)); no new tokens. "
        "Plays algorithm mgrpo only; refused for a tokenizer without a chat template.")
    tool_call_format: str = Field(
        "hermes", description="chat_template: how tool calls are read back from a turn "
        "(mgrpo.envs.chat_format.TOOL_CALL_PARSERS): hermes = <tool_call>{\"name\": ..., "
        "\"arguments\": {...}}</tool_call> (Qwen2.5, Hermes).")

    @field_validator("tool_call_format")
    @classmethod
    def _known_parser(cls, name: str) -> str:
        from mgrpo.envs.chat_format import TOOL_CALL_PARSERS

        if name not in TOOL_CALL_PARSERS:
            raise ValueError(f"unknown tool_call_format {name!r}; known: "
                             f"{sorted(TOOL_CALL_PARSERS)}")
        return name


class InitFrom(StrictModel):
    """Start a run from ANOTHER run's weights; without it a run starts from each model's
    ``path``. (To start from a folder, point ``models.<m>.path`` at it: a checkpoint version
    directory is itself a Hugging Face folder.)"""

    run_id: str = Field(pattern=RUN_ID_PATTERN, description="The run to start from.")
    version: int | None = Field(
        None, ge=1, le=MAX_VERSION, description="That run's checkpoint version (None: its "
        "newest).")
    out_dir: str | None = Field(
        None, description="Embedded mode: the out_dir of that run (default: this run's). "
        "Distributed runs all live under MGRPO_CHECKPOINT_URI: leave it unset.")


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
        description="agent role -> model name. Map several roles to one model to share it.")
    workflow: WorkflowConfig | None = Field(
        None, description="The workflow (mgrpo.workflows): None = the hierarchy of `agents`; "
        "{kind: turn_team, world: plan_path, roles: {tool: m1, plan: m2}} = a team taking "
        "turns on a world (its roles replace `agents`; algorithm at_grpo).")
    models: dict[str, ModelConfig]
    engines: dict[str, str] = Field(
        default_factory=dict, description="Agent role -> inference engine of its rollouts "
        "(distributed mode; roles not listed: MGRPO_ENGINE, default torch): `torch` "
        "(TorchEngine), `vllm` (VLLMEngine in the worker's process: vLLM must be installed "
        "there) or the http(s) URL of an OpenAI-compatible server serving that role's model "
        "(vLLM's: `python -m vllm.entrypoints.openai.api_server`, docs/models.md), e.g. "
        "http://vllm-searcher:8001. The trainer "
        "always trains with torch; workers reload each new checkpoint into their engine.")
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
        "named corpus and executor, when the constructor declares them. The warm-start "
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
    bench_dir: str = "runs/bench"
    out_dir: str = "runs/run"

    @field_validator("algorithm")
    @classmethod
    def _registered(cls, name: str) -> str:
        get_algorithm(name)  # an unknown name lists the valid ones
        return name

    @model_validator(mode="before")
    @classmethod
    def _workflow_fields(cls, data):
        """What the workflow implies (a turn_team's `agents` from its roles)."""
        if isinstance(data, dict) and isinstance(data.get("workflow"), WorkflowConfig):
            data = {**data, "workflow": data["workflow"].model_dump(exclude_unset=True)}
        if isinstance(data, dict) and isinstance(data.get("workflow"), dict):
            from mgrpo.workflows import prepare_run_data

            return prepare_run_data(data)
        return data

    @property
    def flow(self):
        """The registered :class:`~mgrpo.workflows.Workflow` this run plays."""
        from mgrpo.workflows import get_workflow

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
        self.flow.check(self)  # the hierarchy: a planner; a turn team: its world's roles
        if self.protocol.format != "markup" and self.algo.play != "delegate":
            raise ValueError(f"protocol.format: {self.protocol.format} plays algorithm mgrpo "
                             f"(planner + sub-agents); {self.algorithm} renders the markup "
                             "only (set protocol.format: markup)")
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
        for role, engine in self.engines.items():
            if role not in self.agents:
                raise ValueError(f"engines.{role}: not a role of `agents` "
                                 f"({sorted(self.agents)})")
            if engine not in ("torch", "vllm") and not engine.startswith(("http://",
                                                                           "https://")):
                raise ValueError(f"engines.{role}={engine!r}: use torch, vllm, or the "
                                 "http(s):// URL of an OpenAI-compatible server")
            if engine.startswith(("http://", "https://")) \
                    and self.models[self.agents[role]].lora is not None:
                raise ValueError(f"engines.{role} is a server URL but model "
                                 f"{self.agents[role]!r} trains a LoRA adapter: a server "
                                 "reloads full weights only; use torch or vllm for that role")
        stale = {m: n for m in self.trained_models() if (n := self.staleness(m)) > 0}
        if stale and not self.algo.asynchronous:
            runs = [n for n in algorithm_names() if get_algorithm(n).asynchronous]
            raise ValueError(f"max_staleness {stale}: the asynchronous mode runs "
                             f"{' and '.join(runs)} rounds; {self.algo.title}'s rounds are "
                             "synchronous (set max_staleness: 0 or algorithm: mgrpo)")
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
        if self.loss.kl_in_reward and not self.algo.kl_in_reward:
            takes = [n for n in algorithm_names() if get_algorithm(n).kl_in_reward]
            raise ValueError(f"loss.kl_in_reward with algorithm {self.algorithm}: the KL "
                             f"penalty is applied to {' and '.join(takes)} rewards only; put "
                             "the KL in the loss (kl_in_reward: false, kl_estimator: k3+) or "
                             "use mgrpo")
        if self.loss.eps_low >= 1:
            raise ValueError(f"loss.eps_low={self.loss.eps_low} must be < 1 (clip at 1-eps).")
        return self

    @model_validator(mode="after")
    def _plugins(self) -> RunConfig:
        """Import ``plugins`` and resolve every import-path spec now, so a missing module,
        attribute or wrong signature is refused before anything runs."""
        from mgrpo.plugins import import_plugins

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


def check_plugin_specs(cfg: RunConfig) -> None:
    """Resolve the config's tools, role_tools, verifier and judges (one-line errors naming
    the key, the spec and what was found)."""
    from mgrpo.envs.judges import check_judge_kind
    from mgrpo.envs.verifiers import check_verifier
    from mgrpo.tools import check_tool

    for name in dict.fromkeys([*cfg.tools, *cfg.role_tools.values()]):
        check_tool(name, cfg.tools)
    check_verifier(cfg.verifier)
    for role, judge in cfg.judges.items():
        check_judge_kind(judge.kind, f"judges.{role}.kind")


def apply_overrides(data: dict, overrides: dict) -> dict:
    """``data`` (a run config's fields, changed in place and returned) with ``overrides``
    set: dotted keys (``loss.rollout_is``) reach into sections, as ``--set`` does, and an
    integer reaches into a list (``stages.0.rounds``; the list's length appends an entry).
    A list the data does not hold yet starts as the run config's default."""
    for dotted, value in overrides.items():
        node: dict | list = data
        *parents, leaf = dotted.split(".")
        for depth, key in enumerate(parents):
            missing = _missing_default(parents[:depth + 1])
            if isinstance(node, list):
                index = _list_index(dotted, key, node, allow_append=True)
                if index == len(node):
                    node.append({})
                node = node[index]
            else:
                if key not in node:
                    node[key] = missing
                node = node[key]
            if not isinstance(node, dict | list):
                raise ValueError(f"--set {dotted}: {key!r} is not a section (it is {node!r})")
        if isinstance(node, list):
            index = _list_index(dotted, leaf, node, allow_append=True)
            node[index:index + 1] = [value]
        else:
            node[leaf] = value
    return data


def _list_index(dotted: str, key: str, items: list, allow_append: bool) -> int:
    if not key.isdigit():
        raise ValueError(f"--set {dotted}: {key!r} is not an index of a list of "
                         f"{len(items)} (use 0..{len(items) - 1}, e.g. stages.0.rounds)")
    index = int(key)
    if index > len(items) or (index == len(items) and not allow_append):
        raise ValueError(f"--set {dotted}: index {index} is past the end of a list of "
                         f"{len(items)} (use 0..{len(items)}, {len(items)} appends)")
    return index


def _missing_default(parents: list[str]) -> dict | list:
    """What a section named by ``parents`` starts as when the data lacks it: the run
    config's default for a list field (``stages``), else an empty mapping."""
    if len(parents) == 1 and parents[0] in RunConfig.model_fields:
        default = RunConfig.model_fields[parents[0]].get_default(call_default_factory=True)
        if isinstance(default, list):
            return [item.model_dump() if hasattr(item, "model_dump") else item
                    for item in default]
    return {}
