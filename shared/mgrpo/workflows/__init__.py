"""Registered multi-agent workflows (:mod:`mgrpo.workflows.base`): ``hierarchy`` and
``turn_team``; a user's from their ``plugins:``."""

from mgrpo.plugins import import_plugins
from mgrpo.workflows.base import (
    EvalRefused,
    EvalRequest,
    Workflow,
    get_workflow,
    refuse_embedded_only,
    refuse_outside_services,
    register_workflow,
    workflow_names,
)
from mgrpo.workflows.config import WorkflowConfig
from mgrpo.workflows.hierarchy import HIERARCHY, Hierarchy
from mgrpo.workflows.turn_team import TURN_TEAM, TurnTeam, world_for_run


def prepare_run_data(data: dict) -> dict:
    """A run config's raw fields, as its workflow fills them before validation (its
    ``plugins:`` imported first, so a plug-in's workflow is known)."""
    flow = data.get("workflow")
    if not isinstance(flow, dict):
        return data
    import_plugins(data.get("plugins") or [])
    return get_workflow(flow.get("kind", "hierarchy")).prepare(data)


__all__ = ["HIERARCHY", "TURN_TEAM", "EvalRefused", "EvalRequest", "Hierarchy", "TurnTeam",
           "Workflow", "WorkflowConfig", "get_workflow", "prepare_run_data",
           "refuse_embedded_only", "refuse_outside_services", "register_workflow",
           "workflow_names", "world_for_run"]
