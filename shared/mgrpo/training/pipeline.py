"""The asynchronous embedded mode: round n+1 is sampled while round n trains.

A generation thread plays rounds in order on *sampler copies* of the trained models (their
own modules and :class:`~mgrpo.engines.torch_engine.TorchEngine`); the calling thread
scores, stores and trains each round as in :func:`mgrpo.training.round_store.finish_round`, on the
trainer's models, which the generation thread never touches. After every round the trainer
publishes each model's new weights (a detached copy, tagged with the version). Admission
control (:class:`mgrpo.algo.staleness.Admission`, ``"oldest"`` choice) decides when the
generation thread may start a round and which version it loads: exactly the oldest the bound
allows, ``round - max_staleness`` updates after the pipeline's start. So the run does not
depend on timing (the same config gives the same weights), every trajectory records the
version that sampled it (``weights_version``), and ``finish_round`` refuses a sample beyond
its model's bound. Nothing is discarded: every round the thread plays is trained.

The loss corrects for the stale samples with the existing decoupled correction: the
trainer recomputes pi_old with its current weights and weights the policy loss by the
truncated pi_old / pi_rollout (``loss.rollout_is``; :mod:`mgrpo.algo.rollout_correction`).

With every bound 0 this is the synchronous loop, sample for sample (tested: the same
weights). A resumed run restarts the pipeline at the state file's version: its first
``max_staleness`` rounds are sampled by that version (fresher than the uninterrupted run's).
Frozen models keep one engine, shared by both threads (no_grad forwards only). The
difficulty filter of a stage is played by the generation thread with the weights that
sample the stage's first round; held-out evaluation (``eval_every``) runs on the trainer's
weights between rounds.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from mgrpo.algo.staleness import Admission
from mgrpo.engines.torch_engine import TorchEngine
from mgrpo.training.round_store import (
    finish_round,
    open_round,
    round_id_of,
    take_completions,
)
from mgrpo.training.rounds import collect, sample_questions
from mgrpo.training.run_state import sync_sampler
from mgrpo.training.stages import stage_pool


@dataclass
class SampledRound:
    stage_index: int
    round_index: int
    questions: list
    episodes: list
    versions: dict[str, int]
    rollout_s: float


def sampler_system(system):
    """A view of ``system`` whose trained models sample from their own copies (frozen ones
    share the trainer's engine): what the generation thread plays with."""
    models = {}
    for name, lm in system.models.items():
        if lm.optimizer is None:
            models[name] = lm
            continue
        if getattr(lm.engine, "model", None) is not lm.model:
            raise ValueError(f"model {name!r} samples with {type(lm.engine).__name__}: the "
                             "asynchronous embedded mode (max_staleness > 0) samples trained "
                             "models with torch copies; use the torch engine for it, or "
                             "max_staleness 0")
        twin = copy.deepcopy(lm.model).eval()
        for p in twin.parameters():
            p.requires_grad_(False)
        engine = TorchEngine(twin, lm.tokenizer, device=str(next(twin.parameters()).device),
                             version=lm.version)
        models[name] = replace(lm, model=twin, engine=engine, optimizer=None)
    runtimes = {role: replace(rt, engine=models[rt.model].engine)
                for role, rt in system.runtimes.items()}
    return replace(system, models=models, runtimes=runtimes)


def _snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class _Published:
    """Each trained model's published weights by version, under one condition variable."""

    def __init__(self, system, admission: Admission):
        self.cond = threading.Condition()
        self.admission = admission
        self.versions = {m: system.models[m].version for m in admission.max_staleness}
        self.weights = {m: {v: _snapshot(system.models[m].model)}
                        for m, v in self.versions.items()}
        self.stopped = False

    def publish(self, system, next_round: int) -> None:
        with self.cond:
            for m in self.versions:
                lm = system.models[m]
                self.versions[m] = lm.version
                self.weights[m][lm.version] = _snapshot(lm.model)
                keep = self.admission.keep_from(m, next_round)
                for v in [v for v in self.weights[m] if v < keep]:
                    del self.weights[m][v]
            self.cond.notify_all()

    def wait_admitted(self, round_index: int) -> dict[str, tuple[int, dict]] | None:
        """Block until ``round_index`` is admitted; (version, weights) per model, or None
        once stopped."""
        with self.cond:
            self.cond.wait_for(lambda: self.stopped
                               or self.admission.admitted(round_index, self.versions))
            if self.stopped:
                return None
            chosen = self.admission.sample_versions(round_index, self.versions, "oldest")
            return {m: (v, self.weights[m][v]) for m, v in chosen.items()}

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


def _generate(sampler, published: _Published, rounds: list[tuple[int, int]], run_id: str,
              out: queue.Queue) -> None:
    """The generation thread: play ``rounds`` in order, each once admitted."""

    cfg = sampler.cfg
    pools: dict[int, list] = {}
    try:
        for stage_index, round_index in rounds:
            chosen = published.wait_admitted(round_index)
            if chosen is None:
                return
            for m, (version, weights) in chosen.items():
                lm = sampler.models[m]
                if lm.engine.version != version:
                    lm.model.load_state_dict(weights)
                    lm.version = version
                    sync_sampler(lm, weights)
            if stage_index not in pools:
                pools[stage_index] = stage_pool(sampler, stage_index, run_id)
            questions = sample_questions(pools[stage_index], cfg.queries_per_round, cfg.seed,
                                         round_index)
            t0 = time.perf_counter()
            episodes = collect(sampler, round_id_of(run_id, round_index), questions, cfg.k,
                               cfg.seed)
            out.put(SampledRound(stage_index, round_index, questions, episodes,
                                 {m: v for m, (v, _) in chosen.items()},
                                 time.perf_counter() - t0))
    except BaseException as exc:  # noqa: BLE001 - handed to the training thread
        out.put(exc)


def run_pipelined(system, store, run_id: str, rounds: list[tuple[int, int]],
                  on_round=None) -> int:
    """Train ``rounds`` ((stage index, round index), consecutive) with sampling one or more
    rounds ahead, per each model's ``max_staleness``. ``on_round(round_index, metrics)`` is
    called after each round is trained and checkpointed (logging, evaluation). Returns the
    rounds trained."""

    if not rounds:
        return 0
    cfg = system.cfg
    trained = [m for m in cfg.trained_models() if system.models[m].optimizer is not None]
    admission = Admission({m: cfg.staleness(m) for m in trained}, first_round=rounds[0][1],
                          first_version={m: system.models[m].version for m in trained})
    published = _Published(system, admission)
    sampler = sampler_system(system)
    out: queue.Queue = queue.Queue()
    thread = threading.Thread(target=_generate, name="mgrpo-sampler", daemon=True,
                              args=(sampler, published, rounds, run_id, out))
    thread.start()
    done = 0
    try:
        for _stage_index, round_index in rounds:
            item = out.get()
            if isinstance(item, BaseException):
                raise item
            if item.round_index != round_index:  # rounds arrive in order: a bug otherwise
                raise RuntimeError(f"sampled round {item.round_index}, expected {round_index}")
            open_round(store, cfg, run_id, round_index, [q.id for q in item.questions])
            metrics = finish_round(system, store, run_id, round_index, item.questions,
                                   item.episodes, item.rollout_s, admission=admission)
            published.publish(system, round_index + 1)
            done += 1
            if on_round is not None:
                on_round(round_index, metrics)
    finally:
        published.stop()
        thread.join()
    return done


def run_async(system, store, logger, schedule: list, done: int, stop_after: int | None,
              result, after_round: Callable[[Any, int, int], None]) -> bool:
    """The remaining rounds of ``schedule`` in the asynchronous mode, for
    :func:`mgrpo.training.run_rounds.run_rounds`: each round logged, then
    ``after_round(logger, round_index, len(schedule))``. True when every round ran (none
    held back by ``stop_after``)."""
    todo = [(s, r) for s, r in schedule[done:] if stop_after is None or r < stop_after]
    ticks = logger.progress(todo, desc="rounds")
    next(ticks, None)

    def on_round(round_index: int, metrics: dict) -> None:
        logger.log_round(round_index, metrics, take_completions(system, round_index))
        after_round(logger, round_index, len(schedule))
        result.rounds = round_index + 1
        next(ticks, None)

    run_pipelined(system, store, system.cfg.name, todo, on_round=on_round)
    return len(todo) == len(schedule) - done
