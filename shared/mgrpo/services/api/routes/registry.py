"""``GET /v1/agents`` (the sub-agent registry) and ``GET /v1/checkpoints``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from mgrpo.services.api.deps import State
from mgrpo.services.api.schemas import MAX_AGE_S, AgentOut, CheckpointOut, ModelName, RunId

router = APIRouter(tags=["registry"])


@router.get("/v1/agents", response_model=list[AgentOut], summary="Registered sub-agents")
def list_agents(state: State, alive_within_s: Annotated[float | None, Query(
        gt=0, le=MAX_AGE_S, allow_inf_nan=False,
        description="Only agents heard from in the last N seconds (at most 10 years).")] = None
                ) -> list[AgentOut]:
    return [AgentOut(**a.model_dump()) for a in state.store.list_agents(alive_within_s)]


@router.get("/v1/checkpoints", response_model=list[CheckpointOut],
            summary="Recorded checkpoints (each a version of a model in a run)")
def list_checkpoints(state: State, model: Annotated[ModelName | None, Query(
        description="Only this model's checkpoints (a model name, not a path).")] = None,
                     run_id: Annotated[RunId | None, Query(
        description="Only this run's checkpoints (versions are per run).")] = None
                     ) -> list[CheckpointOut]:
    return [CheckpointOut(**c.model_dump())
            for c in state.store.list_checkpoints(model, run_id=run_id)]
