"""How a workflow's run is played in this process: the runner registry.

A workflow (:mod:`mgrpo.workflows`) is a spec: its roles, turn order, rewards and config
checks. What trains a run of it here (``mgrpo train``) and evaluates one (``mgrpo eval``)
is its runner, registered on this side by workflow name with :func:`register_runner`
(:data:`RUNNERS`, a :class:`~mgrpo.registry.Registry`: ``get_runner``, ``runner_names``). The
built-ins are registered below: ``hierarchy`` (:func:`mgrpo.training.hierarchy_run.run_hierarchy`,
:func:`mgrpo.training.heldout.evaluate_hierarchy`) and ``turn_team``
(:func:`mgrpo.training.team_round.run_team_training`,
:func:`mgrpo.training.team_round.evaluate_team_request`).

:func:`train_run` and :func:`evaluate_run` find the function that plays a workflow the way
Python finds a method: the workflow's classes in method resolution order, the first that
has a runner registered under the ``name`` it declares, or that defines ``train`` /
``evaluate`` itself, plays it. So a user's subclass of a built-in (``class AcmePair(TurnTeam)``)
trains and evaluates as that built-in, and a user's own workflow, with no runner, plays its
``Workflow.train`` and ``Workflow.evaluate`` (docs/extending.md, docs/workflows.md).

What this module does not do: hold the run folder (:func:`mgrpo.training.loop.run_training`
does) or define a workflow.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mgrpo.registry import Registry
from mgrpo.training.config import RunConfig
from mgrpo.training.heldout import evaluate_hierarchy
from mgrpo.training.hierarchy_run import run_hierarchy
from mgrpo.training.run_rounds import RunResult
from mgrpo.training.team_round import evaluate_team_request, run_team_training
from mgrpo.workflows import EvalRequest, Workflow

TrainFn = Callable[[RunConfig, bool, bool, int | None, int], RunResult]
EvaluateFn = Callable[[RunConfig, EvalRequest], dict[str, Any]]


@dataclass(frozen=True)
class Runner:
    """What plays one workflow's runs: ``train(cfg, resume, progress, stop_after,
    log_every)`` (a :class:`RunResult`; the caller holds the run folder) and, when it has one,
    ``evaluate(cfg, request)`` (``mgrpo eval``'s JSON-able result)."""

    train: TrainFn
    evaluate: EvaluateFn | None = None


RUNNERS: Registry[Runner] = Registry("runner", hint="keyed by workflow name")
get_runner = RUNNERS.get
runner_names = RUNNERS.names


def register_runner(workflow_name: str, train: TrainFn,
                    evaluate: EvaluateFn | None = None) -> Runner:
    """Play the runs of the workflow named ``workflow_name`` (and of its subclasses that
    define neither method) with ``train`` and ``evaluate``; a second, different runner for
    that name is refused."""
    return RUNNERS.register(workflow_name, Runner(train, evaluate))


def _runner(workflow_name: str) -> Runner | None:
    return get_runner(workflow_name) if workflow_name in RUNNERS else None


def _played_by(flow: Workflow, method: str) -> Callable | None:
    """The function that plays ``method`` (``train`` or ``evaluate``) of ``flow``: its
    name's runner's, else the first of its classes (method resolution order) with a runner
    of that method or the method itself; None: ``Workflow``'s default."""
    runner = _runner(flow.name)
    if runner is not None and getattr(runner, method) is not None:
        return getattr(runner, method)
    for cls in type(flow).__mro__:
        if cls is Workflow:
            break
        runner = _runner(cls.__dict__.get("name", ""))
        if runner is not None and getattr(runner, method) is not None:
            return getattr(runner, method)
        if method in cls.__dict__:
            return getattr(flow, method)
    return None


def train_run(cfg: RunConfig, resume: bool, progress: bool, stop_after: int | None,
              log_every: int) -> RunResult:
    """Train ``cfg``'s run in this process with its workflow's runner (or the workflow's
    own ``train``). The caller holds the run folder (``run_training``)."""
    flow = cfg.flow
    train = _played_by(flow, "train") or flow.train
    return train(cfg, resume, progress, stop_after, log_every)


def evaluate_run(cfg: RunConfig, request: EvalRequest) -> dict[str, Any]:
    """Evaluate ``cfg``'s run as ``request`` asks (``mgrpo eval``) with its workflow's
    runner (or the workflow's own ``evaluate``; ``Workflow``'s refuses)."""
    flow = cfg.flow
    evaluate = _played_by(flow, "evaluate") or flow.evaluate
    return evaluate(cfg, request)


def evaluates(flow: Workflow) -> bool:
    """Whether ``mgrpo eval`` evaluates runs of ``flow`` (a runner's or its own
    ``evaluate``), not ``Workflow``'s refusal."""
    return _played_by(flow, "evaluate") is not None


register_runner("hierarchy", run_hierarchy, evaluate_hierarchy)
register_runner("turn_team", run_team_training, evaluate_team_request)
