"""A turn team's coordinator (``mgrpo.services.team`` says how a turn_team round runs
through the services): :class:`TeamWorker` on ``planner.episodes`` holds the world and each
task's state and plays :class:`~mgrpo.training.team_play.TeamSampler` (embedded mode's
code) with one :class:`RoleEngine` per role, whose ``generate`` is that role's worker
(``mgrpo.services.subagent.role``) over the bus.

What this module does NOT do: sample (the role workers) or train (the trainers).
"""

from __future__ import annotations

import logging
import time
import uuid

from mgrpo.bus.messages import (
    EpisodeTask,
    RoundCommand,
    SubAgentCall,
    TrajectoryMessage,
    TurnRequest,
)
from mgrpo.config import Settings
from mgrpo.engines.base import Completion, GenerationRequest
from mgrpo.models import load_tokenizer
from mgrpo.sandbox.client import SandboxClient
from mgrpo.services.batching import consume_batches
from mgrpo.services.context import Queues, round_spec
from mgrpo.services.dispatch import BusDispatch, registered_queue, worker_id
from mgrpo.services.team import train_pool
from mgrpo.store.records import DCount
from mgrpo.training.config import RunConfig
from mgrpo.training.episodes import AgentRuntime
from mgrpo.training.round_spec import RoundSpec
from mgrpo.training.team_play import TeamSampler
from mgrpo.training.team_round import team_metrics
from mgrpo.training.tree_round import tree_seed
from mgrpo.workflows import world_for_run

log = logging.getLogger(__name__)


class RoleUnavailable(RuntimeError):
    """No worker plays a role, or its worker did not answer a turn call in time: the round
    cannot be played (it is marked failed with this message)."""


class RoleEngine:
    """An engine over the bus: ``generate`` sends one role's requests to its worker as one
    ``SubAgentCall`` with ``turn`` and returns the worker's completions. ``version``: the
    weights version the worker sampled with."""

    def __init__(self, dispatch: BusDispatch, queue: str, role: str, round_id: str) -> None:
        self.dispatch, self.queue, self.role, self.round_id = dispatch, queue, role, round_id
        self.version = 0
        self.play = uuid.uuid4().hex[:8]  # this play's calls (a replay sends new ones)
        self.calls = 0

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        call = SubAgentCall(
            call_id=f"{self.round_id}/team/{self.role}/{self.play}/{self.calls}",
            round_id=self.round_id, agent=self.role, subtask="",
            reply_to=self.dispatch.reply_queue,
            turn=[TurnRequest(prompt_ids=list(r.prompt_ids), temperature=r.params.temperature,
                              top_p=r.params.top_p, top_k=r.params.top_k,
                              max_new_tokens=r.params.max_new_tokens, stop=r.params.stop,
                              stop_token_ids=r.params.stop_token_ids, seed=r.params.seed)
                  for r in requests])
        self.calls += 1
        reply = self.dispatch.request([(self.queue, call)])[0]
        if reply is None or len(reply.completions) != len(requests):
            raise RoleUnavailable(f"role {self.role!r}: no answer to turn call {call.call_id} "
                               f"within {self.dispatch.timeout_s:.0f} s (is its worker "
                               "running?)" if reply is None else
                               f"role {self.role!r} answered {len(reply.completions)} of "
                               f"{len(requests)} requests")
        self.version = reply.weights_version
        return [Completion(list(r.prompt_ids), list(c.completion_ids), list(c.logprobs),
                           c.text, c.finish_reason)
                for r, c in zip(requests, reply.completions, strict=True)]


