"""``POST /v1/evaluations``: play one episode per held-out question and score it."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, HTTPException
from fastapi.concurrency import run_in_threadpool

from mgrpo.envs.rewards import ExactMatchVerifier
from mgrpo.services.api.deps import Authorized, State
from mgrpo.services.api.schemas import EvaluationIn, EvaluationOut, errors
from mgrpo.training.episodes import EpisodeJob, mix_seed
from mgrpo.training.scoring import score_episode

router = APIRouter(prefix="/v1/evaluations", tags=["evaluations"])


def evaluate(state, body: EvaluationIn) -> EvaluationOut:
    questions = state.benchmark().questions(body.split)[: body.n_questions]
    planner = state.planner_runtime()
    # a fresh id per evaluation: sub-agents drop a call id they have answered before, so a
    # second evaluation of the same questions used to wait out every delegation's time-out
    run = uuid.uuid4().hex[:8]
    jobs = [EpisodeJob(q, f"query-eval{run}-{q.id}", 0, mix_seed("eval", q.id))
            for q in questions]
    episodes = planner.play(jobs, greedy=body.greedy)
    verifier, weights = ExactMatchVerifier(), state.cfg.rewards.planner
    correct = [score_episode(ep.answer, ep.format_ok, ep.job.question.answer, verifier,
                             weights)[0] for ep in episodes]
    n = max(len(episodes), 1)
    return EvaluationOut(n=len(episodes), accuracy=sum(correct) / n,
                         format_valid=sum(ep.format_ok for ep in episodes) / n,
                         weights_version=planner.runtime.engine.version)


@router.post("", response_model=EvaluationOut, summary="Evaluate the current weights",
             responses=errors(400, 401, 403, 413, 429))
async def post_evaluation(body: EvaluationIn, state: State, _: Authorized) -> EvaluationOut:
    if state.evaluating:  # one at a time: each holds the planner for its whole length
        raise HTTPException(429, "an evaluation is already running; retry when it is done",
                            headers={"Retry-After": "10"})
    state.evaluating = True
    try:
        return await run_in_threadpool(evaluate, state, body)
    finally:
        state.evaluating = False
