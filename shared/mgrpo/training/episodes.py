"""Run multi-agent episodes: a planner delegating to tool sub-agents, batched across episodes.

One call of :meth:`EpisodeRunner.run` plays many episodes (B queries x K rollouts) turn by
turn: every planner turn of every live episode is one batched generation; the delegations
it produces are handed to ``dispatch`` in one list, so sub-agent turns batch too. Contexts
grow by appending token ids (generated: response_mask 1; headers and observations: 0), the
same way the SFT data is tokenised (``mgrpo.models.sft.encode_segments``).

``inline=True`` is the single-agent baseline (docs/algorithm.md, 'Algorithms by mode'): the
planner's own model plays every
sub-agent role inside its own context, so one trajectory holds the whole episode.

Not here: rewards (``mgrpo.training.scoring``), transport (``dispatch`` is injected: in
process for embedded mode, over the bus for the services).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mgrpo import protocol_tokens as T
from mgrpo.engines.base import Completion, Engine, GenerationRequest, SamplingParams
from mgrpo.envs import protocol as P
from mgrpo.envs.turn_formats import Dialogue, MarkupFormat, TurnFormat, build_turn_format
from mgrpo.training.config import SamplingConfig
from mgrpo.types import Trajectory, trajectory_id


@dataclass
class AgentRuntime:
    """What is needed to play one role: its model's engine and tokenizer, and its tool."""

    role: str
    model: str
    engine: Engine
    tokenizer: Any
    tool: Any = None  # mgrpo.tools.Tool for sub-agents
    description: str = ""
    # protocol.format (mgrpo.envs.turn_formats): how contexts render and turns parse;
    # None: the markup
    turn_format: Any = None
    # a sub-agent that delegates: the cards (mgrpo.envs.protocol.AgentCard) of the
    # sub-agents it may call (agents: {role: {model: ..., calls: [...]}}); empty: it does not
    calls: tuple = ()

    def format(self) -> TurnFormat:
        if self.turn_format is None:
            self.turn_format = MarkupFormat(self.tokenizer)
        return self.turn_format


def with_protocol(runtime: AgentRuntime, protocol: Any) -> AgentRuntime:
    """``runtime`` rendering with ``protocol`` (a run config's ``protocol:``, which a round
    may set): ``runtime`` itself when it already does."""
    fmt = runtime.format()
    template = protocol.template_text() if protocol.format == "chat_template" else None
    if (fmt.name, fmt.tool_call_format, getattr(fmt, "template", None)) == (
            protocol.format, protocol.tool_call_format, template):
        return runtime
    return replace(runtime, turn_format=build_turn_format(
        protocol.format, runtime.tokenizer, protocol.tool_call_format, template))


