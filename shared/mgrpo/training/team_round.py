"""A ``turn_team`` run in this process (embedded mode): rounds of tree play on the world ->
store -> each model's AT-GRPO update -> checkpoint.

One round: B training tasks (a pure function of (seed, round)), played as AT-GRPO trees by
:class:`mgrpo.training.team_play.TeamSampler` (K candidates per (task, role, team turn),
the best continues). Candidates go through the stats store exactly as the hierarchy's trees
do (one rollout slot per candidate index k); each model's trainer reads back its own roles'
candidates and runs :func:`mgrpo.training.tree_round.train_tree_model`: advantages within
each (task, role, turn) group (``mgrpo.algo.at_grpo_advantages``) and the same policy update
as every other round (``mgrpo.training.update.policy_update``). A shared policy (one model
for every role) trains on all roles' samples; specialised policies each on their role's.

Held-out evaluation (:func:`evaluate_team`): the greedy team (one action per turn) on
``eval_questions`` tasks of the world's test split, before the first round and after the
last: ``eval/greedy/accuracy`` (solved), ``eval/greedy/team_reward``,
``eval/greedy/team_turns`` and each role's turn reward, local reward, malformed share and
turns; each task's team reward after the last round in ``eval_after_questions.json``. The
same function evaluates a team for ``mgrpo eval`` (:func:`evaluate_team_run`, any split, the
run's checkpoints or the starting weights) and ``mgrpo ablate`` (the swapped team).

What this module does not do: the services' mode (``mgrpo.services.team``, which plays
the same ``TeamSampler`` and trains with the same ``train_tree_model``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mgrpo.envs.worlds import SPLITS
from mgrpo.training.config import RunConfig
from mgrpo.training.episodes import AgentRuntime
from mgrpo.training.heldout import load_trained
from mgrpo.training.metrics import MetricsLogger
from mgrpo.training.round_store import open_round, round_id_of
from mgrpo.training.rounds import sample_questions
from mgrpo.training.run_rounds import RoundPlan, RunResult, run_rounds
from mgrpo.training.run_state import save_state
from mgrpo.training.system import LoadedModel, load_models
from mgrpo.training.team_play import TeamEpisode, TeamSampler
from mgrpo.training.tree_round import train_tree_models, tree_seed
from mgrpo.workflows import EvalRefused, EvalRequest, world_for_run


@dataclass
class TeamSystem:
    """A turn team in this process: its world, models and one runtime per role."""

    cfg: RunConfig
    world: Any
    models: dict[str, LoadedModel]
    runtimes: dict[str, AgentRuntime]
    extras: dict = field(default_factory=dict)

    def sampler(self, k: int | None = None) -> TeamSampler:
        """The team's tree sampler: ``k`` candidates per turn (default the config's K)."""
        flow = self.cfg.flow
        return TeamSampler(self.world, self.runtimes, self.cfg.sampling,
                           self.cfg.k if k is None else k, flow.alpha(self.cfg),
                           flow.max_turns(self.cfg))


def build_team_system(cfg: RunConfig, device: str = "cpu", sandbox: Any = None) -> TeamSystem:
    models = load_models(cfg, device)
    world = world_for_run(cfg, sandbox)
    runtimes = {role: AgentRuntime(role=role, model=name, engine=models[name].engine,
                                   tokenizer=models[name].tokenizer)
                for role, name in cfg.flow.roles(cfg).items()}
    return TeamSystem(cfg, world, models, runtimes)


def ingest_team(store, round_id: str, episodes: list[TeamEpisode], k: int) -> None:
    """Candidates into the store, one rollout per candidate slot k (its candidates of every
    (role, turn))."""
    for ep in episodes:
        qid = ep.task.task_id
        for slot in range(k):
            attempt = store.begin_attempt(round_id, qid, slot)
            if attempt is None:  # completed before a crash
                continue
            store.ingest_trajectories([t.model_copy(update={"attempt": attempt})
                                       for t in ep.candidates if t.rollout == slot])
            store.complete_rollout(round_id, qid, slot, attempt)


def team_metrics(episodes: list[TeamEpisode], world: Any, prefix: str) -> dict[str, float]:
    """Of the episodes' chosen paths: the solved fraction (team reward 1.0), the mean team
    reward (``World.score``) and the mean team turns."""
    n = max(len(episodes), 1)
    scores = [float(world.score(ep.state)) for ep in episodes]
    return {f"{prefix}/accuracy": sum(s == 1.0 for s in scores) / n,
            f"{prefix}/team_reward": sum(scores) / n,
            f"{prefix}/team_turns": sum(ep.state.team_turn for ep in episodes) / n}


def role_metrics(episodes: list[TeamEpisode], roles: tuple[str, ...],
                 prefix: str) -> dict[str, float]:
    """Per role, over the turns of the episodes' chosen paths: the mean turn reward
    (``alpha * team + local``, what training groups), the mean local reward, the share of
    malformed actions (``Turn.malformed``) and the role's turns per episode."""
    n = max(len(episodes), 1)
    out: dict[str, float] = {}
    for role in roles:
        chosen = [t for ep in episodes for t in ep.candidates
                  if t.agent == role and t.extra.get("chosen")]
        turns = [t for ep in episodes for t in ep.state.turns if t.role == role]
        count = max(len(turns), 1)
        out.update({f"{prefix}/{role}/turn_reward": sum(t.reward for t in chosen)
                    / max(len(chosen), 1),
                    f"{prefix}/{role}/local_reward": sum(t.reward for t in turns) / count,
                    f"{prefix}/{role}/malformed": sum(t.malformed for t in turns) / count,
                    f"{prefix}/{role}/turns": len(turns) / n})
    return out


