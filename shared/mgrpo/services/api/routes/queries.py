"""``POST /v1/queries``: answer a question through the planner and the registered sub-agents
(over the bus, through the sandbox) and return the full trace."""

from __future__ import annotations

import uuid

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from mgrpo.envs.questions import Question
from mgrpo.services.api.deps import Authorized, State
from mgrpo.services.api.schemas import QueryIn, QueryOut
from mgrpo.training.episodes import EpisodeJob, mix_seed

router = APIRouter(prefix="/v1/queries", tags=["queries"])


def answer_query(state, body: QueryIn) -> QueryOut:
    planner = state.planner_runtime()
    query_id = f"q{uuid.uuid4().hex[:10]}"
    job = EpisodeJob(Question(id=query_id, question=body.question, answer=""),
                     round_id=f"query-{query_id}", rollout=0, seed=mix_seed(query_id))
    episode = planner.play([job], greedy=body.greedy)[0]
    return QueryOut(answer=episode.answer, format_ok=episode.format_ok, trace=episode.trace,
                    weights_version=episode.planner.weights_version,
                    tokens=int(sum(episode.planner.response_mask)))


@router.post("", response_model=QueryOut, summary="Answer a question (answer + full trace)")
async def post_query(body: QueryIn, state: State, _: Authorized) -> QueryOut:
    return await run_in_threadpool(answer_query, state, body)