@dataclass
class TokenContext:
    """A growing token sequence with its response mask and behaviour logprobs."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def add_prompt(self, ids: Sequence[int]) -> None:
        self.ids += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def add_generated(self, completion: Completion) -> None:
        self.ids += completion.completion_ids
        self.mask += [1] * len(completion.completion_ids)
        self.logprobs += completion.logprobs


@dataclass
class SubagentCall:
    """One delegation: ``role`` is asked ``task`` by episode ``key`` (its ``invocation``-th
    call of that role)."""

    key: tuple[str, str, int]  # (round_id, query_id, rollout)
    role: str
    task: str
    invocation: int
    seed: int
    attempt: int = 0


@dataclass
class SubagentOutcome:
    result: str  # what goes back to the planner inside <ret>...</ret>
    trajectory: Trajectory | None
    trace: list[dict]
    # the trajectories of the sub-agents this call delegated to, at every depth below it
    children: list[Trajectory] = field(default_factory=list)


Dispatch = Callable[[list[SubagentCall]], list[SubagentOutcome]]


@dataclass
class EpisodeJob:
    question: Any  # mgrpo.envs.Question
    round_id: str
    rollout: int
    seed: int
    attempt: int = 0


@dataclass
class Episode:
    job: EpisodeJob
    planner: Trajectory
    subagents: list[Trajectory]
    answer: str | None
    format_ok: bool
    trace: list[dict]

    @property
    def calls_per_role(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for traj in self.subagents:
            counts[traj.agent] = counts.get(traj.agent, 0) + 1
        for event in self.trace:  # inline mode has no sub-agent trajectories
            if event.get("inline"):
                counts[event["agent"]] = counts.get(event["agent"], 0) + 1
        return counts


def encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def stop_ids(tokenizer: Any, markers: Sequence[str]) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(m) for m in markers]


def mix_seed(*parts: object) -> int:
    """A stable 31-bit seed from parts (Python's hash() is salted per process)."""
    return zlib.crc32("/".join(map(str, parts)).encode()) & 0x7FFFFFFF


def sampling_params(cfg: SamplingConfig, stops: list[int], seed: int,
                    greedy: bool = False) -> SamplingParams:
    return SamplingParams(temperature=0.0 if greedy else cfg.temperature, top_p=cfg.top_p,
                          top_k=cfg.top_k, max_new_tokens=cfg.max_new_tokens,
                          stop_token_ids=stops, seed=seed)


@dataclass
class _EpisodeState:
    job: EpisodeJob
    ctx: TokenContext
    dialogue: Dialogue
    actions: list = field(default_factory=list)  # the planner's parsed turns
    inline_actions: list = field(default_factory=list)  # inline mode: sub-agent turns
    calls: dict[str, int] = field(default_factory=dict)  # role -> calls so far
    subagents: list[Trajectory] = field(default_factory=list)
    trace: list[dict] = field(default_factory=list)
    answer: str | None = None
    done: bool = False
    broken: bool = False
    inline_role: str | None = None  # inline mode: the sub-agent role being played now
    inline_turns: int = 0
    turn: int = 0


class EpisodeRunner:
    """Plays episodes for one planner. ``dispatch`` runs delegations (ignored when inline)."""

    def __init__(self, planner: AgentRuntime, agent_cards: list, sampling: SamplingConfig,
                 dispatch: Dispatch | None = None, inline_tools: dict[str, Any] | None = None):
        if dispatch is None and inline_tools is None:
            raise ValueError("EpisodeRunner needs `dispatch` (multi-agent) or "
                             "`inline_tools` (single-agent baseline).")
        self.planner, self.cards, self.sampling = planner, agent_cards, sampling
        self.dispatch, self.inline_tools = dispatch, inline_tools
        self.format = planner.format()
        if self.inline and not isinstance(self.format, MarkupFormat):
            raise ValueError(f"protocol.format: {self.format.name} plays planner + sub-agents; "
                             "the single-agent baseline (inline) renders the markup only")
        self._sub_stops = stop_ids(planner.tokenizer, T.SUBAGENT_STOPS)

    @property
    def inline(self) -> bool:
        return self.inline_tools is not None

    def run(self, jobs: list[EpisodeJob], greedy: bool = False) -> list[Episode]:
        states = []
        for job in jobs:
            ctx = TokenContext()
            dialogue = self.format.planner(job.question.question, self.cards)
            ctx.add_prompt(dialogue.start_ids())
            states.append(_EpisodeState(job, ctx, dialogue))
        max_steps = self.sampling.planner_max_turns * (
            1 + self.sampling.subagent_max_turns if self.inline else 1)
        for _ in range(max_steps):
            live = [s for s in states if not s.done]
            if not live:
                break
            requests = [self._request(s, greedy) for s in live]
            completions = self.planner.engine.generate(requests)
            pending: list[tuple[_EpisodeState, SubagentCall, str]] = []
            for state, completion in zip(live, completions, strict=True):
                state.ctx.add_generated(completion)
                if state.inline_role is not None:
                    self._inline_subagent_turn(state, completion.text)
                else:
                    call = self._planner_turn(state, completion.text)
                    if call is not None:
                        pending.append((state, call, completion.text))
            if pending:
                outcomes = self.dispatch([call for _, call, _ in pending])
                for (state, call, text), outcome in zip(pending, outcomes, strict=True):
                    state.ctx.add_prompt(state.dialogue.reply_ids(text, call.role,
                                                                  outcome.result))
                    state.trace += outcome.trace
                    if outcome.trajectory is not None:
                        state.subagents.append(outcome.trajectory)
                    state.subagents += outcome.children
        for state in states:
            if not state.done:
                state.broken = True  # ran out of turns without an answer
        return [self._episode(s) for s in states]

    def _request(self, state: _EpisodeState, greedy: bool) -> GenerationRequest:
        stops = self._sub_stops if state.inline_role else state.dialogue.stop_ids
        seed = mix_seed(state.job.seed, "planner", len(state.actions), len(state.inline_actions))
        return GenerationRequest(list(state.ctx.ids),
                                 sampling_params(self.sampling, stops, seed, greedy))

    def _planner_turn(self, state: _EpisodeState, text: str) -> SubagentCall | None:
        action = state.dialogue.parse(text)
        state.actions.append(action)
        state.turn += 1
        # ``raw``: the model's own text of the turn, so a malformed answer can be debugged.
        if action.kind == "answer":
            state.answer, state.done = action.answer, True
            state.trace.append({"agent": "planner", "answer": action.answer, "raw": text})
            return None
        if action.kind != "call" or state.turn >= self.sampling.planner_max_turns:
            why = ("a delegation past planner_max_turns" if action.kind == "call"
                   else "not a valid planner turn (<call>agent|task</call> or "
                   "<answer>...</answer>)" if isinstance(self.format, MarkupFormat)
                   else f"not a valid planner turn: {action.error}")
            state.trace.append({"agent": "planner", "raw": text, "error": why})
            state.done = state.broken = True
            return None
        invocation = state.calls.get(action.agent, 0)
        state.calls[action.agent] = invocation + 1
        state.trace.append({"agent": "planner", "delegate": action.agent, "task": action.task,
                            "raw": text})
        if self.inline:
            if action.agent not in self.inline_tools:
                state.done = state.broken = True
                return None
            state.inline_role, state.inline_turns = action.agent, 0
            state.trace.append({"agent": action.agent, "task": action.task, "inline": True})
            return None
        job = state.job
        return SubagentCall(key=(job.round_id, job.question.id, job.rollout),
                            role=action.agent, task=action.task, invocation=invocation,
                            seed=mix_seed(job.seed, action.agent, invocation),
                            attempt=job.attempt)

    def _inline_subagent_turn(self, state: _EpisodeState, text: str) -> None:
        action = P.parse_subagent_turn(text)
        state.inline_actions.append(action)
        state.inline_turns += 1
        role = state.inline_role
        if action.kind == "return":
            state.inline_role = None
            state.trace.append({"agent": role, "result": action.payload, "raw": text})
        elif action.kind == "tool" and state.inline_turns < self.sampling.subagent_max_turns:
            tool = self.inline_tools[role]
            observation = tool.run(action.payload)
            state.trace.append({"agent": role, "tool": tool.name, "input": action.payload,
                                "observation": observation, "raw": text})
            state.ctx.add_prompt(encode(self.planner.tokenizer, P.render_obs(observation)))
        else:
            state.trace.append({"agent": role, "raw": text, "error": "not a valid turn"})
            state.done = state.broken = True

    def _episode(self, state: _EpisodeState) -> Episode:
        job = state.job
        format_ok = (not state.broken and state.answer is not None
                     and P.planner_format_ok(state.actions,
                                             max_turns=self.sampling.planner_max_turns))
        planner = Trajectory(
            traj_id=trajectory_id(job.round_id, job.question.id, job.rollout, "planner", 0),
            attempt=job.attempt, round_id=job.round_id, query_id=job.question.id,
            rollout=job.rollout, agent="planner", model=self.planner.model,
            weights_version=self.planner.engine.version, input_ids=state.ctx.ids,
            response_mask=state.ctx.mask, old_logprobs=state.ctx.logprobs,
            format_ok=format_ok, result=state.answer)
        return Episode(job=job, planner=planner, subagents=state.subagents,
                       answer=state.answer, format_ok=format_ok, trace=state.trace)
