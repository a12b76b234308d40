"""AT-GRPO tree sampling (docs/algorithm.md, '1.5 AT-GRPO'; Stronger-MAS, Zhao et al., arXiv
2510.11062).

One tree per query. At each turn t of each agent i, K candidate actions are sampled from the
SAME state (K requests on one context, seeds differing by candidate); each is scored with the
turn reward ``r = alpha * r_team + r_local`` (``mgrpo.algo.mix_turn_reward``) and the episode
continues from the best one (``mgrpo.algo.greedy_choice``, ties to the lowest k). Every
candidate becomes a training sample: its state (mask 0) plus its action (mask 1), grouped by
the key (query, agent, turn) with ``mgrpo.algo.at_grpo_advantages``.

Turn rewards, and how they differ from the paper (which leaves both to the environment):

- ``r_local`` (the agent's own step, ground truth from the benchmark): planner ->
  ``planner_turn_reward`` (a call that names a gold subtask not yet solved in this episode,
  or a correct answer; re-delegating a solved subtask earns 0, so looping does not pay);
  searcher tool turn -> ``searcher_turn_reward`` (a gold document retrieved); any other tool turn ->
  its observation equals the task's true answer; a return -> r_expert (``RuleExpertJudge``:
  the true answer to the task it was given); an invalid turn -> 0.
- ``r_team`` must be known at branch time, before the episode that follows the candidate is
  played (only the chosen candidate is continued, so a rollout's final correctness exists for
  one candidate per group, not all K). We use the team progress the turn itself makes,
  judged by ground truth: a planner answer -> its exact match with the gold answer; a
  sub-agent return -> 1 if the value is the gold answer of one of the question's subtasks
  (the team needs it); calls and tool turns -> 0. Not the final outcome of a continued
  rollout: that would cost K continuations per turn.
- ``turn`` of the group key counts an agent's decisions across the whole episode (a
  searcher's second call starts at the turn after its first call's last), so a group is
  always K candidates of one state.

Sub-agent subtrees (a delegation's K-candidate turns until it returns) are played by
``subtree(calls, round_id, seed)``: by default :meth:`TreeSampler._subagent_tree` in this
process (the sub-agents' runtimes); the services pass one that sends each call to its
sub-agent worker, which plays the same method there (``mgrpo.services.tree_calls``). A
subtree sets each call's ``result``, ``solved`` (r_expert of the result: the planner's
``solved`` set) and the episode's turn counter of that agent.

What this module does not do: the policy update (``mgrpo.training.update``), advantages and
the round (``mgrpo.training.tree_round``), evaluation (the ordinary runner plays the trained
policies), or checkpoints (``mgrpo.training.loop``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from mgrpo import protocol_tokens as T
from mgrpo.algo import greedy_choice, mix_turn_reward
from mgrpo.engines.base import Completion, GenerationRequest
from mgrpo.envs import protocol as P
from mgrpo.envs.rewards import (
    exact_match,
    normalize_answer,
    planner_turn_reward,
    searcher_turn_reward,
)
from mgrpo.training.config import RunConfig
from mgrpo.training.episodes import (
    AgentRuntime,
    TokenContext,
    encode,
    mix_seed,
    sampling_params,
    stop_ids,
)
from mgrpo.training.subagents import FAILED_RESULT
from mgrpo.types import Trajectory, trajectory_id


@dataclass
class TreeEpisode:
    """One query's tree: every candidate of every turn, and the greedy path's outcome."""

    question: Any
    candidates: list[Trajectory] = field(default_factory=list)
    answer: str | None = None
    format_ok: bool = False
    trace: list[dict] = field(default_factory=list)
    ctx: TokenContext = field(default_factory=TokenContext)
    turns: dict[str, int] = field(default_factory=dict)  # agent -> decisions so far
    calls: dict[str, int] = field(default_factory=dict)  # role -> invocations so far
    solved: set[tuple[str, str]] = field(default_factory=set)  # (agent, normalized task)
    done: bool = False

    def next_turn(self, agent: str) -> int:
        turn = self.turns.get(agent, 0)
        self.turns[agent] = turn + 1
        return turn


@dataclass
class Branch:
    """One state to branch from: its context, who acts, and where the group's samples go."""

    episode: TreeEpisode
    ctx: TokenContext
    agent: str
    invocation: int = 0
    task: str | None = None
    result: str | None = None
    done: bool = False
    solved: bool = False  # the result judged right (r_expert): the planner's ``solved`` set


