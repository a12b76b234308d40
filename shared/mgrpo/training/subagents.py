"""The sub-agent loop: given tasks, run each sub-agent's multi-turn tool loop, batched.

Used in process by embedded mode (:class:`LocalSubagentPool` is a ``Dispatch``) and by the
sub-agent service, which receives the same :class:`~mgrpo.training.episodes.SubagentCall`
over the bus. Tool calls of one turn run concurrently in a small thread pool (the python tool
waits on a sandbox process; search is quick).

A sub-agent that delegates (``AgentRuntime.calls``, a nested hierarchy) calls its own
sub-agents through ``dispatch``: the calls of one turn across its invocations go out in one
list, and each outcome's trajectories come back in its own outcome's ``children``. The j-th
call made by invocation i has invocation number :func:`nested_invocation` (i, j), so
trajectory ids stay unique and deterministic at every depth.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from mgrpo.engines.base import GenerationRequest
from mgrpo.envs import protocol as P
from mgrpo.envs.turn_formats import Dialogue
from mgrpo.training.config import SamplingConfig
from mgrpo.training.episodes import (
    AgentRuntime,
    Dispatch,
    SubagentCall,
    SubagentOutcome,
    TokenContext,
    mix_seed,
    sampling_params,
)
from mgrpo.types import Trajectory, trajectory_id

FAILED_RESULT = "none"  # what the planner sees when a sub-agent breaks the protocol


@dataclass
class _CallState:
    call: SubagentCall
    ctx: TokenContext
    dialogue: Dialogue
    actions: list = field(default_factory=list)
    trace: list[dict] = field(default_factory=list)
    last_raw: str = ""  # the model's text of its last turn (the return, or the broken one)
    result: str | None = None
    done: bool = False
    delegated: int = 0  # calls this invocation made to its own sub-agents
    children: list[Trajectory] = field(default_factory=list)


def nested_invocation(parent: int, j: int, stride: int) -> int:
    """The invocation number of the ``j``-th call (``j < stride``) made by invocation
    ``parent`` of a delegating sub-agent: ``parent * stride + j``, with ``stride`` the turn
    limit (``sampling.subagent_max_turns``), so two calls of one role in a rollout never
    share a number."""
    return parent * stride + j


def run_subagent_calls(runtime: AgentRuntime, calls: list[SubagentCall],
                       sampling: SamplingConfig, *, greedy: bool = False,
                       tool_threads: int = 4, dispatch: Dispatch | None = None
                       ) -> list[SubagentOutcome]:
    """Play ``calls`` (all for ``runtime.role``) to the end; one outcome per call, in order.
    ``dispatch`` plays the calls a delegating sub-agent (``runtime.calls``) makes."""
    fmt = runtime.format()
    states = []
    callees = [c.name for c in runtime.calls]
    for call in calls:
        ctx = TokenContext()
        dialogue = (fmt.delegate(runtime.role, call.task, runtime.calls) if callees
                    else fmt.subagent(runtime.role, call.task, runtime.tool, runtime.description))
        ctx.add_prompt(dialogue.start_ids())
        states.append(_CallState(call, ctx, dialogue))
    stride = sampling.subagent_max_turns
    with ThreadPoolExecutor(max_workers=tool_threads) as pool:
        for turn in range(sampling.subagent_max_turns):
            live = [s for s in states if not s.done]
            if not live:
                break
            requests = [GenerationRequest(s.ctx.ids, sampling_params(
                sampling, s.dialogue.stop_ids, mix_seed(s.call.seed, runtime.role, turn), greedy))
                for s in live]
            tool_jobs, delegations = [], []
            for state, completion in zip(live, runtime.engine.generate(requests), strict=True):
                state.ctx.add_generated(completion)
                action = state.dialogue.parse(completion.text)
                state.actions.append(action)
                raw = state.last_raw = completion.text  # traced: malformed turns debuggable
                if action.kind == "return":
                    state.result, state.done = action.payload, True
                elif action.kind == "tool" and runtime.tool is not None:
                    tool_jobs.append((state, action.payload, raw,
                                      pool.submit(runtime.tool.run, action.payload)))
                elif action.kind == "call" and dispatch is not None and turn + 1 < stride:
                    call = state.call
                    j, state.delegated = state.delegated, state.delegated + 1
                    delegations.append((state, raw, SubagentCall(
                        key=call.key, role=action.agent, task=action.payload,
                        invocation=nested_invocation(call.invocation, j, stride),
                        seed=mix_seed(call.seed, action.agent, j), attempt=call.attempt)))
                else:  # invalid turn, or a call on the last turn: the protocol is broken
                    state.done = True
            if delegations:
                outcomes = dispatch([sub for _, _, sub in delegations])
                for (state, raw, sub), outcome in zip(delegations, outcomes, strict=True):
                    state.trace.append({"agent": runtime.role, "delegate": sub.role,
                                        "task": sub.task, "observation": outcome.result,
                                        "raw": raw, "calls": outcome.trace})
                    state.ctx.add_prompt(state.dialogue.reply_ids(raw, sub.role,
                                                                  outcome.result))
                    if outcome.trajectory is not None:
                        state.children.append(outcome.trajectory)
                    state.children += outcome.children
            for state, payload, raw, future in tool_jobs:
                observation = future.result()
                state.trace.append({"agent": runtime.role, "tool": runtime.tool.name,
                                    "input": payload, "observation": observation,
                                    "raw": raw})
                state.ctx.add_prompt(state.dialogue.reply_ids(raw, runtime.tool.name,
                                                              observation))
    return [_outcome(runtime, s, sampling.subagent_max_turns) for s in states]


def _outcome(runtime: AgentRuntime, state: _CallState, max_turns: int) -> SubagentOutcome:
    call = state.call
    round_id, query_id, rollout = call.key
    format_ok = state.result is not None and P.subagent_format_ok(state.actions,
                                                                  max_turns=max_turns)
    trajectory = Trajectory(
        traj_id=trajectory_id(round_id, query_id, rollout, runtime.role, call.invocation),
        attempt=call.attempt, round_id=round_id, query_id=query_id, rollout=rollout,
        agent=runtime.role, model=runtime.model, invocation=call.invocation,
        weights_version=runtime.engine.version, input_ids=state.ctx.ids,
        response_mask=state.ctx.mask, old_logprobs=state.ctx.logprobs, format_ok=format_ok,
        subtask=call.task, result=state.result,
        # the LLM judge's evidence (mgrpo.envs.judges): what the tools returned to this call
        extra={"observations": [str(step["observation"]) for step in state.trace]})
    result = state.result if state.result is not None else FAILED_RESULT
    trace = [{"agent": runtime.role, "invocation": call.invocation, "task": call.task,
              "result": result, "format_ok": format_ok, "steps": state.trace,
              "raw": state.last_raw}]
    return SubagentOutcome(result=result, trajectory=trajectory, trace=trace,
                           children=state.children)


class LocalSubagentPool:
    """In-process dispatch: batches each role's calls through its own runtime. ``entry``:
    the roles the planner may call (default: every runtime's); a delegating sub-agent's
    calls go through the same pool, to the roles it lists."""

    def __init__(self, runtimes: dict[str, AgentRuntime], sampling: SamplingConfig,
                 greedy: bool = False, entry: list[str] | None = None):
        self.runtimes, self.sampling, self.greedy = runtimes, sampling, greedy
        self.entry = set(runtimes) if entry is None else set(entry)

    def __call__(self, calls: list[SubagentCall]) -> list[SubagentOutcome]:
        return self.play(calls, self.entry)

    def play(self, calls: list[SubagentCall], allowed: set[str]) -> list[SubagentOutcome]:
        outcomes: list[SubagentOutcome | None] = [None] * len(calls)
        for role, runtime in self.runtimes.items():
            picked = [i for i, c in enumerate(calls) if c.role == role and role in allowed]
            if picked:
                nested = {c.name for c in runtime.calls}
                done = run_subagent_calls(
                    runtime, [calls[i] for i in picked], self.sampling, greedy=self.greedy,
                    dispatch=(lambda sub, nested=nested: self.play(sub, nested))
                    if nested else None)
                for i, outcome in zip(picked, done, strict=True):
                    outcomes[i] = outcome
        for i, call in enumerate(calls):
            if outcomes[i] is None:  # the planner named an agent that does not exist
                outcomes[i] = SubagentOutcome(
                    result=FAILED_RESULT, trajectory=None,
                    trace=[{"agent": call.role, "task": call.task, "error": "unknown agent"}])
        return outcomes  # type: ignore[return-value]
