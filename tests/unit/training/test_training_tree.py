"""AT-GRPO tree sampling with scripted agents: candidates, turn rewards, greedy continuation,
(query, agent, turn) groups and their advantages, checked against hand numbers."""

from __future__ import annotations

from collections import Counter

import pytest
from training_testkit import ScriptedEngine

from mgrpo.envs import protocol as P
from mgrpo.envs.rewards import RuleExpertJudge
from mgrpo.training.config import RunConfig
from mgrpo.training.episodes import AgentRuntime
from mgrpo.training.tree import TreeSampler
from mgrpo.training.tree_round import at_grpo_samples

S3 = 3 ** 0.5  # K=4 with one winner: (1 - 1/4) / sqrt(3/16) = sqrt(3); losers -1/sqrt(3)


def _options(question):
    """The four candidates each state offers, in request order (candidate k = option k)."""
    sub = question.subtasks[0]
    return {
        ("planner", 0): ["<call>searcher|zzz</call>x", P.render_call("searcher", sub.task),
                         P.render_call("searcher", "age of Nobody"), P.render_answer("wrong")],
        ("searcher", 0): [P.render_tool(sub.task), P.render_tool("qqq zzz"), "oops",
                          P.render_return("1")],
        ("searcher", 1): [P.render_return(sub.answer), P.render_return("1"),
                          P.render_return(sub.answer), "oops"],
        ("planner", 1): [P.render_answer("wrong"), P.render_answer(question.answer), "x", "y"],
    }


def _engine(tokenizer, question, role, options=None):
    options = options or _options(question)
    seen: Counter = Counter()

    def respond(prompt, params):
        text = tokenizer.decode(prompt)
        turn = text.count("<obs>") if role == "searcher" else text.count("<ret>")
        key = tuple(prompt)
        choice = options.get((role, turn), [P.render_answer("wrong")] * 4)[seen[key] % 4]
        seen[key] += 1
        return tokenizer.encode(choice, add_special_tokens=False)

    return ScriptedEngine(tokenizer, respond)


@pytest.fixture
def tree(bench, tools, tokenizer):
    question = next(q for q in bench.questions("train", stage=1)
                    if len(q.subtasks) == 1 and q.subtasks[0].agent == "searcher")
    cfg = RunConfig(models={m: {"path": "unused"} for m in ("planner", "searcher", "coder")},
                    k=4, at_grpo_alpha=0.5, algorithm="at_grpo")
    runtimes = {r: AgentRuntime(r, r, _engine(tokenizer, question, r), tokenizer,
                                tool=tools.get(r)) for r in ("planner", "searcher")}
    sampler = TreeSampler(runtimes, [P.DEFAULT_AGENTS[0]], cfg, RuleExpertJudge(bench))
    (episode,) = sampler.run("r0", [question], seed=0)
    return question, cfg, episode


def test_tree_continues_from_the_best_candidate(tree):
    question, _, episode = tree
    assert episode.answer == question.answer and episode.format_ok
    assert [t["agent"] for t in episode.trace] == ["planner", "searcher", "planner"]
    assert episode.trace[1]["input"] == question.subtasks[0].task  # the gold query won
    groups = Counter((t.agent, t.turn) for t in episode.candidates)
    assert groups == {("planner", 0): 4, ("searcher", 0): 4, ("searcher", 1): 4,
                      ("planner", 1): 4}
    chosen = {(t.agent, t.turn): t.rollout for t in episode.candidates if t.extra["chosen"]}
    assert chosen == {("planner", 0): 1, ("searcher", 0): 0, ("searcher", 1): 0,
                      ("planner", 1): 1}  # ties (searcher turn 1) go to the lowest k


def test_turn_rewards_by_hand(tree):
    _, _, episode = tree
    rewards = {(t.agent, t.turn, t.rollout): t.reward for t in episode.candidates}
    # r = 0.5 * r_team + r_local
    assert [rewards[("planner", 0, k)] for k in range(4)] == [0.0, 1.0, 0.0, 0.0]
    assert [rewards[("searcher", 0, k)] for k in range(4)] == [1.0, 0.0, 0.0, 0.0]
    assert [rewards[("searcher", 1, k)] for k in range(4)] == [1.5, 0.0, 1.5, 0.0]
    assert [rewards[("planner", 1, k)] for k in range(4)] == [0.0, 1.5, 0.0, 0.0]


