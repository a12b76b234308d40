"""``GET /v1/agents`` (the sub-agent registry) and ``GET /v1/checkpoints``."""

from __future__ import annotations

from fastapi import APIRouter, Query

from mgrpo.services.api.deps import State
from mgrpo.services.api.schemas import AgentOut, CheckpointOut

router = APIRouter(tags=["registry"])


@router.get("/v1/agents", response_model=list[AgentOut], summary="Registered sub-agents")
def list_agents(state: State, alive_within_s: float | None = Query(None, gt=0)
                ) -> list[AgentOut]:
    return [AgentOut(**a.model_dump()) for a in state.store.list_agents(alive_within_s)]


@router.get("/v1/checkpoints", response_model=list[CheckpointOut],
            summary="Recorded checkpoints")
def list_checkpoints(state: State, model: str | None = None) -> list[CheckpointOut]:
    return [CheckpointOut(**c.model_dump()) for c in state.store.list_checkpoints(model)]
