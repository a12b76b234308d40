"""The run config's smaller sections: curriculum ``stages``, ``judges``, ``verifier_llm``,
the agent ``protocol`` and ``init_from``, with the run id's pattern and the largest
checkpoint version. Read through :mod:`mgrpo.training.config`, which holds the whole run
config.

What this module does NOT do: judge, verify or render anything (``mgrpo.envs``,
``mgrpo.training.judging``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from mgrpo.envs.chat_format import get_tool_call_format
from mgrpo.models.chat_templates import BUILTIN as BUILTIN_TEMPLATES
from mgrpo.models.chat_templates import resolve_chat_template
from mgrpo.validation import StrictModel


class StageConfig(StrictModel):
    """A curriculum stage (docs/configuration.md, 'Run config (YAML)', ``stages``): which training
    questions, for how many rounds.
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
        "...; the tiny models and `mgrpo models import` speak it). chat_template: each agent's "
        "conversation through its tokenizer's chat template, delegations and tool calls as "
        "the model's native tool calls (apply_chat_template(..., tools=...)); no new tokens. "
        "Plays algorithm mgrpo only; refused for a tokenizer without a chat template.")
    tool_call_format: str = Field(
        "hermes", description="chat_template: how tool calls are written in the expert "
        "demonstrations (mgrpo.envs.chat_format.TOOL_CALL_FORMATS; both read either): hermes "
        "= <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> (Qwen2.5, Hermes); "
        "json_list = <tool_call>[{...}]</tool_call> (SmolLM2).")
    chat_template: str | None = Field(
        None, description="chat_template: a built-in template (mgrpo.models.chat_templates: "
        "chatml_tools) that replaces every tokenizer's own, e.g. for a model whose template "
        "drops tools=; None keeps the tokenizer's.")
    chat_template_path: str | None = Field(
        None, description="chat_template: a Jinja file that replaces every tokenizer's "
        "template (TRL's chat_template_path); relative to the config file's folder.")

    @field_validator("tool_call_format")
    @classmethod
    def _known_parser(cls, name: str) -> str:
        get_tool_call_format(name)  # an unknown name lists the valid ones
        return name

    @field_validator("chat_template")
    @classmethod
    def _known_template(cls, name: str | None) -> str | None:
        if name is not None and name not in BUILTIN_TEMPLATES:
            raise ValueError(f"unknown chat_template {name!r}; built-in: "
                             f"{sorted(BUILTIN_TEMPLATES)} (a file: chat_template_path)")
        return name

    @model_validator(mode="after")
    def _one_template(self):
        if self.chat_template and self.chat_template_path:
            raise ValueError("set protocol.chat_template or protocol.chat_template_path, "
                             "not both")
        return self

    def template_text(self) -> str | None:
        """The replacing template's text (None: the tokenizer's own)."""
        source = self.chat_template or self.chat_template_path
        return resolve_chat_template(source) if source else None


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