def test_candidates_are_state_plus_action(tree, tokenizer):
    _, _, episode = tree
    by_group: dict = {}
    for t in episode.candidates:
        by_group.setdefault((t.agent, t.turn), []).append(t)
        assert len(t.input_ids) == len(t.response_mask) == len(t.old_logprobs)
        n = sum(t.response_mask)
        assert t.response_mask == [0] * (len(t.input_ids) - n) + [1] * n
        assert t.traj_id == f"r0/{t.query_id}/{t.rollout}/{t.agent}/0/t{t.turn}"
    for group in by_group.values():  # the K candidates of a group share one state
        states = {tuple(t.input_ids[:len(t.input_ids) - sum(t.response_mask)]) for t in group}
        assert len(states) == 1
    last = by_group[("planner", 1)][0]
    assert "<ret>" in tokenizer.decode(last.input_ids)


def test_group_advantages_by_hand(tree):
    _, cfg, episode = tree
    samples, stats = at_grpo_samples(episode.candidates, cfg)
    adv = {(s.trajectory.agent, s.trajectory.turn, s.trajectory.rollout): s.advantage
           for s in samples}
    loser = -1 / S3
    assert [adv[("planner", 0, k)] for k in range(4)] == pytest.approx([loser, S3, loser, loser],
                                                                       abs=1e-4)
    assert [adv[("searcher", 1, k)] for k in range(4)] == pytest.approx([1, -1, 1, -1],
                                                                        abs=1e-4)
    keys = {s.group_key: (s.n, round(s.mean, 4), round(s.std, 4)) for s in stats}
    qid = episode.question.id
    assert keys == {f"{qid}|planner|t0": (4, 0.25, round(0.1875 ** 0.5, 4)),
                    f"{qid}|planner|t1": (4, 0.375, round(0.421875 ** 0.5, 4)),
                    f"{qid}|searcher|t0": (4, 0.25, round(0.1875 ** 0.5, 4)),
                    f"{qid}|searcher|t1": (4, 0.75, 0.75)}


def test_samples_reject_trajectories_without_turn_rewards(tree):
    _, cfg, episode = tree
    bare = episode.candidates[0].model_copy(update={"reward": None})
    with pytest.raises(ValueError, match="need `reward` and `turn`"):
        at_grpo_samples([bare], cfg)


def test_redelegating_a_solved_subtask_earns_nothing(bench, tools, tokenizer):
    """Issue 10.6: a planner call that hands an agent a subtask it has already solved in
    this episode made no progress; it scored r_local = 1.0 every turn, so looping could beat
    answering (here: 1.0 for the repeat vs 0.0 for a wrong answer). Only the FIRST call of
    a gold subtask (or one after failed attempts) pays."""
    question = _one_searcher_question(bench)
    options = _options(question)
    options[("planner", 1)] = [P.render_call("searcher", question.subtasks[0].task),
                               P.render_answer("wrong"), "x",
                               P.render_call("searcher", "age of Nobody")]
    rewards = _tree_rewards(bench, tools, tokenizer, question, options)
    assert [rewards[("planner", 0, k)] for k in range(4)] == [0.0, 1.0, 0.0, 0.0]
    assert rewards[("searcher", 1, 0)] == 1.5  # the first call was solved
    assert [rewards[("planner", 1, k)] for k in range(4)] == [0.0, 0.0, 0.0, 0.0]


def test_redelegating_an_unsolved_subtask_still_pays(bench, tools, tokenizer):
    """A retry after the sub-agent failed is progress the planner may still earn."""
    question = _one_searcher_question(bench)
    options = _options(question)
    options[("searcher", 1)] = [P.render_return("1")] * 4  # the first call fails
    options[("planner", 1)] = [P.render_call("searcher", question.subtasks[0].task),
                               P.render_answer("wrong"), "x", "y"]
    rewards = _tree_rewards(bench, tools, tokenizer, question, options)
    assert [rewards[("planner", 1, k)] for k in range(4)] == [1.0, 0.0, 0.0, 0.0]


def _one_searcher_question(bench):
    return next(q for q in bench.questions("train", stage=1)
                if len(q.subtasks) == 1 and q.subtasks[0].agent == "searcher")


def _tree_rewards(bench, tools, tokenizer, question, options) -> dict:
    """AT-GRPO's tree on one question with scripted candidates (K = 4, alpha 0.5): each
    candidate's reward by (agent, turn, rollout)."""
    cfg = RunConfig(models={m: {"path": "unused"} for m in ("planner", "searcher", "coder")},
                    k=4, at_grpo_alpha=0.5, algorithm="at_grpo")
    runtimes = {r: AgentRuntime(r, r, _engine(tokenizer, question, r, options), tokenizer,
                                tool=tools.get(r)) for r in ("planner", "searcher")}
    sampler = TreeSampler(runtimes, [P.DEFAULT_AGENTS[0]], cfg, RuleExpertJudge(bench))
    (episode,) = sampler.run("r0", [question], seed=0)
    return {(t.agent, t.turn, t.rollout): t.reward for t in episode.candidates}
