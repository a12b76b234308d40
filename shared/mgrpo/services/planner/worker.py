"""The planner worker (docs/services.md, 'One round (distributed)', steps 2 and 4): takes a
batch of ``EpisodeTask``s, plays them as
ONE batched run of the library's :class:`~mgrpo.training.episodes.EpisodeRunner` with
delegations over the bus, then for each episode: scores it, hands its trajectory to the
planner model's trainer, writes the outcome, completes the rollout, and records d_k.

Once a batch completes a round's last rollouts, the trainer of each model the round scores gets a
``RoundCommand`` (``train``) on its queue: its cue to check readiness (trainers do not poll).

Order per batch (why): trajectories published (one ``publish_many``: one wait for the
broker's confirms; one it did not confirm raises, the batch is requeued and played again as
new attempts) -> outcomes, d_k and ``complete_rollout`` in
ONE store transaction (``store.finish_episodes``). The rollout is completed only when
everything a trainer needs of this attempt is written or on its way, d_k included. The
batch's attempts and questions are read in one transaction each, its rounds once.
Outcomes, trajectories and d_k rows are all keyed by attempt, so a zombie attempt's rows are
harmless: trainers only read the completing attempt's. A worker killed anywhere before that
transaction commits gets the tasks redelivered and plays NEW attempts (``begin_attempts``)
that write their own rows; one killed after it has nothing left to write.

Algorithms: each round's episodes run with the config stored with the round. ``mgrpo``
(main-only too: frozen models are in ``scored_models``, not ``trained_models``) delegates
over the bus; every scored model's trajectories go to its trainer, which scores them;
``grpo`` runs the single agent with the tools in this process (no sub-agent deployment is
needed, d_k is 0). A round that trains nothing (a curriculum filter) records no d_k and ends
``done`` when its rollouts are complete. ``at_grpo``: each task is a query's whole tree
(K candidates per turn; ``mgrpo.services.tree_calls``).

Runs: a batch may hold rounds of several runs; each run's episodes are played as their own
batch, with THAT run's newest weights (``refresh_weights``), never another run's. REST
queries and evaluations use the weights of the deployment's run (the run config's ``name``).

What this module does NOT do: train, or load weights mid-batch (``refresh_weights`` runs
before each batch only).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from mgrpo.bus.messages import EpisodeTask, RoundCommand, TrajectoryMessage
from mgrpo.config import Settings
from mgrpo.engines.registry import build_engine
from mgrpo.envs import load_benchmark
from mgrpo.envs.questions import Question
from mgrpo.envs.turn_formats import build_turn_format
from mgrpo.sandbox.client import SandboxClient
from mgrpo.services.batching import consume_batches
from mgrpo.services.context import (
    Queues,
    agent_engine,
    refresh_weights,
    round_spec,
)
from mgrpo.services.dispatch import BusDispatch, agent_cards, registered_queue, worker_id
from mgrpo.services.tree_calls import play_trees
from mgrpo.store.records import DCount, PlannerOutcomeIn
from mgrpo.training.config import RunConfig
from mgrpo.training.episodes import (
    AgentRuntime,
    Episode,
    EpisodeJob,
    EpisodeRunner,
    mix_seed,
    with_protocol,
)
from mgrpo.training.judging import verifier_for_run
from mgrpo.training.round_spec import RoundSpec
from mgrpo.training.scoring import score_episode
from mgrpo.training.system import build_tools, role_cards

log = logging.getLogger(__name__)


def _answers(trace: list[dict], role: str) -> list[int | None]:
    """The invocation number (None where the answer does not carry one) of each delegation a
    sub-agent of ``role`` answered (failures carry ``error``), in trace order, at every depth
    of a nested hierarchy (a delegating sub-agent's ``steps`` hold its own calls' traces
    under ``calls``)."""
    found: list[int | None] = []
    for event in trace:
        if event.get("agent") == role and "format_ok" in event and "error" not in event:
            invocation = event.get("invocation")
            found.append(invocation if isinstance(invocation, int) else None)
        for step in event.get("steps", ()):
            found += _answers(step.get("calls", ()), role)
    return found


def answered_calls(trace: list[dict], role: str) -> int:
    """d_k of ``role`` in one episode: the delegations a sub-agent answered (each answer
    means one trajectory was sent to that sub-agent's trainer)."""
    return len(_answers(trace, role))


def answered_invocations(trace: list[dict], role: str) -> list[int] | None:
    """The invocation numbers of the calls :func:`answered_calls` counts, in trace order;
    None when an answer does not carry its number or two share one (then only the count is
    recorded, and its trainer trains what the count admits)."""
    found = _answers(trace, role)
    if None in found or len(set(found)) != len(found):
        return None
    return found


@dataclass
class PlannerRuntime:
    """The planner's model and a bus dispatch: what the worker and the REST API share."""

    settings: Settings
    cfg: RunConfig
    store: object
    bus: object
    queues: Queues
    runtime: AgentRuntime
    dispatch: BusDispatch
    # one play at a time on this engine; in the REST API only its model thread plays
    # (mgrpo.services.api.query_batcher: queries and evaluations share its batches)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _tools: dict = field(default_factory=dict)
    _verifiers: dict = field(default_factory=dict)

    @classmethod
    def build(cls, settings: Settings, cfg: RunConfig, store, bus,
              reply_suffix: str = "") -> PlannerRuntime:
        model_name = cfg.agents["planner"]
        _, tokenizer, engine = build_engine(agent_engine(cfg, "planner", settings),
                                            cfg.models[model_name].path, settings.device,
                                            lora=cfg.models[model_name].lora)
        refresh_weights(store, engine, model_name, cfg.name, cfg)
        runtime = AgentRuntime(role="planner", model=model_name, engine=engine,
                               tokenizer=tokenizer, turn_format=build_turn_format(
                                   cfg.protocol.format, tokenizer,
                                   cfg.protocol.tool_call_format,
                                   cfg.protocol.template_text()))
        queues = Queues(settings.queue_prefix)

        dispatch = BusDispatch(bus, queues.replies(worker_id() + reply_suffix),
                               lambda role: registered_queue(store, role))
        return cls(settings, cfg, store, bus, queues, runtime, dispatch)

    def runner(self, cfg: RunConfig | None = None) -> EpisodeRunner:
        """The library's runner for ``cfg`` (default: the service's), as its algorithm's
        ``sub_agents`` plays them (:data:`SUB_AGENT_RUNNERS`), exactly as embedded mode's
        ``System.runner``."""
        cfg = cfg or self.cfg
        return SUB_AGENT_RUNNERS[cfg.algo.sub_agents](self, cfg)

    def delegating_runner(self, cfg: RunConfig) -> EpisodeRunner:
        """Delegations over the bus to the registered sub-agent workers."""
        return EpisodeRunner(with_protocol(self.runtime, cfg.protocol),
                             agent_cards(self.store, cfg), cfg.sampling, dispatch=self.dispatch)

    def inline_runner(self, cfg: RunConfig) -> EpisodeRunner:
        """The single agent playing every role in its own context, with the tools in this
        process."""
        return EpisodeRunner(with_protocol(self.runtime, cfg.protocol),
                             role_cards(cfg.agents, cfg.descriptions), cfg.sampling,
                             inline_tools=self.inline_tools(cfg))

    def inline_tools(self, cfg: RunConfig) -> dict:
        """role -> tool for single-agent episodes (``mgrpo.training.system.build_tools``;
        ``python`` runs in the sandbox service when ``MGRPO_SANDBOX_URL`` is set)."""
        key = repr((sorted(cfg.agents), cfg.tools, cfg.role_tools, cfg.bench_dir))
        if key not in self._tools:
            sandbox = None
            if self.settings.sandbox_url:
                sandbox = SandboxClient(self.settings.sandbox_url)
            self._tools[key] = build_tools(load_benchmark(cfg.bench_dir),
                                           cfg.algo.inline_roles(cfg.agents), sandbox,
                                           cfg.tools, cfg.role_tools)
        return self._tools[key]

    def verifier(self, cfg: RunConfig | None = None):
        """The run's r_correct verifier (``verifier:``, ``training.judging.verifier_for_run``),
        one per distinct setting; an llm verifier on the planner's own model uses its
        engine."""
        cfg = cfg or self.cfg
        key = repr((cfg.verifier, cfg.verifier_llm))
        if key not in self._verifiers:
            engines = {self.runtime.model: (self.runtime.engine, self.runtime.tokenizer)}
            self._verifiers[key] = verifier_for_run(cfg, engines, device=self.settings.device)
        return self._verifiers[key]

    def play(self, jobs: list[EpisodeJob], greedy: bool = False,
             cfg: RunConfig | None = None, run_id: str | None = None) -> list[Episode]:
        """Run episodes of ONE run (default: the deployment's, ``cfg.name``) with ``cfg``'s
        algorithm and sampling (default the service's; a round's :class:`RoundSpec`) and that
        run's newest weights; they are refreshed first and never during the run."""
        if run_id is None:
            run_id, cfg = self.cfg.name, cfg or self.cfg
        with self.lock:
            refresh_weights(self.store, self.runtime.engine, self.runtime.model, run_id, cfg)
            self.dispatch.weights_version = self.runtime.engine.version
            return self.runner(cfg).run(jobs, greedy=greedy)


# who plays the sub-agent roles (``Algorithm.sub_agents``) -> the planner's runner
SUB_AGENT_RUNNERS = {"agents": PlannerRuntime.delegating_runner,
                     "inline": PlannerRuntime.inline_runner}


class PlannerWorker:
    """Consumes ``planner.episodes`` in batches; see the module docstring."""

    def __init__(self, planner: PlannerRuntime, batch_size: int = 64) -> None:
        self.p, self.batch_size = planner, batch_size
        self.episodes_done = 0
        self.verifier_errors: dict[str, int] = {}  # round id -> count (this worker's)
        self.finish_s = {"publish": 0.0, "store": 0.0}  # of the last batch (its log line)

    def start(self) -> None:
        consume_batches(self.p.bus, self.p.queues.episodes, self.handle_batch,
                        consumer="planner-worker", batch_size=self.batch_size,
                        deadline_s=self.p.settings.handler_deadline_s)

    def handle_batch(self, messages: list) -> dict[int, str]:
        """Play the batch's episode tasks; returns the refusals (``{position: reason}``, to
        the dead-letter queue): a task whose round the store does not hold, or whose run,
        query or rollout is not that round's. Tasks of a cancelled, failed or done round are
        acked without playing."""
        tasks: list[EpisodeTask] = []
        for task in messages:
            if isinstance(task, RoundCommand):
                continue  # round commands are for trainers; nothing to do here
            if not isinstance(task, EpisodeTask):
                raise TypeError(f"planner.episodes takes episode_task messages, got {task.kind!r}")
            tasks.append(task)
        store = self.p.store
        records = {rid: store.get_round(rid) for rid in dict.fromkeys(t.round_id for t in tasks)}
        refused = {i: f"round {task.round_id!r} (run {task.run_id!r}) is not in the store; "
                      "start rounds with POST /v1/rounds, or check MGRPO_DATABASE_URL"
                   for i, task in enumerate(messages)
                   if isinstance(task, EpisodeTask) and records[task.round_id] is None}
        refused |= self._not_of_their_round(messages, records)
        self._play_tasks([t for i, t in enumerate(messages) if isinstance(t, EpisodeTask)
                          and i not in refused], records)
        return refused

    def _not_of_their_round(self, messages: list, records: dict) -> dict[int, str]:
        """Refusals of the tasks of a known, live round that name another run, or a query or
        rollout the round does not have (one store query per round)."""
        live = {rid for rid, record in records.items()
                if record is not None and record.status not in ("cancelled", "failed", "done")}
        keys = {rid: self.p.store.rollout_keys(rid, [t.query_id for t in messages
                                                     if getattr(t, "round_id", None) == rid])
                for rid in live}
        refused = {}
        for i, task in enumerate(messages):
            if not isinstance(task, EpisodeTask) or task.round_id not in live:
                continue
            record = records[task.round_id]
            if task.run_id != record.run_id:
                refused[i] = (f"round {task.round_id!r} is of run {record.run_id!r}, the task "
                              f"names run {task.run_id!r}")
            elif (task.query_id, task.rollout) not in keys[task.round_id]:
                refused[i] = (f"round {task.round_id!r} has no rollout {task.rollout} of "
                              f"query {task.query_id!r} (k = {record.k})")
        return refused

    def _play_tasks(self, tasks: list[EpisodeTask], records: dict) -> None:
        store, began = self.p.store, time.perf_counter()
        specs: dict[str, RoundSpec] = {  # round id -> the spec its episodes run with
            rid: round_spec(record, self.p.cfg) for rid, record in records.items()
            if record is not None and record.status not in ("cancelled", "failed", "done")}
        tasks = [t for t in tasks if t.round_id in specs]
        trees: dict[str, list[str]] = {}  # AT-GRPO round id -> query ids (a task = a tree)
        episodes: list[EpisodeTask] = []  # the other rounds' tasks: one episode each
        piles = {"episodes": episodes.append,  # by the round's play (RoundSpec.round_play)
                 "tree": lambda task: trees.setdefault(task.round_id, []).append(task.query_id)}
        for task in tasks:
            piles[specs[task.round_id].round_play(records[task.round_id].index)](task)
        tasks = episodes
        # one transaction for the batch's attempts, one query for its questions
        attempts = store.begin_attempts([(t.round_id, t.query_id, t.rollout) for t in tasks])
        queries = store.get_queries(t.query_id for t in tasks)
        jobs: list[EpisodeJob] = []
        for task, attempt in zip(tasks, attempts, strict=True):
            if attempt is None:  # completed by an earlier delivery
                continue
            query = queries.get(task.query_id)
            if query is None:
                raise KeyError(f"query {task.query_id!r} of round {task.round_id!r} is not in "
                               "the store; start rounds with start_round")
            question = Question(id=query.query_id, question=query.question or "",
                                answer=query.answer or "")
            seed = mix_seed(specs[task.round_id].run.seed, task.round_id, query.query_id,
                            task.rollout)
            jobs.append(EpisodeJob(question, task.round_id, task.rollout, seed, attempt))
        for round_id, query_ids in trees.items():
            verifier = self.p.verifier(specs[round_id].run)
            before = verifier.errors
            self.episodes_done += play_trees(self.p, verifier, records[round_id],
                                             specs[round_id], query_ids)
            self._count_verifier_errors(records[round_id], verifier.errors - before)
            self._end_rollouts(round_id)
        if not jobs:
            return
        groups: dict[tuple[str, str], list[EpisodeJob]] = {}
        for job in jobs:  # one batched run per (run, algorithm): a batch rarely mixes rounds
            key = (records[job.round_id].run_id, specs[job.round_id].run.algorithm)
            groups.setdefault(key, []).append(job)
        for (run_id, _), group in groups.items():
            first, started = group[0].round_id, time.perf_counter()
            episodes = self.p.play(group, greedy=False, cfg=specs[first].run, run_id=run_id)
            played = time.perf_counter()
            self.finish_s = {"publish": 0.0, "store": 0.0}
            for round_id in dict.fromkeys(e.job.round_id for e in episodes):
                self._finish(records[round_id], specs[round_id],
                             [e for e in episodes if e.job.round_id == round_id])
            log.info("planner worker: %d episodes prepared in %.3f s, played in %.3f s, "
                     "finished in %.3f s (publish %.3f, store %.3f)", len(group),
                     started - began, played - started, time.perf_counter() - played,
                     self.finish_s["publish"], self.finish_s["store"])
        for round_id in dict.fromkeys(job.round_id for job in jobs):
            self._end_rollouts(round_id)

    def _finish(self, record, spec: RoundSpec, episodes: list[Episode]) -> None:
        """Score a round's played episodes, hand the planner trajectories to its trainer,
        then record outcomes, d_k and the completed rollouts in ONE store transaction."""
        store, scored, cfg = self.p.store, spec.scored_models, spec.run
        planner_model = self.p.runtime.model
        outcomes: list[PlannerOutcomeIn] = []
        d_counts: dict[str, list[DCount]] = {}
        roles = [r for r in cfg.agents if r != "planner" and scored]
        started = time.perf_counter()
        if planner_model in scored:  # one confirm wait for the round's trajectories
            self.p.bus.publish_many([(self.p.queues.trainer(planner_model),
                                      TrajectoryMessage(trajectory=e.planner))
                                     for e in episodes])
        published = time.perf_counter()
        verifier = self.p.verifier(cfg)
        errors_before = verifier.errors
        for episode in episodes:
            job = episode.job
            correct, reward = score_episode(episode.answer, episode.format_ok,
                                            job.question.answer, verifier,
                                            cfg.rewards.planner, question=job.question.question)
            outcomes.append(PlannerOutcomeIn(
                query_id=job.question.id, rollout=job.rollout, attempt=job.attempt,
                format_ok=episode.format_ok, correct=correct, reward=reward))
            for role in roles:
                d_counts.setdefault(role, []).append(DCount(
                    query_id=job.question.id, rollout=job.rollout, attempt=job.attempt,
                    d=answered_calls(episode.trace, role),
                    invocations=answered_invocations(episode.trace, role)))
        stored = time.perf_counter()
        won = store.finish_episodes(record.round_id, outcomes, d_counts)
        self._count_verifier_errors(record, verifier.errors - errors_before)
        self.episodes_done += sum(won)  # a lost one: another attempt won, its rows are unread
        self.finish_s["publish"] += published - started
        self.finish_s["store"] += time.perf_counter() - stored

    def _count_verifier_errors(self, record, errors: int) -> None:
        """``planner/verifier_errors`` of the round: the answers this worker's verifier
        could not score (raised, or no number in [0, 1]; each scored 0), summed over its
        batches and upserted into the round's metrics."""
        if errors <= 0:
            return
        total = self.verifier_errors.get(record.round_id, 0) + errors
        self.verifier_errors[record.round_id] = total
        self.p.store.record_metrics(record.run_id, record.round_id,
                                    {"planner/verifier_errors": float(total)})

    def _end_rollouts(self, round_id: str) -> None:
        """A round whose rollouts are all complete goes to ``training`` (one that trains
        nothing, a difficulty filter, ends here) and its trainers get their cue."""
        store = self.p.store
        if not store.round_progress(round_id).done:
            return
        record = store.get_round(round_id)
        if record is None or record.status not in ("running", "training"):
            return
        scored = round_spec(record, self.p.cfg).scored_models
        if record.status == "running":  # not over a trainer's 'done' since the read above
            store.set_round_status(round_id, "training" if scored else "done",
                                   only_from=("running",))
        # the trainers' cue: check readiness now (they do not poll)
        self.p.bus.publish_many([(self.p.queues.trainer(model), RoundCommand(
            command="train", run_id=record.run_id, round_id=round_id, model=model,
            idempotency_key=f"round_command:{round_id}/rollouts-done/{model}"))
            for model in scored])
