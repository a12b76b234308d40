"""One model's trainer service (SPEC 2.2 step 4): ingest that model's trajectories, wait for
its part of each round, train with the library, checkpoint, publish, announce.

- Ingestion (``trainer.<model>``): a ``TrajectoryMessage`` is upserted into the store (keyed
  by traj_id + attempt, so a redelivery adds no row). A trajectory of another model is
  refused (dead-letter queue, with the reason).
- Readiness (:func:`round_ready`): every rollout completed AND, for each role this model
  plays, the completing attempts' trajectories are all ingested: one per rollout for the
  planner, d_k per rollout for a sub-agent (d_k recorded by the planner worker).
- Runs: before a round, the trainer switches to ITS run's newest recorded checkpoint,
  weights AND optimizer state (Adam moments, saved next to each checkpoint by
  :mod:`mgrpo.services.optimizer_state`, vouched for by its manifest); a run without one
  starts from its ``init_from`` (another run's checkpoint, only when named) or the model's
  folder, with a fresh optimizer. Checkpoints go under the run's own root
  (``{checkpoint_uri}/{run_id}/{model}/v{version:06d}``) and the store keys them by run.
- Training: :func:`mgrpo.training.rounds.train_model` (rewards; the sub-agent side reads
  r_correct_main from the store's planner outcomes), then an atomic, write-once checkpoint
  ``v = round index + 1``, ``store.record_checkpoint``, the round's metrics, THEN the group
  statistics (the "published" marker the round waits for), then the weights announcement.
- Failure: a round whose training raises :data:`ROUND_ATTEMPTS` times in a row (a bad
  config, a missing reference model, a bug) is marked ``failed`` with the reason (type and
  message, shown by ``GET /v1/rounds/{id}``) and logged; the trainer moves on instead of
  retrying it forever. Infrastructure errors (``mgrpo.bus.errors.is_transient``: store or
  broker unreachable) do not count: they are retried at the next poll.
- Restart safety: a trainer killed at any point restarts from the newest checkpoint the store
  records. If that checkpoint already belongs to the round, the update is not applied again
  (statistics are recomputed and re-published, an overwrite); otherwise the round is trained
  from the previous weights and optimizer state. A recorded version is never rewritten;
  leftovers of the killed write (temp folders, temp optimizer files, a complete version the
  store never recorded) are removed when the trainer first works on the run.

- One active trainer per model: a trainer consumes and trains only while it holds the store
  lease ``trainer:<model>`` (:class:`mgrpo.services.lease.LeaseKeeper`, renewed in the
  background). A second trainer of the same model logs that it waits (standby), and takes
  over when the lease is released (clean stop) or expires (the first one died); one that
  loses its lease stops before writing a checkpoint.

What this module does NOT do: train a frozen model (main-only ablation).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass

import torch

from mgrpo.bus.errors import is_transient
from mgrpo.bus.messages import RoundCommand, TrajectoryMessage, WeightsAnnouncement
from mgrpo.config import Settings
from mgrpo.services.context import (
    Queues,
    folder_weights,
    initial_weights,
    load_engine,
    trained_models,
)
from mgrpo.services.lease import LeaseKeeper
from mgrpo.services.optimizer_state import load_optimizer_state, save_optimizer_state
from mgrpo.store import GroupStatIn
from mgrpo.training.config import RunConfig
from mgrpo.training.loop import publish_stats
from mgrpo.training.rounds import observed_d, train_model

log = logging.getLogger(__name__)
ROUND_ATTEMPTS = 3  # tries of one round's training before it is marked failed


class LeaseLost(RuntimeError):
    """This trainer no longer holds its model's lease: another one may be training."""