@dataclass
class Scored:
    completion: Completion
    action: Any
    r_team: float
    r_local: float
    observation: str | None = None


class TreeSampler:
    """Plays AT-GRPO trees for a batch of queries with the system's agent runtimes."""

    def __init__(self, runtimes: dict[str, AgentRuntime], cards: list, cfg: RunConfig,
                 judge: Any, subtree: Any = None):
        self.runtimes, self.cards, self.cfg, self.judge = runtimes, cards, cfg, judge
        self.subtree = subtree or self._subagent_tree

    def run(self, round_id: str, questions: list, seed: int) -> list[TreeEpisode]:
        planner = self.runtimes["planner"]
        episodes = []
        for q in questions:
            ep = TreeEpisode(question=q)
            ep.ctx.add_prompt(encode(planner.tokenizer, P.planner_header(q.question, self.cards)))
            episodes.append(ep)
        for _ in range(self.cfg.sampling.planner_max_turns):
            live = [Branch(ep, ep.ctx, "planner") for ep in episodes if not ep.done]
            if not live:
                break
            calls = []
            for branch, best in zip(live, self._branch(planner, live, round_id, seed),
                                    strict=True):
                call = self._planner_step(branch, best)
                if call is not None:
                    calls.append(call)
            for role in dict.fromkeys(c.agent for c in calls):
                self.subtree([c for c in calls if c.agent == role], round_id, seed)
            for call in calls:
                if call.solved:
                    call.episode.solved.add((call.agent, normalize_answer(call.task or "")))
                result = call.result if call.result is not None else FAILED_RESULT
                call.episode.ctx.add_prompt(encode(planner.tokenizer, P.render_ret(result)))
        return episodes

    # -- branching --------------------------------------------------------------------------
    def _branch(self, runtime: AgentRuntime, branches: list[Branch], round_id: str,
                seed: int) -> list[Scored]:
        """K candidates per branch, each scored and stored; returns each branch's best."""
        k = self.cfg.k
        stops = stop_ids(runtime.tokenizer, T.PLANNER_STOPS if runtime.role == "planner"
                         else T.SUBAGENT_STOPS)
        turns = [b.episode.next_turn(b.agent) for b in branches]
        requests = [GenerationRequest(list(b.ctx.ids), sampling_params(
            self.cfg.sampling, stops, mix_seed(seed, round_id, b.episode.question.id, b.agent,
                                               turn, c)))
                    for b, turn in zip(branches, turns, strict=True) for c in range(k)]
        completions = runtime.engine.generate(requests)
        best_of = []
        for i, (branch, turn) in enumerate(zip(branches, turns, strict=True)):
            scored = [self._score(runtime, branch, c) for c in completions[i * k:(i + 1) * k]]
            rewards = torch.tensor([float(mix_turn_reward(s.r_team, s.r_local,
                                                          self.cfg.at_grpo_alpha))
                                    for s in scored])
            best = int(greedy_choice(rewards, torch.zeros(k, dtype=torch.long))[0])
            for c, (s, r) in enumerate(zip(scored, rewards.tolist(), strict=True)):
                branch.episode.candidates.append(
                    self._trajectory(runtime, branch, round_id, turn, c, s, r, c == best))
            best_of.append(scored[best])
        return best_of

    def _trajectory(self, runtime: AgentRuntime, branch: Branch, round_id: str, turn: int,
                    candidate: int, s: Scored, reward: float, chosen: bool) -> Trajectory:
        ctx, ids = branch.ctx, s.completion.completion_ids
        qid = branch.episode.question.id
        base = trajectory_id(round_id, qid, candidate, branch.agent, branch.invocation)
        return Trajectory(
            traj_id=f"{base}/t{turn}", round_id=round_id, query_id=qid, rollout=candidate,
            agent=branch.agent, model=runtime.model, invocation=branch.invocation,
            weights_version=runtime.engine.version, turn=turn,
            input_ids=ctx.ids + ids, response_mask=[0] * len(ctx.ids) + [1] * len(ids),
            old_logprobs=[0.0] * len(ctx.ids) + list(s.completion.logprobs),
            format_ok=s.action.kind != "invalid", subtask=branch.task,
            result=getattr(s.action, "payload", None) or getattr(s.action, "answer", None),
            reward=reward, extra={"r_team": s.r_team, "r_local": s.r_local, "chosen": chosen})

    # -- turn rewards -----------------------------------------------------------------------
    def _score(self, runtime: AgentRuntime, branch: Branch, completion: Completion) -> Scored:
        question = branch.episode.question
        if branch.agent == "planner":
            action = P.parse_planner_turn(completion.text)
            team = exact_match(action.answer, question.answer) if action.kind == "answer" \
                else 0.0
            return Scored(completion, action, team,
                          planner_turn_reward(question, action, branch.episode.solved))
        action = P.parse_subagent_turn(completion.text)
        if action.kind == "return":
            gold = {normalize_answer(st.answer) for st in question.subtasks}
            team = float(normalize_answer(action.payload) in gold)
            local = float(self.judge.judge(branch.agent, branch.task or "", action.payload))
            return Scored(completion, action, team, local)
        if action.kind == "tool" and runtime.tool is not None:
            observation = runtime.tool.run(action.payload)
            if hasattr(runtime.tool, "retrieve"):
                docs = [d.id for d in runtime.tool.retrieve(action.payload)]
                local = searcher_turn_reward(question, action.payload, docs)
            else:
                truth = self.judge.truth(branch.agent, branch.task or "")
                local = exact_match(observation, truth) if truth is not None else 0.0
            return Scored(completion, action, 0.0, float(local), observation)
        return Scored(completion, action, 0.0, 0.0)

    # -- continuing from the best candidate -------------------------------------------------
    def _planner_step(self, branch: Branch, best: Scored) -> Branch | None:
        ep, action = branch.episode, best.action
        ep.ctx.add_generated(best.completion)
        if action.kind == "answer":
            ep.answer, ep.done = action.answer, True
            ep.format_ok = True
            ep.trace.append({"agent": "planner", "answer": action.answer})
            return None
        planner_turns = ep.turns.get("planner", 0)
        if action.kind != "call" or action.agent not in self.cfg.agents or \
                action.agent == "planner" or planner_turns >= self.cfg.sampling.planner_max_turns:
            ep.done = True  # broken protocol: format_ok stays False
            return None
        invocation = ep.calls.get(action.agent, 0)
        ep.calls[action.agent] = invocation + 1
        ep.trace.append({"agent": "planner", "delegate": action.agent, "task": action.task})
        return Branch(ep, TokenContext(), action.agent, invocation, task=action.task)

    def _subagent_tree(self, calls: list[Branch], round_id: str, seed: int) -> None:
        """The K-candidate turns of these calls of ONE sub-agent role until each returns."""
        runtime = self.runtimes[calls[0].agent]
        for call in calls:  # each call's context starts at its sub-agent header
            if not call.ctx.ids:
                call.ctx.add_prompt(encode(runtime.tokenizer,
                                           P.subagent_header(call.agent, call.task)))
        self._subagent_turns(runtime, calls, round_id, seed)
        for call in calls:
            call.solved = call.result is not None and bool(
                self.judge.judge(call.agent, call.task or "", call.result))

    def _subagent_turns(self, runtime: AgentRuntime, calls: list[Branch], round_id: str,
                        seed: int) -> None:
        for _ in range(self.cfg.sampling.subagent_max_turns):
            live = [c for c in calls if not c.done]
            if not live:
                return
            for call, best in zip(live, self._branch(runtime, live, round_id, seed),
                                  strict=True):
                call.ctx.add_generated(best.completion)
                if best.action.kind == "return":
                    call.result, call.done = best.action.payload, True
                elif best.observation is not None:
                    call.ctx.add_prompt(encode(runtime.tokenizer, P.render_obs(best.observation)))
                    call.episode.trace.append({"agent": call.agent, "tool": runtime.tool.name,
                                               "input": best.action.payload,
                                               "observation": best.observation})
                else:
                    call.done = True  # invalid turn: the planner gets FAILED_RESULT
