"""Workflows: the shapes of a multi-agent system, registered by name.

A workflow is a spec: it declares its roles and which model (policy) plays each (one model
for all roles: a shared policy; one per role: specialised policies), who acts after whom
(the turn order or the delegation graph), when an episode ends, what the team and the local
rewards are, and which run configs it refuses. The run config's ``workflow: {kind: ...}``
names one; without ``workflow`` a run is the ``hierarchy``.

Built in: ``hierarchy`` (:mod:`mgrpo.workflows.hierarchy`: a planner delegating to tool
sub-agents) and ``turn_team`` (:mod:`mgrpo.workflows.turn_team`: a team of roles taking
turns on a :class:`~mgrpo.envs.worlds.World`). A user's workflow is registered from their
own package (``plugins:``) with :func:`register_workflow`.

How a run of a workflow trains in this process (``mgrpo train``) and is evaluated
(``mgrpo eval``, the command's options as an :class:`EvalRequest`) is the training side's:
the runner registered for the workflow's name in :mod:`mgrpo.training.runners` (the
built-ins'). A workflow without one (a user's) plays its own :meth:`Workflow.train` and
:meth:`Workflow.evaluate`.

What this module does NOT do: play episodes, evaluate or train; it imports nothing of
``mgrpo.training`` (the run config only for annotations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from mgrpo.registry import Registry

if TYPE_CHECKING:
    from mgrpo.training.config import RunConfig


@dataclass(frozen=True)
class EvalRequest:
    """What ``mgrpo eval`` asks of a workflow: ``n`` items of ``split`` (the first ones, the
    same for the same config), greedy or sampled decoding, the run's latest checkpoints or
    the models' starting paths. ``stage``, ``bench_seed``, ``subagent`` and ``episodes``
    are the hierarchy's (its benchmark's stages and generator seed, one sub-agent alone, the
    first ``episodes`` episodes as text); a workflow without them refuses them
    (:meth:`Workflow.refuse_options`)."""

    split: str = "test"
    n: int = 200
    greedy: bool = True
    checkpoints: bool = False
    stage: int | Literal["all"] | None = None
    bench_seed: int | None = None
    subagent: str | None = None
    episodes: int | None = None


class EvalRefused(ValueError):
    """``mgrpo eval`` cannot evaluate as asked: ``str()`` says why, ``hint`` what to do."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


class Workflow:
    """One workflow. A subclass sets ``name`` and ``description`` and overrides what
    differs; an instance is registered with :func:`register_workflow`."""

    name: str = ""
    description: str = ""
    team_reward: str = ""  # what the team reward is (one line, for docs and `mgrpo` help)
    local_reward: str = ""  # what each role's local reward is
    embedded_only: bool = True  # plays no benchmark questions: `mgrpo up` and
    # `mgrpo data transcripts` (which play the hierarchy) refuse it
    distributed: bool = False  # the service entry points (`mgrpo serve ...`) run its rounds
    reads_bench: bool = True  # its runs read the benchmark at `bench_dir` (`mgrpo config
    # check` requires the folder only then)
    evaluates: bool = False  # `mgrpo eval` evaluates its runs: the built-ins, whose runner
    # (mgrpo.training.runners) evaluates; a workflow overriding `evaluate` does too

    def prepare(self, data: dict[str, Any]) -> dict[str, Any]:
        """A run config's raw fields before validation (fill what the workflow implies,
        e.g. ``agents`` from its roles); the default changes nothing."""
        return data

    def check(self, cfg: RunConfig) -> None:
        """Refuse a validated run config this workflow cannot run (a one-line ValueError)."""

    def roles(self, cfg: RunConfig) -> dict[str, str]:
        """Role -> the model (an entry of ``models``) that plays it."""
        return dict(cfg.agents)

    def turn_order(self, cfg: RunConfig) -> dict[str, tuple[str, ...]]:
        """Who may act after each role: the delegation graph of a hierarchy, the next role
        of a turn-based team."""
        raise NotImplementedError

    def max_turns(self, cfg: RunConfig) -> int:
        """The most turns an episode lasts (the outer loop's: planner turns, team turns)."""
        raise NotImplementedError

    def train(self, cfg: RunConfig, resume: bool, progress: bool, stop_after: int | None,
              log_every: int):
        """Train a run of this workflow in this process; returns a
        :class:`mgrpo.training.run_rounds.RunResult`. Called by ``run_training``, which holds the
        run folder, for a workflow with no runner of its own (:mod:`mgrpo.training.runners`:
        the built-ins have one)."""
        raise NotImplementedError

    def evaluate(self, cfg: RunConfig, request: EvalRequest) -> dict[str, Any]:
        """Evaluate a run of this workflow in this process (``mgrpo eval``): its metrics and
        what was evaluated, JSON-able; for a workflow with no runner of its own
        (:mod:`mgrpo.training.runners`). The default refuses (an :class:`EvalRefused`)."""
        raise EvalRefused(f"mgrpo eval: workflow {self.name} defines no evaluation",
                          "its held-out numbers are `mgrpo train`'s (eval/greedy/*, before "
                          "and after); a workflow evaluates by overriding Workflow.evaluate")

    def refuse_options(self, request: EvalRequest, *options: str) -> None:
        """An :class:`EvalRefused` naming the first of ``options`` (``stage``,
        ``bench_seed``, ``subagent``, ``episodes``) that ``request`` sets: this workflow has
        no use for it."""
        for option in options:
            if getattr(request, option) is not None:
                flag = "--" + option.replace("_", "-")
                raise EvalRefused(f"mgrpo eval {flag}: workflow {self.name} has no "
                                  f"{option.replace('_', ' ')} (it belongs to the "
                                  "hierarchy's benchmark)", f"drop {flag}")