class TeamWorker:
    """The coordinator of turn-team rounds on ``planner.episodes``; see the module
    docstring."""

    def __init__(self, settings: Settings, cfg: RunConfig, store, bus,
                 batch_size: int = 64, reply_suffix: str = "") -> None:
        self.settings, self.cfg, self.store, self.bus = settings, cfg, store, bus
        self.batch_size = batch_size
        self.queues = Queues(settings.queue_prefix)
        self.dispatch = BusDispatch(bus, self.queues.replies(worker_id() + reply_suffix),
                                    lambda role: registered_queue(store, role))
        self.episodes_done = 0
        self._worlds: dict[str, object] = {}
        self._tokenizers: dict[str, object] = {}
        self._totals: dict[str, list[float]] = {}  # round id -> [tasks, solved, turns, tokens]

    def start(self) -> None:
        consume_batches(self.bus, self.queues.episodes, self.handle_batch,
                        consumer="team-worker", batch_size=self.batch_size,
                        deadline_s=self.settings.handler_deadline_s)

    def handle_batch(self, messages: list) -> dict[int, str]:
        tasks = [m for m in messages if isinstance(m, EpisodeTask)]
        if any(not isinstance(m, EpisodeTask | RoundCommand) for m in messages):
            raise TypeError("planner.episodes takes episode_task messages")
        records = {rid: self.store.get_round(rid)
                   for rid in dict.fromkeys(t.round_id for t in tasks)}
        refused = {i: f"round {m.round_id!r} (run {m.run_id!r}) is not in the store"
                   for i, m in enumerate(messages)
                   if isinstance(m, EpisodeTask) and records[m.round_id] is None}
        for round_id, record in records.items():
            if record is None or record.status in ("cancelled", "failed", "done"):
                continue
            spec = round_spec(record, self.cfg)
            try:
                self.play(record, spec, [t.query_id for t in tasks if t.round_id == round_id])
            except RoleUnavailable as error:  # it would stay 'running' with nobody to play it
                log.error("team worker: round %s failed: %s", round_id, error)
                self.store.set_round_status(round_id, "failed", only_from=("running",),
                                            error=f"team worker: {error}"[:2000])
        return refused

    def world(self, cfg: RunConfig):
        key = repr((cfg.workflow.world, sorted(cfg.workflow.world_options.items())))
        if key not in self._worlds:
            self._worlds[key] = world_for_run(
                cfg, SandboxClient(url) if (url := self.settings.sandbox_url) else None)
        return self._worlds[key]

    def tokenizer(self, cfg: RunConfig, model: str):
        path = cfg.models[model].path
        if path not in self._tokenizers:
            self._tokenizers[path] = load_tokenizer(path)
        return self._tokenizers[path]

    def play(self, record, spec: RoundSpec, query_ids: list[str]) -> int:
        """Play round ``record``'s tasks ``query_ids`` (one tree each), hand each model its
        candidates, complete their slots; returns how many were played."""
        store, round_id, cfg = self.store, record.round_id, spec.run
        pool = {t.task_id: t for t in train_pool(cfg)}
        attempts, tasks = {}, []
        for qid in dict.fromkeys(query_ids):
            slots = [store.begin_attempt(round_id, qid, k) for k in range(record.k)]
            if all(a is None for a in slots):
                continue  # completed by an earlier delivery
            if qid not in pool:
                raise KeyError(f"task {qid!r} of round {round_id} is not in the world's "
                               "training split of this run's config")
            attempts[qid], tasks = slots, [*tasks, pool[qid]]
        if not tasks:
            return 0
        flow, roles = cfg.flow, cfg.flow.roles(cfg)
        runtimes = {}
        for role, model in roles.items():
            queue = registered_queue(store, role)
            if queue is None:
                raise RoleUnavailable(f"no worker plays role {role!r} of round {round_id}: start "
                                 f"`mgrpo serve subagent --name {role}` with this run config")
            runtimes[role] = AgentRuntime(role=role, model=model,
                                          engine=RoleEngine(self.dispatch, queue, role, round_id),
                                          tokenizer=self.tokenizer(cfg, model))
        world = self.world(cfg)
        started = time.perf_counter()
        episodes = TeamSampler(world, runtimes, cfg.sampling, cfg.k, flow.alpha(cfg),
                               flow.max_turns(cfg)).run(round_id, tasks,
                                                        tree_seed(cfg, record.index))
        played = time.perf_counter()
        self.bus.publish_many([  # every candidate to its model's trainer; one confirm wait
            (self.queues.trainer(t.model), TrajectoryMessage(trajectory=t.model_copy(
                update={"attempt": attempts[ep.task.task_id][t.rollout]})))
            for ep in episodes for t in ep.candidates
            if t.model in spec.scored_models
            and attempts[ep.task.task_id][t.rollout] is not None])
        totals = self._totals.setdefault(round_id, [0.0, 0.0, 0.0, 0.0])
        batch = team_metrics(episodes, world, "team")
        totals[0] += len(episodes)
        totals[1] += batch["team/accuracy"] * len(episodes)
        totals[2] += batch["team/team_turns"] * len(episodes)
        totals[3] += sum(ep.generated_tokens for ep in episodes)
        store.record_metrics(record.run_id, round_id, {
            "team/accuracy": totals[1] / totals[0], "team/team_turns": totals[2] / totals[0],
            "rollout/generated_tokens": totals[3], "time/rollout_s": played - started})
        for ep in episodes:
            qid = ep.task.task_id
            for k, attempt in enumerate(attempts[qid]):
                if attempt is None:
                    continue
                for role in roles:  # one candidate per slot per turn the role played
                    store.record_d_counts(role, round_id, [DCount(
                        query_id=qid, rollout=k, attempt=attempt,
                        d=sum(t.agent == role and t.rollout == k for t in ep.candidates))])
                store.complete_rollout(round_id, qid, k, attempt)
        self.episodes_done += len(episodes)
        self._end_rollouts(round_id, spec)
        log.info("team worker: %d tasks of %s played in %.3f s", len(episodes), round_id,
                 played - started)
        return len(episodes)

    def _end_rollouts(self, round_id: str, spec: RoundSpec) -> None:
        """Every slot complete: the round goes to ``training`` and its trainers get their
        cue (as the planner worker's ``_end_rollouts``)."""
        store = self.store
        if not store.round_progress(round_id).done:
            return
        record = store.get_round(round_id)
        if record is None or record.status not in ("running", "training"):
            return
        if record.status == "running":
            store.set_round_status(round_id, "training", only_from=("running",))
        self.bus.publish_many([(self.queues.trainer(model), RoundCommand(
            command="train", run_id=record.run_id, round_id=round_id, model=model,
            idempotency_key=f"round_command:{round_id}/rollouts-done/{model}"))
            for model in spec.scored_models])
