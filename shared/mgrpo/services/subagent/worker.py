"""A sub-agent worker (one deployment per sub-agent role): registers itself in the store,
then takes batches of ``SubAgentCall``s from ``subagent.<name>``, plays them with the
library's :func:`~mgrpo.training.subagents.run_subagent_calls`, sends each trajectory to ITS
OWN model's trainer (``trainer.<model>``, only for calls inside a round whose config trains
that model), and only then replies to the caller. Trajectory first, reply second: when the
planner completes the rollout, every trajectory it counts in d_k is already on a durable
queue.

A sub-agent that delegates (a nested hierarchy: ``agents: {researcher: {model: r, calls:
[searcher]}}`` in the round's run config) sees its callees' cards and sends its own calls
over the bus as the planner worker does (a :class:`~mgrpo.services.dispatch.BusDispatch` on
this worker's own reply queue), each with the seed embedded mode gives it; the callee's
worker sends the callee's trajectory to the callee's trainer before it replies, so the
whole subtree's trajectories are on their way before this worker replies to its caller.

Registration (``store.register_agent``) is what puts this sub-agent in the planner's header:
adding a tool sub-agent is a run-config entry plus a deployment, no planner code.

Runs: a call inside a round is played with the newest weights of THAT round's run
(``refresh_weights``; a batch holding calls of several runs is played run by run); a call
outside a round (REST) with the weights of the deployment's run (the run config's ``name``).

AT-GRPO rounds: a call with ``tree`` is played as a tree (K candidates per turn, every one
sent to the trainer, ``mgrpo.services.tree_calls``).

What this module does NOT do: score (the trainer computes sub-agent rewards from the planner
outcomes in the store) or load weights mid-batch.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from mgrpo.bus.messages import SubAgentCall, SubAgentResult, TrajectoryMessage
from mgrpo.config import Settings
from mgrpo.engines.registry import build_engine
from mgrpo.envs.turn_formats import build_turn_format
from mgrpo.services.batching import consume_batches
from mgrpo.services.context import (
    Queues,
    agent_engine,
    refresh_weights,
    round_spec,
    tool_for_run,
)
from mgrpo.services.dispatch import BusDispatch, new_reply_suffix, registered_queue, worker_id
from mgrpo.services.tree_calls import play_tree_calls
from mgrpo.training.config import RunConfig, SamplingConfig
from mgrpo.training.episodes import AgentRuntime, SubagentCall, mix_seed, with_protocol
from mgrpo.training.round_spec import RoundSpec
from mgrpo.training.subagents import run_subagent_calls
from mgrpo.training.system import role_cards, role_description
from mgrpo.workflows.hierarchy import delegation_tree

log = logging.getLogger(__name__)


class SubagentWorker:
    """``name``: the role (``searcher``); ``tool``: registry name (``search``; empty: none,
    for a sub-agent that only delegates); ``model_path``: its model folder. The model NAME
    (trainer queue) is ``cfg.agents[name]``."""

    def __init__(self, settings: Settings, cfg: RunConfig, store, bus, name: str, tool: str,
                 model_path: str | None = None, description: str = "",
                 batch_size: int = 64, heartbeat_s: float = 10.0) -> None:
        self.settings, self.cfg, self.store, self.bus = settings, cfg, store, bus
        self.name, self.tool_name = name, tool
        self.model = cfg.agents.get(name, name)
        path = model_path or cfg.models[self.model].path
        mcfg = cfg.models.get(self.model)
        _, tokenizer, engine = build_engine(agent_engine(cfg, name, settings), path,
                                            settings.device,
                                            lora=mcfg.lora if mcfg is not None else None)
        refresh_weights(store, engine, self.model, cfg.name, cfg)
        self.runtime = AgentRuntime(role=name, model=self.model, engine=engine,
                                    tokenizer=tokenizer,
                                    tool=tool_for_run(cfg, tool, settings) if tool else None,
                                    description=description or role_description(
                                        name, cfg.descriptions), turn_format=build_turn_format(
                                        cfg.protocol.format, tokenizer,
                                        cfg.protocol.tool_call_format,
                                        cfg.protocol.template_text()))
        self.description = description or role_description(name, cfg.descriptions)
        self.queues = Queues(settings.queue_prefix)
        self.batch_size, self.heartbeat_s = batch_size, heartbeat_s
        self.calls_done = 0
        self._stop = threading.Event()
        self._round_specs: dict[str, RoundSpec] = {}
        self._round_runs: dict[str, str] = {}
        self.tree_judges: dict = {}  # AT-GRPO turn-reward judges (services.tree_calls)
        self._dispatch: BusDispatch | None = None  # built on the first call that delegates

    def start(self) -> None:
        self.store.register_agent(self.name, self.model, self.queues.subagent(self.name),
                                  tool=self.tool_name, description=self.description)
        # No store claims (a duplicate check and a claim: two round trips, one a commit, on
        # every delegation turn's critical path): a redelivered call is played again with
        # the same seed, and what it sends is idempotent downstream (the trainer ingests a
        # traj_id once, ON CONFLICT DO NOTHING; the dispatcher drops a second reply).
        consume_batches(self.bus, self.queues.subagent(self.name), self.handle_batch,
                        consumer=f"subagent-{self.name}", batch_size=self.batch_size,
                        claims=False, deadline_s=self.settings.handler_deadline_s)
        start_heartbeat(self.store, self.name, self._stop, self.heartbeat_s)

    def stop(self) -> None:
        self._stop.set()

    def handle_batch(self, messages: list) -> dict[int, str]:
        """Play the batch's calls; returns the refusals (``{position: reason}``, to the
        dead-letter queue): a call inside a round the store does not hold (nobody waits for
        its answer: a planner worker plays only tasks of rounds the store holds)."""
        calls: list[SubAgentCall] = []
        for message in messages:
            if not isinstance(message, SubAgentCall) or message.agent != self.name:
                target = getattr(message, "agent", None)
                raise TypeError(f"subagent.{self.name} takes subagent_call messages for "
                                f"{self.name!r}, got {message.kind!r} for {target!r}; send "
                                "it to its own queue")
            calls.append(message)
        known = {rid: self._known_round(rid)
                 for rid in dict.fromkeys(c.round_id for c in calls if c.round_id is not None)}
        refused = {i: f"round {call.round_id!r} of call {call.call_id!r} is not in the store; "
                      "rounds start with POST /v1/rounds, or check MGRPO_DATABASE_URL"
                   for i, call in enumerate(calls)
                   if call.round_id is not None and not known[call.round_id]}
        calls = [c for i, c in enumerate(calls) if i not in refused]
        by_run: dict[str, list[SubAgentCall]] = {}
        for call in calls:
            by_run.setdefault(self._run_of(call), []).append(call)
        started = time.perf_counter()
        for run_id, run_calls in by_run.items():
            self._play(run_id, run_calls)
        log.info("sub-agent %s: %d calls in %.3f s", self.name, len(calls),
                 time.perf_counter() - started)
        return refused

    def _known_round(self, round_id: str) -> bool:
        """Whether the store holds ``round_id`` (read once per round it holds; a round it
        does not hold is asked about again next time)."""
        self._round_spec(round_id)
        if round_id in self._round_runs:
            return True
        self._round_specs.pop(round_id, None)
        return False

    def _run_of(self, call: SubAgentCall) -> str:
        if call.round_id is None:
            return self.cfg.name
        self._round_spec(call.round_id)
        return self._round_runs.get(call.round_id, self.cfg.name)

    def _play(self, run_id: str, calls: list[SubAgentCall]) -> None:
        cfg = (self._round_spec(calls[0].round_id).run if calls[0].round_id is not None
               else self.cfg)
        refresh_weights(self.store, self.runtime.engine, self.model, run_id, cfg)
        trees = [c for c in calls if c.tree is not None and c.round_id is not None]
        for round_id in dict.fromkeys(c.round_id for c in trees):  # AT-GRPO: K per turn
            play_tree_calls(self, [c for c in trees if c.round_id == round_id],
                            self._round_spec(round_id))
        calls = [c for c in calls if c.tree is None or c.round_id is None]
        if not calls:
            return
        library_calls = [SubagentCall(  # outside a round: a key its own calls keep out of one
            key=(c.round_id or f"query-{c.call_id}", c.query_id or c.call_id, c.rollout),
            role=self.name,
            task=c.subtask, invocation=c.invocation, seed=self._call_seed(c),
            attempt=c.attempt) for c in calls]
        outcomes: list = [None] * len(calls)
        for round_id in dict.fromkeys(c.round_id for c in calls):
            picked = [i for i, c in enumerate(calls) if c.round_id == round_id]
            run = self._round_spec(round_id).run if round_id is not None else self.cfg
            runtime = with_protocol(self.runtime, run.protocol)
            callees = delegation_tree(run.agents, run.delegation).get(self.name, ())
            if callees:  # a nested hierarchy: this role delegates to its callees
                runtime = replace(runtime, calls=tuple(role_cards(callees, run.descriptions)))
            done = run_subagent_calls(runtime, [library_calls[i] for i in picked],
                                      self._sampling(round_id),
                                      dispatch=self.dispatch() if callees else None)
            for i, outcome in zip(picked, done, strict=True):
                outcomes[i] = outcome
        # one publish_many (one confirm wait): every trajectory, then the replies, so a
        # trajectory is always on its way before the reply that lets a planner go on
        trajectories, replies = [], []
        for call, outcome in zip(calls, outcomes, strict=True):
            trajectory = outcome.trajectory
            if call.round_id is not None and trajectory is not None \
                    and self._round_scores_me(call.round_id):
                trajectories.append((self.queues.trainer(self.model),
                                     TrajectoryMessage(trajectory=trajectory)))
            replies.append((call.reply_to, SubAgentResult(
                call_id=call.call_id, attempt=call.attempt, agent=self.name,
                result=outcome.result,
                format_ok=bool(trajectory is not None and trajectory.format_ok),
                trace=outcome.trace)))
        self.bus.publish_many(trajectories + replies)
        self.calls_done += len(calls)

    def dispatch(self) -> BusDispatch:
        """The bus dispatch of this worker's own calls (a sub-agent that delegates), on a
        reply queue of its own; built once, on first use."""
        if self._dispatch is None:
            reply_queue = self.queues.replies(f"{worker_id()}-{self.name}{new_reply_suffix()}")
            self._dispatch = BusDispatch(self.bus, reply_queue,
                                         lambda role: registered_queue(self.store, role))
        self._dispatch.weights_version = self.runtime.engine.version
        return self._dispatch

    def _round_spec(self, round_id: str) -> RoundSpec:
        """The round's spec, read from the store once per round (a round the store does not
        hold: this service's config, training nothing)."""
        if round_id not in self._round_specs:
            record = self.store.get_round(round_id)
            self._round_specs[round_id] = (round_spec(record, self.cfg)
                                           or RoundSpec.of(self.cfg))
            if record is not None:
                self._round_runs[round_id] = record.run_id
        return self._round_specs[round_id]

    def _sampling(self, round_id: str | None) -> SamplingConfig:
        """Inside a round, the round's own sampling settings (turn limits included), the
        ones its planner worker and trainers read: one source of truth per round, whatever
        config this service was started with. Outside a round (REST): the service's."""
        return (self._round_spec(round_id).run if round_id is not None else self.cfg).sampling

    def _round_scores_me(self, round_id: str) -> bool:
        return self.model in self._round_spec(round_id).scored_models

    def _call_seed(self, call: SubAgentCall) -> int:
        """The sampling seed of a delegation: the one its caller sent (``call.seed``: what
        embedded mode gives the call, at any depth of a nested hierarchy); else, inside a
        round, the seed embedded mode gives
        the same call (episode seed ``mix_seed(run seed, round, query, rollout)`` as in
        ``rounds.collect``, then ``mix_seed(episode seed, role, invocation)`` as in
        ``EpisodeRunner._planner_turn``), so both modes sample the same sub-agent tokens
        (tests/integration/services/test_services_parity.py). A re-run attempt replays the
        same draws, as the planner's own turns do. Outside a round (REST): per call id."""
        if call.seed is not None:
            return call.seed
        if call.round_id is None or call.query_id is None:
            return mix_seed(call.call_id, call.attempt)
        run_seed = self._round_spec(call.round_id).run.seed
        episode_seed = mix_seed(run_seed, call.round_id, call.query_id, call.rollout)
        return mix_seed(episode_seed, call.agent, call.invocation)


HEARTBEAT_RETRY_S = 1.0  # after a failed beat: the next one this soon, not a whole period on


def start_heartbeat(store, name: str, stop: threading.Event, every_s: float) -> None:
    """A daemon thread that marks worker ``name`` alive in the store every ``every_s`` until
    ``stop`` is set (the API lists and waits for live workers). A beat that fails (a store
    blip) is tried again after :data:`HEARTBEAT_RETRY_S`, so a worker is listed alive again
    within a second of the database's return, not a period later."""
    def beat() -> None:
        wait = every_s
        while not stop.wait(wait) and not store.closed:
            try:
                store.heartbeat(name)
                wait = every_s
            except Exception as error:  # noqa: BLE001 - a store blip must not kill the worker
                wait = min(HEARTBEAT_RETRY_S, every_s)
                log.warning("heartbeat of %s failed (%s: %s); trying again in %.1f s", name,
                            type(error).__name__, error, wait)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()