@dataclass
class TrainedModel:
    """The shape :func:`train_model` expects (``LoadedModel`` of embedded mode)."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    engine: object
    optimizer: torch.optim.Optimizer | None
    version: int = 0
    ref_model: torch.nn.Module | None = None  # KL reference, built on first use (reference.py)


def roles_of(cfg: RunConfig, model: str) -> list[str]:
    return [role for role, m in cfg.agents.items() if m == model]


def expected_subagent_trajectories(store, role: str, round_id: str) -> tuple[int, int]:
    """(completed rollouts with a recorded d_k, sum of their d_k) of ``role`` in the round;
    completing attempts only (``store.observed_d``)."""
    counts = store.observed_d(round_id, role)
    return len(counts), sum(c.d for c in counts)


def round_ready(store, round_id: str, model: str, roles: list[str]) -> bool:
    """True when this model's part of the round is complete (see the module docstring)."""
    progress = store.round_progress(round_id)
    if not progress.done:
        return False
    for role in roles:
        have = store.count_round_trajectories(round_id, model, agent=role)
        if role == "planner":
            if have < progress.total:
                return False
            continue
        rows, expected = expected_subagent_trajectories(store, role, round_id)
        if rows < progress.total or have < expected:
            return False
    return True


class TrainerService:
    def __init__(self, settings: Settings, cfg: RunConfig, store, bus, model: str,
                 poll_s: float = 0.5) -> None:
        if model not in cfg.models:
            raise ValueError(f"--model {model!r} is not in the run config's models "
                             f"{sorted(cfg.models)}; add it under `models:` or fix the flag")
        self.settings, self.cfg, self.store, self.bus = settings, cfg, store, bus
        self.model_name, self.poll_s = model, poll_s
        self.roles = roles_of(cfg, model)
        self.frozen = not cfg.models[model].trainable
        self.queues = Queues(settings.queue_prefix)
        self.rounds_trained = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.lm: TrainedModel | None = None
        self._judge = None
        self._failures: dict[str, int] = {}  # round_id -> consecutive training errors
        self._weights_of: tuple[str, str] | None = None  # (run, source) in self.lm
        self._cleaned: set[str] = set()
        holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease = LeaseKeeper(store, f"trainer:{model}", holder, settings.trainer_lease_s)
        self._leased = False  # True once start() runs under the lease
        self.tensorboard = None
        if settings.tensorboard_dir:
            from mgrpo.training.tb_sink import TensorBoardSink

            self.tensorboard = TensorBoardSink(settings.tensorboard_dir, model)

    def load(self) -> None:
        """Load the model's folder; the weights of a run are put in by :meth:`activate`."""
        model, tokenizer, engine = load_engine(self.cfg.models[self.model_name].path,
                                               self.settings.device)
        optimizer = (None if self.frozen else
                     torch.optim.Adam(model.parameters(), lr=self.cfg.models[self.model_name].lr))
        self.lm = TrainedModel(self.model_name, model, tokenizer, engine, optimizer,
                               engine.version)

    def run_root(self, run_id: str) -> str:
        from mgrpo.models.checkpoint import run_root

        return run_root(self.settings.checkpoint_uri, run_id)

    def activate(self, run_id: str, round_config: dict | None = None) -> None:
        """Put ``run_id``'s newest recorded checkpoint (weights + optimizer state) in the
        model, or, before the run has one, its initial weights with a fresh optimizer. A
        no-op when they are in already. The first time, removes the leftovers of killed
        writes of this model in this run."""
        from mgrpo.models.checkpoint import clean_leftovers, discard_version, list_versions

        lm, store = self.lm, self.store
        record = store.latest_checkpoint(lm.name, run_id=run_id)
        if run_id not in self._cleaned:
            root = self.run_root(run_id)
            removed = clean_leftovers(root, lm.name)
            recorded = {c.version for c in store.list_checkpoints(lm.name, run_id=run_id)}
            for version in list_versions(root, lm.name):
                if version not in recorded:  # written, never committed: a killed trainer's
                    discard_version(root, lm.name, version)
                    removed.append(f"v{version:06d}")
            if removed:
                log.info("trainer %s: removed leftovers of killed writes in run %s: %s",
                         lm.name, run_id, removed)
            self._cleaned.add(run_id)
        if round_config is None:
            run = store.get_run(run_id)
            round_config = dict(run.config) if run is not None else {}
        source = record.uri if record is not None else initial_weights(store, lm.name,
                                                                       round_config)
        if self._weights_of == (run_id, source):
            return
        lr = round_config.get("models", {}).get(lm.name, {}).get(
            "lr", self.cfg.models[lm.name].lr)
        if lm.optimizer is not None:
            lm.optimizer = torch.optim.Adam(lm.model.parameters(), lr=lr)
        if record is not None:
            lm.engine.load_weights(record.uri, record.version)
            moments = lm.optimizer is not None and load_optimizer_state(lm.optimizer, record.uri)
            log.info("trainer %s: run %s resumes from v%d (%s)", lm.name, run_id,
                     record.version, "with its optimizer state" if moments else
                     "fresh optimizer state")
        else:
            lm.engine.load_weights(folder_weights(source), 0)
            log.info("trainer %s: run %s starts from %s", lm.name, run_id, source)
        lm.version = lm.engine.version
        self._weights_of = (run_id, source)

    def start(self) -> None:
        if self.lm is None:
            self.load()
        if self.frozen:
            log.info("trainer %s is frozen (trainable: false): nothing to train", self.model_name)
            return
        self._leased = True
        self.lease.start()
        threading.Thread(target=self._serve, name=f"trainer-{self.model_name}",
                         daemon=True).start()

    def _serve(self) -> None:
        """Consume and train once this process holds the model's lease."""
        if not self.lease.wait_held(self._stop):
            return
        self.bus.consume(self.queues.trainer(self.model_name), self.handle,
                         consumer=f"trainer-{self.model_name}")
        self._loop()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._leased:
            self.lease.stop(release=True)
        if self.tensorboard is not None:
            self.tensorboard.close()

    def handle(self, message) -> None:
        if isinstance(message, RoundCommand):
            self._wake.set()
            return
        if not isinstance(message, TrajectoryMessage):
            raise TypeError(f"trainer.{self.model_name} takes trajectory and round_command "
                            f"messages, got {message.kind!r}")
        traj = message.trajectory
        if traj.model != self.model_name:
            raise ValueError(f"trajectory {traj.traj_id!r} is of model {traj.model!r}, sent to "
                             f"trainer {self.model_name!r}; send it to trainer.{traj.model}")
        self.store.ingest_trajectory(traj)
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._leased and not self.lease.held():
                self._weights_of = None  # another trainer may write checkpoints meanwhile
                self.lease.wait_held(self._stop)
                continue
            try:
                self.train_ready_rounds()
            except Exception:  # keep serving; the next poll retries (logged with traceback)
                log.exception("trainer %s: round failed", self.model_name)

    def pending_rounds(self) -> list:
        out = []
        for record in self.store.list_rounds():
            if record.status in ("running", "training") \
                    and self.model_name in trained_models(record.config) \
                    and self.model_name not in self.store.published_models(record.round_id):
                out.append(record)
        return sorted(out, key=lambda r: (r.created_at, r.index))

    def train_ready_rounds(self) -> int:
        done = 0
        for record in self.pending_rounds():
            if not round_ready(self.store, record.round_id, self.model_name, self.roles):
                break  # rounds train in order
            try:
                self.train_round(record)
            except Exception as error:  # noqa: BLE001 - counted, then the round fails
                self._weights_of = None  # maybe half-updated: the retry reloads from the store
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

    def train_round(self, record) -> dict[str, float]:
        store, lm, round_id = self.store, self.lm, record.round_id
        cfg = RunConfig.model_validate({k: v for k, v in record.config.items()
                                        if k != "trained_models"})
        trajs = store.round_trajectories(round_id, lm.name)
        outcomes = {(o.query_id, o.rollout): o for o in store.read_planner_outcomes(round_id)}
        d_seen = observed_d(store, record.run_id, self.roles)
        version = record.index + 1
        self.activate(record.run_id, record.config)
        already = store.latest_checkpoint(lm.name, run_id=record.run_id)
        applied = already is not None and already.round_id == round_id
        optimizer, lm.optimizer = lm.optimizer, (None if applied else lm.optimizer)
        lm.model.train()
        try:
            metrics, stats = train_model(lm, self.roles, trajs, outcomes, cfg, self.judge(cfg),
                                         d_seen, record.index)
        finally:
            lm.optimizer = optimizer
            lm.model.eval()
        if self._leased and not self.lease.held():
            raise LeaseLost(f"lease {self.lease.name} lost while training round {round_id}; "
                            "no checkpoint written")
        if not applied:
            self.save_checkpoint(version, round_id, record.run_id)
        record_ck = store.latest_checkpoint(lm.name, run_id=record.run_id)
        # Metrics before the group stats: "published" is what marks the round done (here or
        # in another model's trainer), so a reader of a done round finds every model's
        # metrics. The metric upsert is idempotent, so a retry after a crash here is safe.
        recorded = {**metrics, f"{lm.name}/trajectories": float(len(trajs))}
        store.record_metrics(record.run_id, round_id, recorded)
        if self.tensorboard is not None:
            self.tensorboard.log(record.run_id, record.index, recorded)
        publish_stats(store, round_id, lm.name, stats)
        if not stats:  # nothing to group (no calls this round): still say "published"
            store.publish_group_stats(round_id, lm.name, self.roles[0],
                                      [GroupStatIn(group_key="(none)", n=0, mean=0.0, std=0.0)],
                                      published_by=f"trainer-{lm.name}")
        self.bus.announce_weights(WeightsAnnouncement(
            model=lm.name, version=record_ck.version, uri=record_ck.uri,
            sha256=record_ck.sha256, round_id=round_id))
        if set(trained_models(record.config)) <= store.published_models(round_id):
            store.set_round_status(round_id, "done")
        self.rounds_trained += 1
        log.info("trainer %s: round %s trained on %d trajectories (v%d)", lm.name, round_id,
                 len(trajs), record_ck.version)
        return metrics

    def save_checkpoint(self, version: int, round_id: str | None, run_id: str) -> str:
        """Optimizer state, then the weights (atomic, write-once; the manifest names the
        optimizer file and its sha256, and the parent the update started from), then the
        store record: a checkpoint is recorded only when complete. Returns its URI."""
        from mgrpo.models.checkpoint import MANIFEST, save_checkpoint, version_uri

        lm, root = self.lm, self.run_root(run_id)
        extra: dict = {"round_id": round_id, "run_id": run_id,
                       "parent": self._weights_of[1] if self._weights_of else None}
        if lm.optimizer is not None:
            extra["optimizer"] = save_optimizer_state(lm.optimizer,
                                                      version_uri(root, lm.name, version))
        uri = save_checkpoint(lm.model, root, lm.name, version, tokenizer=lm.tokenizer,
                              extra=extra)
        self.store.record_checkpoint(lm.name, version, uri, _sha256(f"{uri}/{MANIFEST}"),
                                     round_id=round_id, run_id=run_id)
        lm.engine.version = lm.version = version
        self._weights_of = (run_id, uri)
        return uri

    def judge(self, cfg: RunConfig):
        """The round's r_expert judges (``training.judging``), rebuilt only when the round's
        ``judges``/``bench_dir`` differ from the last round's. An llm judge on this trainer's
        own model uses its engine (current weights); any other model is loaded here."""
        key = (cfg.bench_dir, repr(cfg.judges))
        if self._judge is None or self._judge[0] != key:
            from mgrpo.envs import load_benchmark
            from mgrpo.training.judging import build_expert_judges

            lm = self.lm
            engines = {lm.name: (lm.engine, lm.tokenizer)} if lm is not None else {}
            self._judge = (key, build_expert_judges(cfg, load_benchmark(cfg.bench_dir),
                                                    engines, device=self.settings.device,
                                                    roles=self.roles))
        return self._judge[1]


def _sha256(uri: str) -> str:
    import fsspec

    with fsspec.open(uri, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()
