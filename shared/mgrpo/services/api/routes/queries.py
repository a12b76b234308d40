"""``POST /v1/queries``: answer a question through the planner and the registered sub-agents
(over the bus, through the sandbox) and return the full trace."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, HTTPException

from mgrpo.envs.questions import Question
from mgrpo.services.api.deps import Authorized, State
from mgrpo.services.api.query_batcher import Busy
from mgrpo.services.api.schemas import QueryIn, QueryOut, errors
from mgrpo.training.episodes import EpisodeJob, mix_seed

router = APIRouter(prefix="/v1/queries", tags=["queries"])


async def answer_query(state, body: QueryIn) -> QueryOut:
    """Admitted or refused at once; played in a batch on the model thread (never on the
    threads that serve /healthz and reads)."""
    query_id = f"q{uuid.uuid4().hex[:10]}"
    job = EpisodeJob(Question(id=query_id, question=body.question, answer=""),
                     round_id=f"query-{query_id}", rollout=0, seed=mix_seed(query_id))
    try:
        episode = await state.query_batcher().submit(job, body.greedy)
    except Busy as busy:
        raise HTTPException(429, str(busy),
                            headers={"Retry-After": str(busy.retry_after_s)}) from busy
    return QueryOut(answer=episode.answer, format_ok=episode.format_ok, trace=episode.trace,
                    weights_version=episode.planner.weights_version,
                    tokens=int(sum(episode.planner.response_mask)))


@router.post("", response_model=QueryOut, summary="Answer a question (answer + full trace)",
             responses=errors(400, 401, 403, 413, 429))
async def post_query(body: QueryIn, state: State, _: Authorized) -> QueryOut:
    return await answer_query(state, body)
