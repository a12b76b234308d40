"""One round of a trainer (``TrainerService.rounds`` of
:class:`mgrpo.services.trainer.service.TrainerService`): train its model on the round's
trajectories, checkpoint, record metrics, publish, announce.

- :meth:`RoundTraining.train_round`: by the round's play (:data:`PLAY_TRAININGS`),
  :func:`mgrpo.training.rounds.train_model` on the recorded calls (rewards; the sub-agent
  side reads r_correct_main from the store's planner outcomes) or, for AT-GRPO (``tree``),
  ``tree_round.train_tree_model`` on every candidate; then an atomic, write-once checkpoint
  ``v = round index + 1``, ``store.record_checkpoint``, the round's metrics, THEN the group
  statistics of all its roles in one transaction (the "published" marker the round waits
  for), then the weights announcement, then ``done`` when every scored model has published.
  A round whose checkpoint is already recorded (a restart after the write) is not applied
  again: statistics are recomputed and re-published. A kill after the publish leaves the
  round published but not ``done``: ``TrainerService.pending_rounds`` finishes it (this
  round is not run again). A frozen model is scored only (no
  update, checkpoint or announcement). A trainer that lost its lease raises
  :class:`LeaseLost` before writing a checkpoint.
- :meth:`RoundTraining.staleness`: the ``{model}/staleness_max`` metric (and the bound of
  the asynchronous mode).
- :meth:`RoundTraining.judge`: the round's r_expert judges, rebuilt when the config changes.
- :meth:`RoundTraining.watch`: per run, the warnings of a run that learns nothing (its
  roles' groups at zero reward variance, grad_norm 0), logged after each round.

What this module does NOT do: decide which round is ready or count failures
(``service``, ``readiness``), or put a run's weights in the model (``weights``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

from mgrpo.algo.staleness import worst_staleness
from mgrpo.bus.messages import TrajectoryMessage, WeightsAnnouncement
from mgrpo.bus.transport import to_wire
from mgrpo.config import Settings
from mgrpo.envs import load_benchmark
from mgrpo.services.context import Queues, round_spec
from mgrpo.services.trainer.readiness import recorded_only
from mgrpo.services.trainer.weights import RunWeights, TrainedModel
from mgrpo.store import GroupStatIn
from mgrpo.training.config import RunConfig
from mgrpo.training.episode_text import sample_records, trajectory_record
from mgrpo.training.episodes import mix_seed
from mgrpo.training.judging import build_expert_judges, refresh_judge_weights
from mgrpo.training.loop import publish_stats
from mgrpo.training.round_spec import RoundSpec
from mgrpo.training.rounds import observed_d, train_model
from mgrpo.training.tree_round import train_tree_model
from mgrpo.training.watch import RunWatch

# the trainer's lines keep one logger name
log = logging.getLogger("mgrpo.services.trainer.service")


class LeaseLost(RuntimeError):
    """This trainer no longer holds its model's lease: another one may be training."""


def _latest(store, model: str, run_id: str) -> tuple[str, int] | None:
    found = store.latest_checkpoint(model, run_id=run_id)
    return None if found is None else (found.uri, found.version)


