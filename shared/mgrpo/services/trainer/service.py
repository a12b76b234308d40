"""One model's trainer service (docs/services.md, 'One round (distributed)', step 5): ingest that
model's trajectories, wait for its part of each round, train with the library, checkpoint, publish,
announce.

- Ingestion (``trainer.<model>``): batched, one transaction per batch, idempotent
  (:mod:`mgrpo.services.trainer.ingest`); every ingested batch wakes the round loop.
- Readiness (:func:`mgrpo.services.trainer.readiness.round_ready`): every rollout completed and this
  model's trajectories of the completing attempts all ingested (AT-GRPO: the tree counts
  the planner worker recorded; training then groups per (query, agent, turn),
  ``tree_round.train_tree_model``). It is checked when an event arrives, not on a clock:
  after each ingested batch, and on the ``RoundCommand`` the planner worker sends once a
  round's rollouts are all complete (the last of the two events finds the round ready), and
  once as soon as the trainer holds its lease (start-up, a standby taking over: what a killed
  trainer left is finished at once). A slow poll (:data:`POLL_S`) remains only as a safety
  net (a lost command); a failed pass is retried after :data:`RETRY_S`.
- Runs: before a round, the trainer switches to ITS run's newest recorded checkpoint,
  weights AND optimizer state (Adam moments, saved next to each checkpoint by
  :mod:`mgrpo.parallel.optimizer_state`, vouched for by its manifest); a run without one
  starts from its ``init_from`` (another run's checkpoint, only when named) or the model's
  folder, with a fresh optimizer. Checkpoints go under the run's own root
  (``{checkpoint_uri}/{run_id}/{model}/v{version:06d}``) and the store keys them by run
  (:mod:`mgrpo.services.trainer.weights`).
- Training: :func:`mgrpo.training.rounds.train_model` (rewards; the sub-agent side reads
  r_correct_main from the store's planner outcomes), then an atomic, write-once checkpoint
  ``v = round index + 1``, ``store.record_checkpoint``, the round's metrics, THEN the group
  statistics of all its roles in one transaction (the "published" marker the round waits
  for), then the weights announcement; the trainer that finds every scored model published
  marks the round ``done`` (:mod:`mgrpo.services.trainer.round_training`).
- Failure: a round whose training raises :data:`ROUND_ATTEMPTS` times in a row (a bad
  config, a missing reference model, a bug) is marked ``failed`` with the reason (type and
  message, shown by ``GET /v1/rounds/{id}``) and logged; the trainer moves on instead of
  retrying it forever. Infrastructure errors (``mgrpo.bus.errors.is_transient``: store or
  broker unreachable) do not count: they are retried after :data:`RETRY_S`.
- Restart safety: a trainer killed at any point restarts from the newest checkpoint the store
  records. If that checkpoint already belongs to the round, the update is not applied again
  (statistics are recomputed and re-published, an overwrite); otherwise the round is trained
  from the previous weights and optimizer state. A round whose scored models have all
  published but which is not ``done`` (the last publisher was killed before the status
  write) is marked ``done`` by the next pass of any of its trainers (:meth:`pending_rounds`);
  its weights announcement is not repeated (workers read the newest recorded checkpoint from
  the store before each round). A recorded version is never rewritten;
  leftovers of the killed write (temp folders, temp optimizer files, a complete version the
  store never recorded) are removed when the trainer first works on the run.

- One active trainer per model: a trainer consumes and trains only while it holds the store
  lease ``trainer:<model>`` (:class:`mgrpo.services.trainer.lease.LeaseKeeper`, renewed in the
  background). A second trainer of the same model logs that it waits (standby), and takes
  over when the lease is released (clean stop) or expires (the first one died); one that
  loses its lease stops before writing a checkpoint.

- Frozen models (``trainable: false``, main-only): their trainer runs the same loop for the
  rounds that score them (``scored_models``): rewards, group statistics and metrics as
  embedded mode records them; no update, checkpoint or announcement. A round is ``done``
  when every scored model has published.

- Several devices: under ``torchrun`` (``MGRPO_TRAINER_NPROC`` > 1) this service is rank 0
  of a data-parallel job (FSDP2 or DDP); :mod:`mgrpo.parallel.ranks` hooks in through
  ``TrainedModel.ranks`` (loads, updates and checkpoint saves on every rank: the optimizer
  state sharded by DCP), nothing else changes.

This file holds the service's life cycle (load, lease, consume, the round loop, counting
failures). It owns two parts, built by :meth:`TrainerService.load` around the loaded model:
``weights`` (:class:`~mgrpo.services.trainer.weights.RunWeights`: a run's weights and
checkpoints) and ``rounds`` (:class:`~mgrpo.services.trainer.round_training.RoundTraining`:
one round).

What this module does NOT do: train a frozen model (main-only ablation).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from mgrpo.bus.errors import is_transient
from mgrpo.config import Settings
from mgrpo.engines.registry import build_engine
from mgrpo.services.batching import consume_batches
from mgrpo.services.context import Queues, round_spec
from mgrpo.services.dependencies import store_problem
from mgrpo.services.trainer.ingest import INGEST_BATCH, INGEST_LINGER_S, TrajectoryIngest
from mgrpo.services.trainer.lease import LeaseKeeper
from mgrpo.services.trainer.readiness import (  # noqa: F401 - re-exported (tests)
    expected_subagent_trajectories,
    roles_of,
    round_ready,
)
from mgrpo.services.trainer.round_training import LeaseLost, RoundTraining
from mgrpo.services.trainer.weights import (  # noqa: F401 - re-exported (tests, ranks)
    RunWeights,
    TrainedModel,
    put_state,
)
from mgrpo.training.config import RunConfig
from mgrpo.training.precision import make_optimizer, prepare_for_training
from mgrpo.training.tb_sink import TensorBoardSink
from mgrpo.training.wandb_sink import WandbSink

log = logging.getLogger(__name__)
ROUND_ATTEMPTS = 3  # tries of one round's training before it is marked failed
POLL_S = 10.0  # safety net only: readiness is checked when a batch or round command arrives
RETRY_S = 0.5  # after a failed pass (a training error, the store down)


def log_failed_pass(model: str, error: Exception) -> None:
    """Log a training pass that raised: a transient failure (the store or the broker down:
    ``mgrpo.bus.errors``) is a WARNING without traceback, since the pass is retried and no round
    failed; anything else an ERROR with its traceback."""
    if is_transient(error):
        log.warning("trainer %s: training pass interrupted by a transient failure (%s: %s); "
                    "retried in %.1f s, no round failed", model, type(error).__name__, error,
                    RETRY_S)
        return
    log.error("trainer %s: training pass failed; retried in %.1f s", model, RETRY_S,
              exc_info=error)


class TrainerService:
    def __init__(self, settings: Settings, cfg: RunConfig, store, bus, model: str,
                 poll_s: float = POLL_S) -> None:
        if model not in cfg.models:
            raise ValueError(f"--model {model!r} is not in the run config's models "
                             f"{sorted(cfg.models)}; add it under `models:` or fix the flag")
        self.settings, self.cfg, self.store, self.bus = settings, cfg, store, bus
        self.model_name, self.poll_s = model, poll_s
        self.roles = roles_of(cfg, model)
        self.frozen = not cfg.models[model].trainable
        self.queues = Queues(settings.queue_prefix)
        self._wake = threading.Event()
        self.ingest = TrajectoryIngest(store, model, ingested=self._wake.set,
                                       max_tokens=cfg.models[model].max_trajectory_tokens)
        self._stop = threading.Event()
        self.lm: TrainedModel | None = None
        self.weights: RunWeights | None = None  # built by load()
        self.rounds: RoundTraining | None = None  # built by load()
        self._failures: dict[str, int] = {}  # round_id -> consecutive training errors
        holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease = LeaseKeeper(store, f"trainer:{model}", holder, settings.trainer_lease_s)
        self._leased = False  # True once start() runs under the lease
        self._reported: str | None = None  # the problem last written on the lease row
        self.tensorboard = self.wandb = None
        if settings.tensorboard_dir and "tensorboard" in cfg.report_to:
            self.tensorboard = TensorBoardSink(settings.tensorboard_dir, model)
        if "wandb" in cfg.report_to:  # ImportError of one line without the package
            self.wandb = WandbSink(model=model)

    def load(self) -> None:
        """Load the model's folder and build the parts around it: ``weights`` (a run's weights
        are put in by :meth:`RunWeights.activate`) and ``rounds``."""
        mcfg = self.cfg.models[self.model_name]
        model, tokenizer, engine = build_engine("torch", mcfg.path, self.settings.device,
                                                lora=mcfg.lora)
        optimizer = None
        if not self.frozen:
            prepare_for_training(model, mcfg)  # gradient checkpointing when asked
            optimizer = make_optimizer(model, mcfg)
        self.lm = TrainedModel(self.model_name, model, tokenizer, engine, optimizer,
                               engine.version)
        self.ingest.vocab_size = model.get_input_embeddings().weight.shape[0]
        self.weights = RunWeights(self.settings, self.cfg, self.store, self.lm)
        self.rounds = RoundTraining(
            self.settings, self.cfg, self.store, self.bus, self.lm, self.roles, self.frozen,
            self.weights, lease_lost=self.lease_lost, lease_name=self.lease.name,
            sinks=tuple(s for s in (self.tensorboard, self.wandb) if s is not None))

    @property
    def rounds_trained(self) -> int:
        return self.rounds.rounds_trained if self.rounds is not None else 0

    def lease_lost(self) -> bool:
        """Whether this trainer runs under its lease (:meth:`start`) and no longer holds it."""
        return self._leased and not self.lease.held()

    def start(self) -> None:
        if self.lm is None:
            self.load()
        if self.frozen:
            log.info("trainer %s is frozen (trainable: false): it scores its trajectories "
                     "(rewards, group statistics, metrics) and never updates", self.model_name)
        self._leased = True
        self.lease.start()
        threading.Thread(target=self._serve, name=f"trainer-{self.model_name}",
                         daemon=True).start()

    def _serve(self) -> None:
        """Consume and train once this process holds the model's lease."""
        if not self.lease.wait_held(self._stop):
            return
        try:  # the deployment run's weights in now, as the workers do: not in its 1st round
            self.weights.activate(self.cfg.name, self.cfg)
        except Exception:  # its first round's activate tries again (and reports)
            log.exception("trainer %s: could not load run %s's weights at start-up",
                          self.model_name, self.cfg.name)
            self.weights.forget()
        consume_batches(self.bus, self.queues.trainer(self.model_name),
                        self.ingest.handle_batch,
                        consumer=f"trainer-{self.model_name}", batch_size=INGEST_BATCH,
                        linger_s=INGEST_LINGER_S, claims=False, stop=self._stop,
                        heartbeat_s=self.settings.trainer_heartbeat_s)
        self._loop()

    def not_ready(self) -> list[str]:
        """Why this trainer cannot finish a round now (its ``/readyz``): its store is
        unreachable, its last checkpoint write found the disk full, or it is a standby (it
        does not hold the lease ``trainer:<model>``; :meth:`LeaseKeeper.standby_reason`)."""
        standby = self.lease.standby_reason() if self._leased else None
        disk = self.weights.checkpoint_problem if self.weights is not None else None
        return [p for p in (store_problem(self.store), disk, standby) if p]

    def report_problem(self) -> None:
        """Write what keeps this trainer from finishing rounds (a full checkpoint disk, until
        it has room again: :meth:`RunWeights.recheck_disk`) on its lease row, where the
        planner API reads it (``POST /v1/rounds`` refuses a round this model would fail;
        ``/readyz`` warns). Written when it changes; a store that does not answer: next pass."""
        if self.weights is None:
            return
        self.weights.recheck_disk()
        problem = self.weights.checkpoint_problem
        if problem == self._reported:
            return
        try:
            if self.store.set_lease_problem(self.lease.name, self.lease.holder, problem):
                self._reported = problem
        except Exception as error:  # noqa: BLE001 - retried after the next pass
            log.warning("trainer %s: cannot write its problem on lease %s (%s)",
                        self.model_name, self.lease.name, error)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._leased:
            self.lease.stop(release=True)
        for sink in (self.tensorboard, self.wandb):
            if sink is not None:
                sink.close()

    def handle_batch(self, messages: list) -> dict[int, str]:
        """:meth:`TrajectoryIngest.handle_batch` (``mgrpo.services.trainer.ingest``)."""
        return self.ingest.handle_batch(messages)

    def handle(self, message) -> None:
        """One message (tests, other transports): :meth:`handle_batch` of one."""
        refused = self.handle_batch([message])
        if refused:
            raise ValueError(refused[0])

    def _loop(self) -> None:
        """Check readiness at once, then when woken (a batch ingested, a round command) and
        at once after taking the lease over; ``poll_s`` is only a safety net, and a failed or
        interrupted pass is retried after RETRY_S."""
        timeout = 0.0  # the first pass at once: finish what a killed trainer left
        while not self._stop.is_set():
            self._wake.wait(timeout)
            self._wake.clear()
            timeout = self.poll_s
            if self.lease_lost():
                self.weights.forget()  # another trainer may write checkpoints meanwhile
                self.lease.wait_held(self._stop)
                self._reported = None  # a lease taken again starts without a problem
                timeout = 0.0  # taken over: a pass at once
                continue
            try:
                self.train_ready_rounds()
            except Exception as error:  # noqa: BLE001 - keep serving; retried shortly
                log_failed_pass(self.model_name, error)
                timeout = RETRY_S
            self.report_problem()
            if self._failures:  # a round's training raised: try it again shortly
                timeout = RETRY_S

    def pending_rounds(self) -> list[tuple]:
        """(record, :class:`RoundSpec`) of the rounds this model still has to train, oldest
        first (unfinished rounds only are read, with their published models in one query).
        An unfinished round this model has published is not trained again; when every scored
        model has published it, it is marked ``done`` here (its last publisher stopped
        between the publish and the status write)."""
        specs = [(r, round_spec(r, self.cfg))
                 for r in self.store.list_rounds(statuses=("running", "training"))]
        specs = [(r, spec) for r, spec in specs if self.model_name in spec.scored_models]
        published = self.store.published_models_by_round([r.round_id for r, _ in specs])
        out = []
        for r, spec in specs:
            if self.model_name not in published[r.round_id]:
                out.append((r, spec))
            elif set(spec.scored_models) <= published[r.round_id]:
                self._finish_published(r.round_id)
        return sorted(out, key=lambda pair: (pair[0].created_at, pair[0].index))

    def _finish_published(self, round_id: str) -> None:
        """Mark ``done`` a round every scored model has published (compare-and-set: only
        from ``running`` or ``training``)."""
        if self.store.set_round_status(round_id, "done", only_from=("running", "training")):
            log.info("trainer %s: round %s had every model's statistics published but was "
                     "not done (its last publisher stopped before marking it); marked done",
                     self.model_name, round_id)

    def train_ready_rounds(self) -> int:
        done = 0
        for record, spec in self.pending_rounds():
            if not round_ready(self.store, record.round_id, self.model_name, self.roles,
                               spec.round_play(record.index)):
                break  # rounds train in order
            try:
                self.rounds.train_round(record, spec)
            except Exception as error:  # noqa: BLE001 - counted, then the round fails
                self.weights.forget()  # maybe half-updated: the retry reloads from the store
                if isinstance(error, LeaseLost):
                    log.error("trainer %s: %s", self.model_name, error)
                    break
                if is_transient(error):  # the store or broker is down: not the round's fault
                    raise
                self._round_failed(record, error)
                break
            self._failures.pop(record.round_id, None)
            done += 1
        return done

    def _round_failed(self, record, error: Exception) -> None:
        """Count a training error; at :data:`ROUND_ATTEMPTS` mark the round failed."""
        tries = self._failures.get(record.round_id, 0) + 1
        self._failures[record.round_id] = tries
        log.error("trainer %s: round %s failed to train (try %d/%d)", self.model_name,
                  record.round_id, tries, ROUND_ATTEMPTS, exc_info=error)
        if tries >= ROUND_ATTEMPTS:
            reason = (f"trainer {self.model_name}: {type(error).__name__}: {error}")[:2000]
            self.store.set_round_status(record.round_id, "failed", error=reason)
            self._failures.pop(record.round_id, None)
            log.error("trainer %s: round %s marked failed after %d tries: %s",
                      self.model_name, record.round_id, tries, reason)
