"""AT-GRPO tree sampling through the services: the same :class:`TreeSampler` as embedded
mode, its sub-agent subtrees played by the sub-agent workers.

- Round shape: ``start_round`` enqueues ONE ``EpisodeTask`` per query (rollout 0): the query's
  tree. Its K candidate slots are the round's K rollouts of that query.
- Planner worker (:func:`play_trees`): begins an attempt for every slot, plays the planner's
  turns (K candidates each, continued from the best) and sends each delegation as a
  ``SubAgentCall`` with ``tree`` (:class:`~mgrpo.bus.messages.TreeBranching`: K, the seed,
  the agent's turns so far, the slots' attempts) through :class:`BusSubtree`. Then, per slot:
  the planner's candidates to its trainer, the tree's outcome, the count of candidates of
  every role (recorded as d_k: the trainers' readiness), ``complete_rollout``.
- Sub-agent worker (:func:`play_tree_calls`): plays the calls with
  ``TreeSampler._subagent_tree`` (the embedded code), sends every candidate to its model's
  trainer (attempt = its slot's), THEN replies: result, turns taken, r_expert verdict.
- Trainers: ready when every slot is complete and each role's candidates recorded by the
  planner worker are ingested; train with ``tree_round.train_tree_model`` (per-turn groups).

Same seeds, same tokens as embedded mode (each request is seeded by (round, query, agent,
turn, candidate)): ``tests/integration/services/test_services_at_grpo.py``.

What this module does NOT do: score episodes the ordinary way (M-GRPO) or train.
"""

from __future__ import annotations

import functools
import logging

from mgrpo.bus.messages import (
    MAX_SUBTASK_CHARS,
    SubAgentCall,
    SubAgentResult,
    TrajectoryMessage,
    TreeBranching,
)
from mgrpo.envs import load_benchmark
from mgrpo.services.context import refresh_weights
from mgrpo.services.dispatch import agent_cards, registered_queue
from mgrpo.store.records import DCount, PlannerOutcomeIn
from mgrpo.training.config import RunConfig
from mgrpo.training.episodes import TokenContext
from mgrpo.training.judging import build_expert_judges, refresh_judge_weights
from mgrpo.training.round_spec import RoundSpec
from mgrpo.training.scoring import score_episode
from mgrpo.training.subagents import FAILED_RESULT
from mgrpo.training.tree import Branch, TreeEpisode, TreeSampler
from mgrpo.training.tree_round import tree_seed
from mgrpo.types import trajectory_id

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=4)
def bench_questions(bench_dir: str) -> dict:
    """Question id -> benchmark question (subtasks and gold documents: the turn rewards)."""
    bench = load_benchmark(bench_dir)
    return {q.id: q for split in ("train", "dev", "test") for q in bench.questions(split)}


class BusSubtree:
    """``TreeSampler``'s ``subtree`` over the bus: one tree call per delegation."""

    def __init__(self, dispatch, queue_of, attempts: dict[str, list[int | None]]) -> None:
        self.dispatch, self.queue_of, self.attempts = dispatch, queue_of, attempts

    def __call__(self, calls: list[Branch], round_id: str, seed: int) -> None:
        sends, sent = [], []
        for call in calls:
            ep, queue = call.episode, self.queue_of(call.agent)
            first = ep.turns.get(call.agent, 0)
            if queue is None:
                call.done = True  # no such sub-agent deployed: the planner gets FAILED_RESULT
                ep.trace.append({"agent": call.agent, "task": call.task,
                                 "error": "unknown agent"})
                continue
            slots = self.attempts[ep.question.id]
            sends.append((queue, SubAgentCall(
                call_id=trajectory_id(round_id, ep.question.id, 0, call.agent,
                                      call.invocation) + "/tree",
                round_id=round_id, query_id=ep.question.id, rollout=0,
                attempt=max(a for a in slots if a is not None), agent=call.agent,
                invocation=call.invocation, subtask=(call.task or "")[:MAX_SUBTASK_CHARS],
                reply_to=self.dispatch.reply_queue,
                tree=TreeBranching(k=len(slots), first_turn=first, seed=seed,
                                   attempts=slots))))
            sent.append((call, first))
        for (call, first), reply in zip(sent, self.dispatch.request(sends), strict=True):
            call.done = True
            if reply is None:
                log.warning("tree call to %r got no reply", call.agent)
                continue
            call.result = reply.result if reply.format_ok else None
            call.solved = reply.solved
            call.episode.turns[call.agent] = first + reply.turns
            call.episode.trace.extend(reply.trace)


