"""``/healthz`` (the process is up and can serve queries), ``/readyz`` (the store, the broker
and this process's bus consumers answer), ``/metrics`` (Prometheus).

In embedded mode (``MGRPO_MODE`` unset) the API's bus is in this process: only workers
started in this process (``mgrpo ui``, tests) can serve it. Without them every delegation of
``/v1/queries`` fails as ``unknown agent`` and a round never finishes, so ``/readyz`` is 503
and says so (``checks.mode``), as ``mgrpo serve planner`` (which starts none) warns at start
(:func:`embedded_problem`).
``/readyz`` also lists, as ``warnings`` (not failing it: queries are served without them), the
run config's sub-agents that no live worker serves (none registered, or no heartbeat within
:data:`ALIVE_WITHIN_S`) and the trainers that report they cannot finish a round (a full
checkpoint disk); ``POST /v1/rounds`` answers 409 for either.

``/healthz`` runs on the event loop and reads in-memory state only (no lock, no I/O), so it
answers while the model thread plays batches. It is 503 when the model thread died, or when
a bus consumer of this process (the planner's reply queue, started by the first query) has
not consumed for ``MGRPO_CONSUMER_GRACE_S``: delegations would wait for replies that never
come, so an orchestrator should restart the process. ``/readyz`` is 503 at once for those.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from mgrpo.services.api.deps import State

router = APIRouter(tags=["health"])

ALIVE_WITHIN_S = 30.0  # three sub-agent heartbeats (SubagentWorker.heartbeat_s = 10 s)


def embedded_problem(settings, state=None) -> str | None:
    """Why a planner API in embedded mode cannot serve queries or rounds: no worker of this
    process consumes its sub-agents' queues (``state`` None: none at all, as at the start of
    ``mgrpo serve planner``). None in distributed mode or when they are served."""
    if settings.mode != "embedded":
        return None
    if state is not None and state.bus is not None:
        consumed = getattr(state.bus, "consumed_queues", None)
        roles = [r for r in state.cfg.agents if r != "planner"]
        if consumed is None or all(state.queues.subagent(r) in consumed() for r in roles):
            return None
    return ("MGRPO_MODE=embedded: no worker in this process serves this planner API's "
            "sub-agents (workers of other processes consume RabbitMQ, in distributed mode), "
            "so every delegation of /v1/queries "
            "fails (unknown agent) and a round started by POST /v1/rounds never finishes; "
            "set MGRPO_MODE=distributed with RabbitMQ and PostgreSQL (`mgrpo up --config "
            "FILE` starts every service), or train in one process with `mgrpo train`")


def missing_subagents(state) -> list[str]:
    """The run config's sub-agent roles that no live worker serves."""
    try:
        alive = {a.name for a in state.store.list_agents(alive_within_s=ALIVE_WITHIN_S)}
    except Exception:  # noqa: BLE001 - the store check reports a store that does not answer
        return []
    return [role for role in state.cfg.agents if role != "planner" and role not in alive]


def missing_round_workers(state, cfg) -> list[str]:
    """The roles a distributed round of ``cfg`` needs that no live worker serves, one
    phrase each: its sub-agents (none for an inline algorithm: the planner plays them) with
    no heartbeat within :data:`ALIVE_WITHIN_S`, and its trained models whose trainer holds
    no lease ``trainer:<model>``. The planner worker leaves no record in the store: not
    checked."""
    alive = {a.name for a in state.store.list_agents(alive_within_s=ALIVE_WITHIN_S)}
    roles = cfg.algo.agent_roles(cfg.agents)
    missing = [f"sub-agent {role} (no heartbeat within {ALIVE_WITHIN_S:.0f} s: start "
               f"`mgrpo serve subagent --name {role}`)" for role in roles if role not in alive]
    missing += [f"trainer of {model} (nobody holds lease trainer:{model}: start `mgrpo serve "
                f"trainer --model {model}`)" for model in cfg.trained_models()
                if state.store.lease_holder(f"trainer:{model}") is None]
    return missing + trainer_problems(state, cfg)


def trainer_problems(state, cfg) -> list[str]:
    """The trained models whose trainer reports that it cannot finish a round (a full
    checkpoint disk, written on its lease row: ``TrainerService.report_problem``), one
    phrase each."""
    found = ((m, state.store.lease_problem(f"trainer:{m}")) for m in cfg.trained_models())
    return [f"trainer of {model} cannot finish a round: {problem}"
            for model, problem in found if problem]


def process_problems(state, grace_s: float) -> list[str]:
    """Why this process cannot serve queries: its bus consumers (a consumer thread that died,
    or one disconnected for ``grace_s``) and its model thread. In memory, no I/O."""
    check = getattr(state.bus, "consumer_problems", None)
    problems = list(check(grace_s)) if check is not None else []
    if state.batcher is not None and (problem := state.batcher.problem()) is not None:
        problems.append(problem)
    return problems


@router.get("/healthz", summary="Liveness: the model thread and the bus consumers are alive",
            responses={503: {"description": "A bus consumer or the model thread is dead (or "
                             "a consumer was disconnected for longer than the grace period)"}})
async def healthz(state: State) -> JSONResponse:  # async: on the event loop, never queued
    problems = process_problems(state, state.settings.consumer_grace_s)
    if problems:
        return JSONResponse({"status": "down", "problems": problems}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/readyz", summary="Readiness: the store, the broker and the bus consumers answer",
            responses={503: {"description": "The store or the broker does not answer, a "
                             "bus consumer of this process is not consuming, or the API runs "
                             "in embedded mode (no workers)"}})
def readyz(state: State) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        state.store.current_revision()
        checks["store"] = "ok"
    except Exception as error:  # any failure means not ready; say which
        checks["store"] = f"{type(error).__name__}: {error}"
    if state.settings.mode == "distributed":
        checks["broker"] = _broker_ok(state.settings.broker_url)
    problems = process_problems(state, 0.0)
    checks["consumers"] = "; ".join(problems) if problems else "ok"
    checks["mode"] = embedded_problem(state.settings, state) or "ok"
    ok = all(v == "ok" for v in checks.values())
    body: dict = {"status": "ready" if ok else "not ready", "checks": checks}
    if missing := missing_subagents(state):
        body["warnings"] = [f"no live worker for sub-agent {role} (none registered, or no "
                            f"heartbeat within {ALIVE_WITHIN_S:.0f} s): its delegations fail "
                            f"as unknown agent; start `mgrpo serve subagent --name {role}`"
                            for role in missing]
    try:  # the API serves queries without a trainer: a warning, and POST /v1/rounds 409s
        trainers = trainer_problems(state, state.cfg) if state.settings.mode == \
            "distributed" else []
    except Exception:  # noqa: BLE001 - the store check reports a store that does not answer
        trainers = []
    if trainers:
        body["warnings"] = body.get("warnings", []) + [
            f"{p}; POST /v1/rounds answers 409 until it is fixed" for p in trainers]
    return JSONResponse(body, status_code=200 if ok else 503)


def _broker_ok(url: str) -> str:
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=2) as connection:
            connection.ensure_connection(max_retries=1)
        return "ok"
    except Exception as error:
        return f"{type(error).__name__}: {error}"


@router.get("/metrics", summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}},
                             "description": "Prometheus text exposition format"}})
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
