"""``/v1/evaluations``: play one episode per held-out question and score it, as a background
job (``mgrpo.services.api.evaluation_jobs``) recorded in the store: ``POST`` answers 202 with
the job, ``GET /v1/evaluations/{id}`` polls it on any replica of the API."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Response

from mgrpo.services.api.deps import Authorized, State
from mgrpo.services.api.query_batcher import Busy
from mgrpo.services.api.schemas import EvaluationIn, EvaluationJobOut, errors

router = APIRouter(prefix="/v1/evaluations", tags=["evaluations"])

EvaluationId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$",
                                   description="The id POST /v1/evaluations answered.")]


@router.post("", response_model=EvaluationJobOut, status_code=202,
             summary="Start evaluating the current weights (a background job; poll its id)",
             responses=errors(400, 401, 403, 413, 429))
async def post_evaluation(body: EvaluationIn, state: State, _: Authorized,
                          response: Response) -> EvaluationJobOut:
    try:
        job = await state.evaluations.start(state, body)
    except Busy as busy:
        raise HTTPException(429, str(busy),
                            headers={"Retry-After": str(busy.retry_after_s)}) from busy
    response.headers["Location"] = f"/v1/evaluations/{job.evaluation_id}"
    return job


@router.get("", response_model=list[EvaluationJobOut],
            summary="The newest evaluations (of every API process), newest first")
def list_evaluations(state: State) -> list[EvaluationJobOut]:
    return state.evaluations.list()


@router.get("/{evaluation_id}", response_model=EvaluationJobOut, responses=errors(404),
            summary="One evaluation: running (episodes played so far), done (its result), "
                    "failed or interrupted (why)")
def get_evaluation(evaluation_id: EvaluationId, state: State) -> EvaluationJobOut:
    job = state.evaluations.get(evaluation_id)
    if job is None:
        raise HTTPException(404, f"evaluation {evaluation_id!r} does not exist; list them "
                            "with GET /v1/evaluations")
    return job