def play_trees(p, verifier, record, spec: RoundSpec, query_ids: list[str]) -> int:
    """Play the trees of ``query_ids`` in round ``record`` (planner worker side, ``p`` its
    ``PlannerRuntime``; ``spec`` the round's); returns how many trees were played."""
    store, round_id, cfg = p.store, record.round_id, spec.run
    questions, attempts = [], {}
    for query_id in dict.fromkeys(query_ids):
        slots = [store.begin_attempt(round_id, query_id, k) for k in range(record.k)]
        if all(a is None for a in slots):
            continue  # completed by an earlier delivery
        questions.append(bench_questions(cfg.bench_dir)[query_id])
        attempts[query_id] = slots
    if not questions:
        return 0
    with p.lock:
        refresh_weights(store, p.runtime.engine, p.runtime.model, record.run_id, cfg)
        subtree = BusSubtree(p.dispatch, lambda role: registered_queue(store, role), attempts)
        sampler = TreeSampler({"planner": p.runtime}, agent_cards(store, cfg), cfg, None,
                              subtree=subtree)
        trees = sampler.run(round_id, questions, tree_seed(cfg, record.index))
    if p.runtime.model in spec.scored_models:  # every trajectory, one confirm wait
        p.bus.publish_many([
            (p.queues.trainer(p.runtime.model), TrajectoryMessage(
                trajectory=traj.model_copy(update={"attempt": attempts[tree.question.id][k]})))
            for tree in trees for k in range(record.k)
            if attempts[tree.question.id][k] is not None
            for traj in tree.candidates if traj.rollout == k])
    for tree in trees:
        qid = tree.question.id
        correct, reward = score_episode(tree.answer, tree.format_ok, tree.question.answer,
                                        verifier, cfg.rewards.planner,
                                        question=tree.question.question)
        for k, attempt in enumerate(attempts[qid]):
            if attempt is None:
                continue
            store.write_planner_outcomes(round_id, [PlannerOutcomeIn(
                query_id=qid, rollout=k, attempt=attempt, format_ok=tree.format_ok,
                correct=correct, reward=reward)])
            for role in cfg.agents:  # one candidate per slot per turn of each agent
                store.record_d_counts(role, round_id, [DCount(
                    query_id=qid, rollout=k, attempt=attempt, d=tree.turns.get(role, 0))])
            store.complete_rollout(round_id, qid, k, attempt)
    return len(trees)


def play_tree_calls(worker, calls: list[SubAgentCall], spec: RoundSpec) -> None:
    """Play tree calls of ONE round (its ``spec``) on a sub-agent worker (weights already
    refreshed)."""
    cfg = spec.run
    questions = bench_questions(cfg.bench_dir)
    judges = tree_judge(worker, cfg)
    record = worker.store.get_round(calls[0].round_id) if calls[0].round_id else None
    if record is not None:  # a judge on another trained model: its newest weights
        def latest(model: str):
            found = worker.store.latest_checkpoint(model, run_id=record.run_id)
            return None if found is None else (found.uri, found.version)

        refresh_judge_weights(judges, cfg, latest)
    sampler = TreeSampler({worker.name: worker.runtime}, [], cfg, judges)
    branches = []
    for call in calls:
        episode = TreeEpisode(question=questions[call.query_id],
                              turns={call.agent: call.tree.first_turn})
        branches.append(Branch(episode, TokenContext(), call.agent, call.invocation,
                               task=call.subtask))
    sampler.subtree(branches, calls[0].round_id, calls[0].tree.seed)
    send = worker.model in spec.scored_models
    trajectories, replies = [], []  # one publish_many: trajectories before the replies
    for call, branch in zip(calls, branches, strict=True):
        episode = branch.episode
        if send:
            for traj in episode.candidates:
                attempt = call.tree.attempts[traj.rollout]
                if attempt is not None:
                    trajectories.append((worker.queues.trainer(worker.model), TrajectoryMessage(
                        trajectory=traj.model_copy(update={"attempt": attempt}))))
        replies.append((call.reply_to, SubAgentResult(
            call_id=call.call_id, attempt=call.attempt, agent=call.agent,
            result=branch.result if branch.result is not None else FAILED_RESULT,
            format_ok=branch.result is not None, trace=episode.trace,
            turns=episode.turns.get(call.agent, 0) - call.tree.first_turn,
            solved=branch.solved)))
    worker.bus.publish_many(trajectories + replies)
    worker.calls_done += len(calls)


def tree_judge(worker, cfg: RunConfig):
    """The role's r_expert judge for turn rewards, as embedded mode builds it (an llm judge
    on this worker's own model uses its engine); cached per (bench, judges)."""
    key = (cfg.bench_dir, repr(cfg.judges))
    cache = worker.tree_judges
    if key not in cache:
        runtime = worker.runtime
        cache[key] = build_expert_judges(
            cfg, load_benchmark(cfg.bench_dir), {worker.model: (runtime.engine,
                                                                runtime.tokenizer)},
            device=worker.settings.device, roles=[worker.name])
    return cache[key]