class RoundTraining:
    """One model's rounds: trains ``lm`` (its ``roles``; scored only when ``frozen``) with the
    run's weights put in and checkpointed by ``weights``, records to ``store`` and the
    ``sinks``, publishes and announces on ``bus``. ``lease_lost()`` says whether this trainer
    lost its lease ``lease_name`` (then no checkpoint is written). ``cfg``: the deployment's
    run config (for a round record without a :class:`RoundSpec`). Keeps the judges of the
    last config, one :class:`RunWatch` per run, and counts ``rounds_trained``."""

    def __init__(self, settings: Settings, cfg: RunConfig, store, bus, lm: TrainedModel,
                 roles: list[str], frozen: bool, weights: RunWeights, *,
                 lease_lost: Callable[[], bool] = lambda: False, lease_name: str = "",
                 sinks: tuple = ()) -> None:
        self.settings, self.cfg, self.store, self.bus = settings, cfg, store, bus
        self.lm, self.roles, self.frozen, self.weights = lm, roles, frozen, weights
        self.lease_lost, self.lease_name, self.sinks = lease_lost, lease_name, sinks
        self.rounds_trained = 0
        self._judge: tuple | None = None  # (the config's judges key, the judges)
        self._watches: dict[str, RunWatch] = {}

    def train_round(self, record, spec: RoundSpec | None = None) -> dict[str, float]:
        """Train on round ``record`` per its :class:`RoundSpec` (parsed here when not given)."""
        store, lm, round_id = self.store, self.lm, record.round_id
        marks = [("start", time.perf_counter())]  # phase timings, logged at the end
        spec = spec if spec is not None else round_spec(record, self.cfg)
        cfg = spec.run
        play = PLAY_TRAININGS[spec.round_play(record.index)]
        trajs, dropped = play.kept(self, round_id, store.round_trajectories(round_id, lm.name))
        outcomes = {(o.query_id, o.rollout): o for o in store.read_planner_outcomes(round_id)}
        d_seen = observed_d(store, record.run_id, self.roles)
        version = record.index + 1
        marks.append(("read", time.perf_counter()))
        self.weights.activate(record.run_id, cfg)
        marks.append(("activate", time.perf_counter()))
        already = store.latest_checkpoint(lm.name, run_id=record.run_id)
        applied = already is not None and already.round_id == round_id
        stale = {} if applied or self.frozen else self.staleness(cfg, trajs)
        optimizer, lm.optimizer = lm.optimizer, (None if applied else lm.optimizer)
        lm.model.train()
        try:
            metrics, stats = play.train(self, record, cfg, trajs, outcomes, d_seen)
        finally:
            lm.optimizer = optimizer
            lm.model.eval()
        if self.lease_lost():
            raise LeaseLost(f"lease {self.lease_name} lost while training round {round_id}; "
                            "no checkpoint written")
        marks.append(("train", time.perf_counter()))
        if not applied and not self.frozen:
            self.weights.save_checkpoint(version, round_id, record.run_id,
                                         keep=cfg.keep_checkpoints)
        record_ck = store.latest_checkpoint(lm.name, run_id=record.run_id)
        marks.append(("checkpoint", time.perf_counter()))
        # Metrics before the group stats: "published" is what marks the round done (here or
        # in another model's trainer), so a reader of a done round finds every model's
        # metrics. The metric upsert is idempotent, so a retry after a crash here is safe.
        recorded = {**metrics, **stale, f"{lm.name}/trajectories": float(len(trajs))}
        store.record_metrics(record.run_id, round_id, recorded)
        for warning in self.watch(record.run_id).check(record.index, recorded):
            log.warning(warning)
        completions = self.completions(cfg, trajs, record.index) if self.sinks else []
        for sink in self.sinks:
            sink.log(record.run_id, record.index, recorded)
            sink.log_completions(record.run_id, record.index, completions)
        self.dead_letter_unrecorded(dropped)
        publish_stats(store, round_id, lm.name, stats)
        if not stats:  # nothing to group (no calls this round): still say "published"
            store.publish_group_stats(round_id, lm.name, self.roles[0],
                                      [GroupStatIn(group_key="(none)", n=0, mean=0.0, std=0.0)],
                                      published_by=f"trainer-{lm.name}")
        if record_ck is not None and not self.frozen:
            self.bus.announce_weights(WeightsAnnouncement(
                model=lm.name, version=record_ck.version, uri=record_ck.uri,
                sha256=record_ck.sha256, round_id=round_id))
        if set(spec.scored_models) <= store.published_models(round_id):
            store.set_round_status(round_id, "done", only_from=("running", "training"))
        self.rounds_trained += 1
        marks.append(("publish", time.perf_counter()))
        log.info("trainer %s: round %s %s on %d trajectories (v%d); seconds %s", lm.name,
                 round_id, "scored" if self.frozen else "trained", len(trajs), lm.version,
                 " ".join(f"{name} {t - marks[i][1]:.3f}"
                          for i, (name, t) in enumerate(marks[1:])))
        return metrics

    def keep_recorded(self, round_id: str, trajs: list) -> tuple[list, list[tuple]]:
        """(kept, dropped) of an episodes round: the recorded (role, invocation) pairs only
        (:func:`~mgrpo.services.trainer.readiness.recorded_only`)."""
        return recorded_only(trajs, {r: self.store.observed_d(round_id, r)
                                     for r in self.roles if r != "planner"})

    def keep_every_candidate(self, round_id: str, trajs: list
                             ) -> tuple[list, list[tuple]]:
        """(kept, dropped) of a tree round: every ingested candidate, none dropped."""
        return trajs, []

    def train_episodes(self, record, cfg: RunConfig, trajs: list, outcomes: dict,
                       d_seen: dict) -> tuple[dict, list]:
        """(metrics, stats) of an episodes round: ``train_model`` with the round's judges
        (another model's judge with its newest weights)."""
        judges = self.judge(cfg)
        refresh_judge_weights(judges, cfg, lambda m: _latest(self.store, m, record.run_id))
        return train_model(self.lm, self.roles, trajs, outcomes, cfg, judges, d_seen,
                           record.index)

    def train_trees(self, record, cfg: RunConfig, trajs: list, outcomes: dict,
                    d_seen: dict) -> tuple[dict, list]:
        """(metrics, stats) of a tree round (AT-GRPO): per-turn groups of K candidates."""
        return train_tree_model(self.lm, self.roles, trajs, cfg, record.index)

    def dead_letter_unrecorded(self, dropped: list[tuple]) -> None:
        """Each ingested trajectory the round's record does not name (a hostile message, the
        late reply of a call that timed out) goes to the dead-letter queue with why, once
        per trained round, so nothing is left out silently."""
        queue = Queues(self.settings.queue_prefix).trainer(self.lm.name)
        for trajectory, reason in dropped:
            log.warning("trainer %s: %s", self.lm.name, reason)
            if self.bus is not None:
                self.bus.dead_letter(queue, to_wire(TrajectoryMessage(trajectory=trajectory)),
                                     reason)

    def completions(self, cfg: RunConfig, trajs: list, round_index: int) -> list[dict]:
        """``log_completions`` of the round's trajectories of this model, chosen by the
        run's seed and the round, decoded (``mgrpo.training.episode_text``)."""
        picked = sample_records(trajs, cfg.log_completions,
                                mix_seed(cfg.seed, "completions", self.lm.name, round_index))
        return [trajectory_record(t, self.lm.tokenizer) for t in picked]

    def watch(self, run_id: str) -> RunWatch:
        """The run's :class:`~mgrpo.training.watch.RunWatch` over this trainer's roles (zero
        reward variance, grad_norm 0 for N rounds in a row: logged as warnings)."""
        if run_id not in self._watches:
            self._watches[run_id] = RunWatch({r: self.lm.name for r in self.roles},
                                             [] if self.frozen else [self.lm.name])
        return self._watches[run_id]

    def staleness(self, cfg: RunConfig, trajs: list) -> dict[str, float]:
        """``{model}/staleness_max``: the trainer's version minus the oldest version that
        sampled the round (read, not derived from the round index: rounds may have failed).
        In the asynchronous mode (``max_staleness`` > 0) a sample beyond the bound fails the
        round (:class:`~mgrpo.algo.staleness.StalenessExceeded`: admission control
        should make that impossible)."""
        versions = [t.weights_version for t in trajs]
        if not versions:
            return {}
        bound = cfg.staleness(self.lm.name)
        worst = worst_staleness(self.lm.name, self.lm.version, versions, bound) if bound \
            else self.lm.version - min(versions)
        return {f"{self.lm.name}/staleness_max": float(worst)}

    def judge(self, cfg: RunConfig):
        """The round's r_expert judges (``training.judging``), rebuilt only when the round's
        ``judges``/``bench_dir`` differ from the last round's. An llm judge on this trainer's
        own model uses its engine (current weights); any other model is loaded here."""
        key = (cfg.bench_dir, repr(cfg.judges))
        if self._judge is None or self._judge[0] != key:
            lm = self.lm
            engines = {lm.name: (lm.engine, lm.tokenizer)}
            self._judge = (key, build_expert_judges(cfg, load_benchmark(cfg.bench_dir),
                                                    engines, device=self.settings.device,
                                                    roles=self.roles))
        return self._judge[1]


class PlayTraining(NamedTuple):
    """How a trainer trains a round of one play: which ingested trajectories it keeps
    (``kept``: (kept, dropped)) and what it trains them with (``train``: (metrics, stats))."""

    kept: Callable[[RoundTraining, str, list], tuple[list, list[tuple]]]
    train: Callable[..., tuple[dict, list]]


# a round's play (``RoundSpec.round_play``) -> how its trainer trains it
PLAY_TRAININGS: dict[str, PlayTraining] = {
    "episodes": PlayTraining(RoundTraining.keep_recorded, RoundTraining.train_episodes),
    "tree": PlayTraining(RoundTraining.keep_every_candidate, RoundTraining.train_trees),
}
