"""The dashboard (``GET /ui``) and the read endpoints it polls (docs/dashboard.md).

Every endpoint here is a read: no token needed. The page starts rounds through the existing
``POST /v1/rounds`` with the bearer token the user types in. Data assembly lives in
``mgrpo.dashboard``; these handlers only validate ids and map "unknown" to 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.responses import HTMLResponse

from mgrpo.dashboard import data, page, trace
from mgrpo.services.api.deps import State
from mgrpo.services.api.schemas import RoundId, RunId, errors
from mgrpo.services.context import stored_run_config

router = APIRouter(tags=["dashboard"])
QueryId = Annotated[str, Path(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:-]+$")]


@router.get("/ui", response_class=HTMLResponse, summary="The training dashboard (HTML)")
def ui() -> HTMLResponse:
    return HTMLResponse(page.html())


@router.get("/v1/dashboard", summary="What the dashboard may do here (mode, round start)")
def info(state: State) -> dict[str, Any]:
    return {"mode": state.settings.mode, "can_start_rounds": state.bus is not None,
            "token_required": bool(state.settings.api_token)
            or state.settings.mode == "distributed"}


@router.get("/v1/runs", summary="Runs with their round counts")
def list_runs(state: State) -> list[dict[str, Any]]:
    return data.list_runs(state.store, state.run_dir)


def _run(state, run_id: str):
    run = state.store.get_run(run_id)
    if run is None:
        raise HTTPException(404, f"run {run_id!r} does not exist; list runs with GET /v1/runs")
    return run


@router.get("/v1/runs/{run_id}/summary", responses=errors(404),
            summary="What a run is: algorithm, K, B, models, rounds done/planned, status, "
                    "held-out accuracy before/after (embedded)")
def run_summary(run_id: Annotated[RunId, Path()], state: State) -> dict[str, Any]:
    _run(state, run_id)
    return data.run_summary(state.store, run_id, state.run_dir)


@router.get("/v1/runs/{run_id}/rounds", responses=errors(404),
            summary="A run's rounds: status, timings, rollouts completed")
def run_rounds(run_id: Annotated[RunId, Path()], state: State) -> list[dict[str, Any]]:
    _run(state, run_id)
    return data.run_rounds(state.store, run_id)


@router.get("/v1/runs/{run_id}/metrics", responses=errors(404),
            summary="A run's curves per round, grouped into charts (one line per agent)")
def run_metrics(run_id: Annotated[RunId, Path()], state: State) -> dict[str, Any]:
    _run(state, run_id)
    csv_path = state.run_dir / "metrics.csv" if state.run_dir is not None else None
    return data.run_metrics(state.store, run_id, csv_path)


@router.get("/v1/runs/{run_id}/warnings", responses=errors(404),
            summary="Signs that a run learns nothing, per round (docs/metrics.md, Warnings)")
def run_warnings(run_id: Annotated[RunId, Path()], state: State,
                 stalled_after_s: Annotated[float, Query(
                     ge=0, le=86400, description="Warn about an unfinished round without "
                     "progress this long (seconds).")] = data.STALLED_AFTER_S
                 ) -> list[dict[str, Any]]:
    _run(state, run_id)
    return data.run_warnings(state.store, run_id, stalled_after_s)


@router.get("/v1/runs/{run_id}/checkpoints", responses=errors(404),
            summary="A run's checkpoints")
def run_checkpoints(run_id: Annotated[RunId, Path()], state: State) -> list[dict[str, Any]]:
    _run(state, run_id)
    return data.checkpoints(state.store, run_id, state.run_dir)


@router.get("/v1/runs/{run_id}/completions", responses=errors(404),
            summary="A few episodes per round as people read them (embedded runs: "
                    "completions.jsonl), the last ones")
def run_completions(run_id: Annotated[RunId, Path()], state: State,
                    limit: Annotated[int, Query(ge=1, le=500)] = data.COMPLETIONS_SHOWN
                    ) -> list[dict[str, Any]]:
    _run(state, run_id)
    return data.completions(state.run_dir, limit)


def _round(state, round_id: str):
    record = state.store.get_round(round_id)
    if record is None:
        raise HTTPException(404, f"round {round_id!r} does not exist; list rounds with "
                            "GET /v1/rounds")
    return record


@router.get("/v1/rounds/{round_id}/group_stats", responses=errors(404),
            summary="Group statistics of a round per (model, agent)")
def round_group_stats(round_id: Annotated[RoundId, Path()], state: State
                      ) -> list[dict[str, Any]]:
    _round(state, round_id)
    return data.group_stats(state.store, round_id)


@router.get("/v1/rounds/{round_id}/episodes", responses=errors(404),
            summary="A round's completed episodes (question, reward, correct)")
def round_episodes(round_id: Annotated[RoundId, Path()], state: State
                   ) -> list[dict[str, Any]]:
    _round(state, round_id)
    return data.episodes(state.store, round_id, data.question_lookup(state.store,
                                                                     state.benchmark))


@router.get("/v1/rounds/{round_id}/episodes/{query_id}/{rollout}", responses=errors(404),
            summary="One episode's trace: planner turns, sub-agent calls, raw outputs, rewards")
def episode(round_id: Annotated[RoundId, Path()], query_id: QueryId,
            rollout: Annotated[int, Path(ge=0, le=4096)], state: State) -> dict[str, Any]:
    record = _round(state, round_id)
    cfg = stored_run_config(state.store, record.run_id) or state.cfg
    found = trace.episode_trace(state.store, round_id, query_id, rollout,
                                trace.tokenizer_from_config(cfg),
                                data.question_lookup(state.store, state.benchmark))
    if found is None:
        raise HTTPException(404, f"round {round_id!r} has no completed rollout {rollout} of "
                            f"query {query_id!r}; list them with GET "
                            f"/v1/rounds/{round_id}/episodes")
    return found
