"""Turn limits come from the run config (``sampling.*_max_turns``) alone: the runner's stop
and the format check (r_format) use the same number, in the sub-agent loop (embedded and the
sub-agent service both call ``run_subagent_calls``) and in the planner's episode loop."""

from __future__ import annotations

from training_testkit import ScriptedEngine, text_responder

from mgrpo.envs import protocol as P
from mgrpo.store.records import PlannerOutcomeIn
from mgrpo.training.config import SamplingConfig
from mgrpo.training.episodes import AgentRuntime, EpisodeJob, EpisodeRunner, SubagentCall
from mgrpo.training.scoring import subagent_rewards
from mgrpo.training.subagents import LocalSubagentPool, run_subagent_calls


def _searcher(tokenizer, tools, tool_turns: int) -> AgentRuntime:
    def turn(text: str, params) -> str:
        return (P.render_tool("Velmora") if text.count("<obs>") < tool_turns
                else P.render_return("v1"))
    return AgentRuntime("searcher", "searcher", ScriptedEngine(
        tokenizer, text_responder(tokenizer, turn)), tokenizer, tool=tools["searcher"])


def _call() -> SubagentCall:
    return SubagentCall(key=("r1", "q1", 0), role="searcher", task="population of Velmora",
                        invocation=0, seed=1)


class _Judge:
    def judge(self, agent, task, result):
        return 1.0


def test_subagent_format_follows_subagent_max_turns(tokenizer, tools):
    """Four tool calls and a return within subagent_max_turns=5 are a valid trajectory
    (main used a hidden cap of 4 turns in the format check: R_S was 0)."""
    sampling = SamplingConfig(subagent_max_turns=5)
    [out] = run_subagent_calls(_searcher(tokenizer, tools, 4), [_call()], sampling)
    assert out.result == "v1" and out.trajectory.format_ok
    outcome = PlannerOutcomeIn(query_id="q1", rollout=0, attempt=0, format_ok=True,
                               correct=1.0, reward=1.0)
    assert subagent_rewards([out.trajectory], {("q1", 0): outcome}, _Judge(),
                            (0.1, 0.4, 0.5)) == [1.0]
    # One turn fewer in the budget: the fifth turn is never sampled, no return -> invalid.
    [short] = run_subagent_calls(_searcher(tokenizer, tools, 4), [_call()],
                                 SamplingConfig(subagent_max_turns=4))
    assert short.result == "none" and not short.trajectory.format_ok


def test_planner_format_follows_planner_max_turns(bench, tools, tokenizer):
    """Eight delegations and an answer within planner_max_turns=9 are a valid episode
    (main used a hidden cap of 8 planner turns in the format check)."""
    def planner_turn(text: str, params) -> str:
        return (P.render_call("searcher", "population of Velmora") if text.count("<ret>") < 8
                else P.render_answer("done"))
    sampling = SamplingConfig(planner_max_turns=9, subagent_max_turns=2)
    planner = AgentRuntime("planner", "planner", ScriptedEngine(
        tokenizer, text_responder(tokenizer, planner_turn)), tokenizer)
    runner = EpisodeRunner(planner, [P.DEFAULT_AGENTS[0]], sampling, dispatch=LocalSubagentPool(
        {"searcher": _searcher(tokenizer, tools, 1)}, sampling))
    [ep] = runner.run([EpisodeJob(bench.questions("train")[0], "r1", 0, seed=3)])
    assert ep.answer == "done" and len(ep.subagents) == 8 and ep.format_ok
    assert all(t.format_ok for t in ep.subagents)
    # planner_max_turns=8: the eighth turn is a call, no turn is left to answer -> invalid.
    sampling = SamplingConfig(planner_max_turns=8, subagent_max_turns=2)
    runner = EpisodeRunner(planner, [P.DEFAULT_AGENTS[0]], sampling, dispatch=LocalSubagentPool(
        {"searcher": _searcher(tokenizer, tools, 1)}, sampling))
    [ep] = runner.run([EpisodeJob(bench.questions("train")[0], "r1", 0, seed=3)])
    assert ep.answer is None and not ep.format_ok
