"""The sub-agent loop: given tasks, run each sub-agent's multi-turn tool loop, batched.

Used in process by embedded mode (:class:`LocalSubagentPool` is a ``Dispatch``) and by the
sub-agent service, which receives the same :class:`~mgrpo.training.episodes.SubagentCall`
over the bus. Tool calls of one turn run concurrently in a small thread pool (the python tool
waits on a sandbox process; search is quick).
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


def run_subagent_calls(runtime: AgentRuntime, calls: list[SubagentCall],
                       sampling: SamplingConfig, *, greedy: bool = False,
                       tool_threads: int = 4) -> list[SubagentOutcome]:
    """Play ``calls`` (all for ``runtime.role``) to the end; one outcome per call, in order."""
    fmt = runtime.format()
    states = []
    for call in calls:
        ctx = TokenContext()
        dialogue = fmt.subagent(runtime.role, call.task, runtime.tool, runtime.description)
        ctx.add_prompt(dialogue.start_ids())
        states.append(_CallState(call, ctx, dialogue))
    with ThreadPoolExecutor(max_workers=tool_threads) as pool:
        for turn in range(sampling.subagent_max_turns):
            live = [s for s in states if not s.done]
            if not live:
                break
            requests = [GenerationRequest(s.ctx.ids, sampling_params(
                sampling, s.dialogue.stop_ids, mix_seed(s.call.seed, runtime.role, turn), greedy))
                for s in live]
            tool_jobs = []
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
                else:
                    state.done = True  # invalid turn: the protocol is broken, stop here
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
    trace = [{"agent": runtime.role, "task": call.task, "result": result,
              "format_ok": format_ok, "steps": state.trace, "raw": state.last_raw}]
    return SubagentOutcome(result=result, trajectory=trajectory, trace=trace)


class LocalSubagentPool:
    """In-process dispatch: batches each role's calls through its own runtime."""

    def __init__(self, runtimes: dict[str, AgentRuntime], sampling: SamplingConfig,
                 greedy: bool = False):
        self.runtimes, self.sampling, self.greedy = runtimes, sampling, greedy

    def __call__(self, calls: list[SubagentCall]) -> list[SubagentOutcome]:
        outcomes: list[SubagentOutcome | None] = [None] * len(calls)
        for role, runtime in self.runtimes.items():
            picked = [i for i, c in enumerate(calls) if c.role == role]
            if picked:
                done = run_subagent_calls(runtime, [calls[i] for i in picked], self.sampling,
                                          greedy=self.greedy)
                for i, outcome in zip(picked, done, strict=True):
                    outcomes[i] = outcome
        for i, call in enumerate(calls):
            if outcomes[i] is None:  # the planner named an agent that does not exist
                outcomes[i] = SubagentOutcome(
                    result=FAILED_RESULT, trajectory=None,
                    trace=[{"agent": call.role, "task": call.task, "error": "unknown agent"}])
        return outcomes  # type: ignore[return-value]
