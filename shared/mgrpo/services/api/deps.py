"""Dependencies of the REST API (``Annotated`` aliases) and the state they read.

:class:`ApiState` holds what the routes need: settings, the run config, the store, the bus
and (built on first use, because it loads a model) the planner runtime. Tests build one with
their own store and bus. Each lazily built part has a lock of its own: the planner's model
loads on the model thread under ``_planner_lock``, which nothing on the event loop or in a
read takes, so a query or a round started while the model loads does not wait for it.

Auth: mutating endpoints need ``Authorization: Bearer <MGRPO_API_TOKEN>``. No header: 401;
a wrong token: 403; no token configured: 403 in distributed mode (the endpoints are off),
allowed in embedded mode (a laptop).
"""

from __future__ import annotations

import hmac
import threading
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from mgrpo.config import Settings
from mgrpo.envs import load_benchmark
from mgrpo.services.api.evaluation_jobs import EvaluationJobs
from mgrpo.services.api.query_batcher import QueryBatcher
from mgrpo.services.context import Queues
from mgrpo.services.dispatch import new_reply_suffix
from mgrpo.services.planner.worker import PlannerRuntime
from mgrpo.training.config import RunConfig


@dataclass
class ApiState:
    settings: Settings
    cfg: RunConfig
    store: Any
    bus: Any
    planner: Any = None  # PlannerRuntime, built lazily
    bench: Any = None
    batcher: Any = None  # QueryBatcher, built on the first query
    run_dir: Any = None  # Path of an embedded run (``mgrpo ui``): its metrics.csv is read too
    evaluations: Any = None  # EvaluationJobs (``evaluation_jobs``): evaluations in the store
    evaluation_worker: Any = None  # EvaluationWorker, with MGRPO_EVALUATION_QUEUE
    _planner_lock: threading.Lock = field(default_factory=threading.Lock)
    _batcher_lock: threading.Lock = field(default_factory=threading.Lock)
    _bench_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.evaluations is None:
            self.evaluations = EvaluationJobs(self.store)

    @property
    def queues(self) -> Queues:
        return Queues(self.settings.queue_prefix)

    def planner_runtime(self):
        """The planner's model and dispatch; loads the model the first time (model thread)."""
        with self._planner_lock:
            if self.planner is None:
                self.planner = PlannerRuntime.build(self.settings, self.cfg, self.store,
                                                    self.bus, reply_suffix=new_reply_suffix())
            return self.planner

    def query_batcher(self):
        """The admission gate and the model thread (``query_batcher``); cheap to build."""
        with self._batcher_lock:
            if self.batcher is None:
                self.batcher = QueryBatcher(
                    lambda jobs, greedy: self.planner_runtime().play(jobs, greedy=greedy),
                    self.settings.max_queries_in_flight, self.settings.query_batch_size)
            return self.batcher

    def benchmark(self):
        with self._bench_lock:
            if self.bench is None:
                self.bench = load_benchmark(self.cfg.bench_dir)
            return self.bench


def get_state(request: Request) -> ApiState:
    return request.app.state.api


# A security scheme (not a plain header parameter) so /docs has an Authorize button.
bearer = HTTPBearer(auto_error=False, scheme_name="bearer",
                    description="The value of MGRPO_API_TOKEN on the planner service.")


def require_token(state: Annotated[ApiState, Depends(get_state)],
                  credentials: Annotated[HTTPAuthorizationCredentials | None,
                                         Depends(bearer)] = None) -> None:
    expected = state.settings.api_token
    if not expected:
        if state.settings.mode == "distributed":
            raise HTTPException(403, "mutating endpoints are disabled: MGRPO_API_TOKEN is not "
                                "set on the planner service; set it and send "
                                "'Authorization: Bearer <token>'")
        return
    if credentials is None:  # no header, or not "Bearer <token>"
        raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <token>' "
                            "(the value of MGRPO_API_TOKEN)",
                            headers={"WWW-Authenticate": "Bearer"})
    # bytes, not str: compare_digest refuses non-ASCII str, and a header can hold any latin-1
    if not hmac.compare_digest(credentials.credentials.encode("utf-8", "surrogateescape"),
                               expected.encode("utf-8", "surrogateescape")):
        raise HTTPException(403, "the bearer token does not match MGRPO_API_TOKEN")


State = Annotated[ApiState, Depends(get_state)]
Authorized = Annotated[None, Depends(require_token)]