def run_team_round(system: TeamSystem, store, run_id: str, round_index: int,
                   pool: list) -> dict[str, float]:
    cfg = system.cfg
    round_id = round_id_of(run_id, round_index)
    tasks = sample_questions(pool, cfg.queries_per_round, cfg.seed, round_index)
    open_round(store, cfg, run_id, round_index, [t.task_id for t in tasks])
    t0 = time.perf_counter()
    episodes = system.sampler().run(round_id, tasks, tree_seed(cfg, round_index))
    t1 = time.perf_counter()
    ingest_team(store, round_id, episodes, cfg.k)
    t2 = time.perf_counter()
    store.set_round_status(round_id, "training")
    metrics = train_tree_models(system.models, cfg.flow.roles(cfg), store, round_id, cfg,
                                round_index)
    t3 = time.perf_counter()
    save_state(system, round_index)
    generated = sum(ep.generated_tokens for ep in episodes)
    metrics.update(team_metrics(episodes, system.world, "team"))
    metrics.update({"rollout/generated_tokens": float(generated),
                    "time/rollout_s": t1 - t0, "time/ingest_s": t2 - t1,
                    "time/update_s": t3 - t2, "time/weight_sync_s": time.perf_counter() - t3})
    store.record_metrics(run_id, round_id, metrics)
    store.set_round_status(round_id, "done")
    return metrics


def evaluate_team(system: TeamSystem, tasks: list, greedy: bool = True) -> dict[str, float]:
    """The team on ``tasks``, one action per role and turn (greedy, or sampled at the
    config's temperature): under ``eval/greedy/`` (or ``eval/sampled/``) the
    :func:`team_metrics` and the :func:`role_metrics`."""
    return evaluate_team_tasks(system, tasks, greedy)[0]


def evaluate_team_tasks(system: TeamSystem, tasks: list, greedy: bool = True
                        ) -> tuple[dict[str, float], dict[str, float]]:
    """:func:`evaluate_team`'s metrics and each task's team reward ({task id: score}). The
    episodes' seed is the config's, so the same weights give the same numbers."""
    episodes = system.sampler(k=1).run("eval", tasks, system.cfg.seed, greedy=greedy)
    scores = {ep.task.task_id: float(system.world.score(ep.state)) for ep in episodes}
    prefix = "eval/greedy" if greedy else "eval/sampled"
    return {**team_metrics(episodes, system.world, prefix),
            **role_metrics(episodes, tuple(system.world.roles), prefix)}, scores


