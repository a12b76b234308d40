"""The evaluation worker: a Celery worker inside the planner API's process that consumes
``<prefix>mgrpo.evaluations`` and plays each ``mgrpo.control.evaluate`` task on the model
this process holds (``MGRPO_EVALUATION_QUEUE``).

Why here: an evaluation plays the planner, and the API process holds the planner's model
already; a worker of its own would load a second copy of it (a second GPU's worth of
memory). Its episodes go to the model thread's background lane
(:meth:`~mgrpo.services.api.query_batcher.QueryBatcher.submit_background`), so queries are
answered while it runs. The task is sent by :meth:`EvaluationJobs.start
<mgrpo.services.api.evaluation_jobs.EvaluationJobs.start>` of whichever replica answered
the POST; any replica's worker may play it, one evaluation at a time across replicas (the
store lease ``evaluation``).

The task body is a control task (``mgrpo.services.control.tasks.register_task_body``): its
payload checked with :class:`~mgrpo.bus.control.Evaluate`, late acks, retries with back-off
while another evaluation holds the lease (:class:`EvaluationBusy
<mgrpo.services.api.evaluation_jobs.EvaluationBusy>`) or the store is down, a refused or
failed one dead-lettered with its reason (and its queued row ended ``failed``), a task id that
ran already skipped. A redelivery of a task whose evaluation is running or ended plays
nothing (:meth:`~mgrpo.services.api.evaluation_jobs.EvaluationJobs.play_queued`): the job of
a process killed while it played ends ``interrupted``, as a local one does.

The worker runs on a thread of this process (Celery's ``threads`` pool, one task at a time,
prefetch 1), so its consumer keeps the broker connection's heartbeats while a task plays for
minutes. :meth:`EvaluationWorker.stop` (the API's shutdown, after ``EvaluationJobs.shutdown``
interrupted the running job) ends it.

What this module does NOT do: play episodes or score them (``evaluation_jobs``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from celery.worker import WorkController
from celery.worker import state as worker_state

from mgrpo.bus.app import control_app, send_control, worker_name
from mgrpo.bus.control import TASK_EVALUATE, Evaluate
from mgrpo.services.control.tasks import Backoff, register_task_body

log = logging.getLogger(__name__)

BACKOFF = Backoff()  # while another evaluation plays: 2, 4, ... 60 s; about 7 minutes


@dataclass
class EvaluationContext:
    """What the task body works with: the API's state (its model, batcher, evaluations)."""

    state: object  # ApiState
    store: object
    done: dict[str, int] = field(default_factory=dict)  # tasks run to the end, by name


def evaluate(ctx: EvaluationContext, command: Evaluate) -> None:
    outcome = ctx.state.evaluations.play_queued(ctx.state, command)
    log.info("evaluation %s: %s", command.evaluation_id, outcome)


def fail_queued(ctx: EvaluationContext, command: Evaluate, reason: str) -> None:
    """A dead-lettered evaluate task: its queued job ends failed, with the reason."""
    if ctx.store.fail_queued_evaluation(command.evaluation_id, reason):
        log.error("evaluation %s failed before it played: %s", command.evaluation_id, reason)


class EvaluationWorker:
    """Sends this API's evaluations to the queue (``state.evaluations.send``) and, once
    :meth:`start` ed, plays those of the queue in this process."""

    def __init__(self, state, backoff: Backoff | None = None) -> None:
        self.app = control_app(state.settings)
        self.queue = self.app.conf.mgrpo_evaluations_queue
        self.ctx = EvaluationContext(state, state.store)
        register_task_body(self.app, TASK_EVALUATE, evaluate, self.ctx, backoff or BACKOFF,
                           on_dead_letter=fail_queued)
        state.evaluations.send = self.send
        self._worker: WorkController | None = None
        self._thread: threading.Thread | None = None

    def send(self, command: Evaluate) -> None:
        """Send ``command`` as task ``mgrpo.control.evaluate`` (task id: the evaluation's)."""
        send_control(self.app, TASK_EVALUATE, command, task_id=command.evaluation_id)

    def start(self) -> None:
        # the pool's threads look the task up in the process's default app (``mgrpo serve
        # control``'s Worker sets it itself; a bare WorkController does not)
        self.app.set_default()
        self._worker = WorkController(
            app=self.app, pool="threads", concurrency=1, queues=[self.queue],
            hostname=worker_name("evaluations"),
            without_mingle=True, without_gossip=True, without_heartbeat=True,
            optimization="fair")
        self._thread = threading.Thread(target=self._worker.start, name="evaluation-worker",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """A warm stop: the running task ends (the API's shutdown cancels its episodes
        first), then the consumer."""
        if self._thread is None:
            return
        worker_state.should_stop = 0  # the worker's loop checks it (the process's worker)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("evaluation worker did not stop within %.0f s", timeout_s)
        worker_state.should_stop = None
        self._thread = None