def refuse_embedded_only(cfg: RunConfig, command: str, nested: bool = False) -> None:
    """A one-line ValueError when ``cfg``'s workflow cannot run under ``command`` (the
    services, or a command that plays the benchmark's questions). ``nested``: ``command``
    plays sub-agents that delegate; the others refuse a nested hierarchy (``agents: {role:
    {model: ..., calls: [...]}}``)."""
    flow = cfg.flow
    if flow.embedded_only:
        where = ("`mgrpo train` or the service entry points (`mgrpo serve planner-worker`, "
                 "`subagent --name ROLE`, `trainer --model M`)" if flow.distributed
                 else "`mgrpo train` only")
        evaluated = flow.evaluates or type(flow).evaluate is not Workflow.evaluate
        held_out = ("`mgrpo eval`, and `mgrpo train`'s before and after" if evaluated else
                    "`mgrpo train`'s before and after")
        raise ValueError(f"{command} plays the hierarchy (planner + sub-agents); workflow "
                         f"{flow.name} trains with {where} (its held-out evaluation: "
                         f"{held_out}, eval/greedy/*)")
    if not nested:
        refuse_nested(cfg, command)


def refuse_outside_services(cfg: RunConfig, command: str = "the services") -> None:
    """A one-line ValueError, naming ``command``, when the services cannot run ``cfg``'s
    workflow. A nested hierarchy runs: each sub-agent worker that delegates sends its own
    calls (``mgrpo.services.subagent.worker``)."""
    flow = cfg.flow
    if not flow.distributed:
        where = "" if command == "the services" else f"{command}: "
        raise ValueError(f"{where}the services do not run workflow {flow.name}; it trains in "
                         "this process only: `mgrpo train`")


def refuse_nested(cfg: RunConfig, command: str) -> None:
    """A one-line ValueError when ``cfg`` is a nested hierarchy (a sub-agent with ``calls``)
    and ``command`` plays every role with one teacher (``mgrpo data transcripts``), which
    plays one level of sub-agents."""
    calls = {r: cs for r, cs in cfg.delegation.items() if r != "planner" and cs}
    if calls:
        raise ValueError(f"{command} cannot play nested delegation ({calls}): it plays one "
                         "level of sub-agents; a nested hierarchy trains with `mgrpo train` "
                         "or the services and is measured with `mgrpo eval`")


WORKFLOWS: Registry[Workflow] = Registry(
    "workflow", hint="a workflow of your own: register_workflow in a module named under "
                     "`plugins:`",
    same=lambda known, new: type(known) is type(new))  # a module imported twice: a new instance
get_workflow = WORKFLOWS.get
workflow_names = WORKFLOWS.names


def register_workflow(workflow: Workflow) -> Workflow:
    """Register ``workflow`` under its own ``name``; a second workflow of another type under
    that name is refused."""
    return WORKFLOWS.register(workflow.name, workflow)