def evaluate_team_request(cfg: RunConfig, request: EvalRequest) -> dict[str, Any]:
    """``mgrpo eval`` on a ``turn_team`` run (its runner's, :mod:`mgrpo.training.runners`):
    the team, one action per role and turn, on the first ``n`` tasks of the world's
    ``split`` (:func:`evaluate_team_run`); the hierarchy's options are refused."""
    cfg.flow.refuse_options(request, "stage", "bench_seed", "subagent", "episodes")
    return evaluate_team_run(cfg, request.split, request.n, request.greedy,
                             request.checkpoints)


def evaluate_team_run(cfg: RunConfig, split: str, n: int, greedy: bool = True,
                      checkpoints: bool = False) -> dict[str, Any]:
    """``mgrpo eval`` on a ``turn_team`` run: :func:`evaluate_team` on the first ``n`` tasks
    of the world's ``split`` (the config's seed), played by the run's latest checkpoints
    (``checkpoints``) or the models' starting paths; the metrics plus what was evaluated."""
    if split not in SPLITS:
        raise EvalRefused(f"--split {split!r}: a world's splits are {', '.join(SPLITS)}",
                          "pass --split test (the default), dev or train")
    if n < 1:
        raise EvalRefused(f"--n {n}: evaluate at least one task", "pass --n 1 or more")
    system = build_team_system(cfg)
    try:
        tasks = system.world.tasks(split, n, cfg.seed)
    except ValueError as exc:
        raise EvalRefused(str(exc), "pass a smaller --n") from None
    versions = load_trained(system) if checkpoints else {}
    metrics = evaluate_team(system, tasks, greedy)
    flow = cfg.workflow
    return {**metrics, "world": flow.world, "split": split, "tasks": len(tasks),
            "seed": cfg.seed, "decoding": "greedy" if greedy else "sampled",
            "roles": dict(flow.roles),
            "models": {name: cfg.models[name].path for name in system.models},
            "weights": {name: f"{cfg.name} v{v}" for name, v in versions.items()}
            or "models' paths"}


def write_task_scores(out_dir: Path, scores: dict[str, float]) -> None:
    """``eval_after_questions.json`` ({"greedy": {task id: score}}), what paired comparisons
    (``mgrpo compare``, ``mgrpo ablate``) read."""
    import json

    Path(out_dir, "eval_after_questions.json").write_text(json.dumps({"greedy": scores}))


class TeamPlan(RoundPlan):
    """The ``turn_team`` workflow's rounds: :func:`run_team_round` on the world's training
    tasks; the greedy team on its test tasks before and after."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.system = build_team_system(cfg)
        self.pool: list = []
        self.test: list = []

    def prepare(self, done: int) -> None:
        cfg, world = self.cfg, self.system.world
        self.pool = world.tasks("train", cfg.workflow.train_tasks, cfg.seed)
        self.test = world.tasks("test", cfg.eval_questions, cfg.seed)

    def evaluate_before(self, logger: MetricsLogger) -> dict[str, float]:
        metrics = evaluate_team(self.system, self.test)
        logger.log_eval(0, metrics, "before")
        return metrics

    def evaluate_after(self, logger: MetricsLogger, step: int) -> dict[str, float]:
        metrics, scores = evaluate_team_tasks(self.system, self.test)
        write_task_scores(Path(self.cfg.out_dir), scores)
        logger.log_eval(step, metrics, "after")
        return metrics

    def play_round(self, store, stage_index: int, round_index: int) -> dict[str, float]:
        return run_team_round(self.system, store, self.cfg.name, round_index, self.pool)


def run_team_training(cfg: RunConfig, resume: bool, progress: bool, stop_after: int | None,
                      log_every: int) -> RunResult:
    """The ``turn_team`` workflow's run (its runner's, :mod:`mgrpo.training.runners`; called
    by ``mgrpo.training.loop.run_training``)."""
    return run_rounds(cfg, resume, progress, stop_after, log_every, TeamPlan)
