"""Training rounds: start (``POST /v1/rounds``), list, inspect, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from mgrpo.services.api.deps import Authorized, State
from mgrpo.services.api.routes.health import embedded_problem, missing_round_workers
from mgrpo.services.api.schemas import RoundId, RoundIn, RoundOut, RunId, errors
from mgrpo.services.context import round_spec
from mgrpo.services.rounds import (
    RoundConflict,
    RoundRefused,
    RoundTooBig,
    cancel_round,
    check_init_from,
    check_round_size,
    round_summary,
    start_round,
)
from mgrpo.services.team import is_team
from mgrpo.training.overrides import overridden

router = APIRouter(prefix="/v1/rounds", tags=["rounds"])


def _summary(state, round_id: str) -> RoundOut:
    summary = round_summary(state.store, round_id, state.cfg)
    if summary is None:
        raise HTTPException(404, f"round {round_id!r} does not exist; list rounds with "
                            "GET /v1/rounds")
    return RoundOut(**summary)


def _start(state, body: RoundIn) -> RoundOut:
    if (problem := embedded_problem(state.settings, state)) is not None:
        raise HTTPException(409, problem)  # it would stay running: nothing plays it
    overrides = {k: v for k, v in {"queries_per_round": body.queries_per_round,
                                   "k": body.k, "init_from": body.init_from}.items()
                 if v is not None}
    try:
        cfg = overridden(state.cfg, overrides)
    except ValidationError as error:  # a combination the run config refuses: 422, not 500
        raise RequestValidationError([{"loc": ("body", *e["loc"]), "type": e["type"],
                                       "msg": e["msg"]} for e in error.errors()]) from error
    bench = None if is_team(cfg) else state.benchmark()  # a turn team: its world's tasks
    try:
        check_round_size(cfg, bench)
    except RoundTooBig as error:
        raise RequestValidationError([{"loc": ("body", "queries_per_round"),
                                       "type": "value_error", "msg": str(error)}]) from error
    try:
        if state.settings.mode == "distributed" and state.settings.round_needs_workers:
            check_init_from(state.store, cfg, body.run_id or cfg.name)  # bad input first
            if missing := missing_round_workers(state, cfg):
                raise HTTPException(409, f"no live worker for {len(missing)} role(s) this "
                                    f"round needs, so it would never finish: "
                                    f"{'; '.join(missing)}; start them and post again "
                                    "(GET /readyz lists missing sub-agents)")
        record = start_round(state.store, state.bus, cfg, state.queues, run_id=body.run_id,
                             bench=bench)
    except RoundConflict as error:
        raise HTTPException(409, str(error)) from error
    except RoundRefused as error:  # the same 422 shape as every other bad input
        raise RequestValidationError([{"loc": ("body",), "type": "value_error",
                                       "msg": str(error)}]) from error
    return _summary(state, record.round_id)


@router.post("", response_model=RoundOut, status_code=201,
             responses=errors(400, 401, 403, 409, 413),
             summary="Start a training round: B queries x K rollouts enqueued")
async def post_round(body: RoundIn, state: State, _: Authorized) -> RoundOut:
    return await run_in_threadpool(_start, state, body)


@router.get("", response_model=list[RoundOut],
            summary="List rounds (newest last) with their trained and published models; "
                    "progress and metrics only on GET /v1/rounds/{round_id}")
def list_rounds(state: State, run_id: Annotated[RunId | None, Query()] = None
                ) -> list[RoundOut]:
    rounds = state.store.list_rounds(run_id)
    published = state.store.published_models_by_round([r.round_id for r in rounds])
    return [RoundOut(**r.model_dump(exclude={"config"}),
                     trained_models=round_spec(r, state.cfg).trained_models,
                     published_models=sorted(published[r.round_id]))
            for r in rounds]


@router.get("/{round_id}", response_model=RoundOut, responses=errors(404),
            summary="One round: progress, published models, metrics")
def get_round(round_id: Annotated[RoundId, Path()], state: State) -> RoundOut:
    return _summary(state, round_id)


@router.post("/{round_id}/cancel", response_model=RoundOut, summary="Cancel a round",
             responses=errors(401, 403, 404))
def post_cancel(round_id: Annotated[RoundId, Path()], state: State, _: Authorized
                ) -> RoundOut:
    if cancel_round(state.store, round_id) is None:
        raise HTTPException(404, f"round {round_id!r} does not exist; list rounds with "
                            "GET /v1/rounds")
    return _summary(state, round_id)
