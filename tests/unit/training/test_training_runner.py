"""EpisodeRunner bookkeeping with scripted agents: ids, masks, logprobs and trajectory ids."""

from __future__ import annotations

from training_testkit import ScriptedEngine, fake_logprob, text_responder

from mgrpo.envs import protocol as P
from mgrpo.training.config import SamplingConfig
from mgrpo.training.episodes import AgentRuntime, EpisodeJob, EpisodeRunner, encode
from mgrpo.training.subagents import LocalSubagentPool


def _planner_turn(text: str, params) -> str:
    rets = text.count("<ret>")
    return [P.render_call("searcher", "task a"), P.render_call("searcher", "task b"),
            P.render_answer("done")][rets]


def _searcher_turn(text: str, params) -> str:
    return P.render_tool("Velmora") if "<obs>" not in text else P.render_return("v1")


def _play(bench, tools, tokenizer, rollout=0):
    planner = AgentRuntime("planner", "planner", ScriptedEngine(
        tokenizer, text_responder(tokenizer, _planner_turn), version=7), tokenizer)
    searcher = AgentRuntime("searcher", "searcher-model", ScriptedEngine(
        tokenizer, text_responder(tokenizer, _searcher_turn), version=3), tokenizer,
        tool=tools["searcher"])
    sampling = SamplingConfig()
    runner = EpisodeRunner(planner, [P.DEFAULT_AGENTS[0]], sampling,
                           dispatch=LocalSubagentPool({"searcher": searcher}, sampling))
    question = bench.questions("train")[0]
    return question, runner.run([EpisodeJob(question, "r9", rollout, seed=5)])[0]


def _expected(tokenizer, pieces):
    """(ids, mask, logprobs) from [(text, generated?)] encoded piece by piece."""
    ids, mask, logprobs = [], [], []
    for text, generated in pieces:
        piece = encode(tokenizer, text)
        logprobs += [fake_logprob(len(ids) + i) if generated else 0.0 for i in range(len(piece))]
        ids += piece
        mask += [int(generated)] * len(piece)
    return ids, mask, logprobs


def test_planner_context_is_built_exactly(bench, tools, tokenizer):
    question, ep = _play(bench, tools, tokenizer)
    ids, mask, logprobs = _expected(tokenizer, [
        (P.planner_header(question.question, [P.DEFAULT_AGENTS[0]]), False),
        (P.render_call("searcher", "task a"), True), (P.render_ret("v1"), False),
        (P.render_call("searcher", "task b"), True), (P.render_ret("v1"), False),
        (P.render_answer("done"), True)])
    assert ep.planner.input_ids == ids and ep.planner.response_mask == mask
    assert ep.planner.old_logprobs == logprobs
    assert ep.answer == "done" and ep.format_ok and ep.planner.weights_version == 7


def test_subagent_trajectories_are_built_exactly(bench, tools, tokenizer):
    _, ep = _play(bench, tools, tokenizer)
    assert [t.subtask for t in ep.subagents] == ["task a", "task b"]
    observation = tools["searcher"].run("Velmora")
    for traj, task in zip(ep.subagents, ["task a", "task b"], strict=True):
        ids, mask, logprobs = _expected(tokenizer, [
            (P.subagent_header("searcher", task), False), (P.render_tool("Velmora"), True),
            (P.render_obs(observation), False), (P.render_return("v1"), True)])
        assert traj.input_ids == ids and traj.response_mask == mask
        assert traj.old_logprobs == logprobs
        assert traj.model == "searcher-model" and traj.weights_version == 3
        assert traj.result == "v1" and traj.format_ok


def test_trajectory_ids_are_deterministic(bench, tools, tokenizer):
    question, ep = _play(bench, tools, tokenizer, rollout=2)
    _, again = _play(bench, tools, tokenizer, rollout=2)
    assert ep.planner.traj_id == f"r9/{question.id}/2/planner/0"
    assert [t.traj_id for t in ep.subagents] == [f"r9/{question.id}/2/searcher/0",
                                                 f"r9/{question.id}/2/searcher/1"]
    assert [t.traj_id for t in again.subagents] == [t.traj_id for t in ep.subagents]
    assert again.planner.input_ids == ep.planner.input_ids
