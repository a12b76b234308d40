"""The runner registry (``mgrpo.training.runners``): which function trains and evaluates a
workflow's run in this process. The built-ins' runners, a subclass of a built-in playing as
it, a user's workflow playing its own ``train`` / ``evaluate``, and ``Workflow.evaluates``
(what the workflow side says of ``mgrpo eval``) matching what the registry plays."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mgrpo.training import heldout, hierarchy_run, runners, team_round
from mgrpo.workflows import (
    HIERARCHY,
    TURN_TEAM,
    EvalRefused,
    EvalRequest,
    TurnTeam,
    Workflow,
    get_workflow,
    workflow_names,
)


class _Pair(TurnTeam):
    name = "test_runners_pair"


class _Own(Workflow):
    name = "test_runners_own"

    def train(self, cfg, resume, progress, stop_after, log_every):
        return ("trained", cfg, resume, progress, stop_after, log_every)

    def evaluate(self, cfg, request):
        return {"evaluated": request.n}


class _Bare(Workflow):
    name = "test_runners_bare"


def test_the_built_ins_are_played_by_their_runners():
    assert runners._played_by(HIERARCHY, "train") is hierarchy_run.run_hierarchy
    assert runners._played_by(HIERARCHY, "evaluate") is heldout.evaluate_hierarchy
    assert runners._played_by(TURN_TEAM, "train") is team_round.run_team_training
    assert runners._played_by(TURN_TEAM, "evaluate") is team_round.evaluate_team_request


def test_a_subclass_of_a_built_in_plays_as_it():
    assert runners._played_by(_Pair(), "train") is team_round.run_team_training
    assert runners._played_by(_Pair(), "evaluate") is team_round.evaluate_team_request
    assert runners.evaluates(_Pair()) and _Pair().evaluates


def test_a_users_workflow_plays_its_own_train_and_evaluate():
    cfg = SimpleNamespace(flow=_Own())
    assert runners.train_run(cfg, True, False, 3, 2) == ("trained", cfg, True, False, 3, 2)
    assert runners.evaluate_run(cfg, EvalRequest(n=7)) == {"evaluated": 7}
    assert runners.evaluates(_Own())


def test_a_workflow_with_no_evaluation_refuses_mgrpo_eval():
    with pytest.raises(EvalRefused, match="workflow test_runners_bare defines no evaluation"):
        runners.evaluate_run(SimpleNamespace(flow=_Bare()), EvalRequest())
    with pytest.raises(NotImplementedError):
        runners.train_run(SimpleNamespace(flow=_Bare()), False, False, None, 1)
    assert not runners.evaluates(_Bare()) and not _Bare().evaluates


def test_what_a_workflow_says_of_mgrpo_eval_is_what_its_runner_plays():
    for name in workflow_names():
        flow = get_workflow(name)
        says = flow.evaluates or type(flow).evaluate is not Workflow.evaluate
        assert says == runners.evaluates(flow), name


def test_a_second_different_runner_for_a_name_is_refused():
    runners.register_runner("hierarchy", hierarchy_run.run_hierarchy,
                            heldout.evaluate_hierarchy)  # the same again: fine
    with pytest.raises(ValueError, match="runner 'hierarchy' is already registered"):
        runners.register_runner("hierarchy", team_round.run_team_training)
