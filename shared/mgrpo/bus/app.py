"""The ONE Celery app factory of mgrpo, and the helpers that send and register tasks.

Settings (docs/messages.md, 'Celery'): JSON only (``accept_content=["json"]``: a pickle is
refused and, with
the queue's ``x-dead-letter-exchange``, dead-lettered by the broker), late acks, prefetch 1,
reject on worker loss, persistent messages, the declared durable queues only (no queue is
auto-created with different arguments), an undecodable body dead-lettered with the reason
(``mgrpo.bus.celery_consumer``). Task names are the constants of
``mgrpo.bus.names``; every task takes ONE argument: the message's JSON dict.

Services register their bodies with :func:`register_task`, which wraps a handler in
:func:`mgrpo.bus.handler.process_payload` (decode -> skip duplicate -> handle -> record) and
dead-letters refused payloads with the reason.

:func:`control_app` and :func:`send_control` are the control plane's app and sender (its
tasks: ``mgrpo.bus.control``; their bodies: ``mgrpo.services.control``).

What this module does NOT do: hold task logic (services do) or start workers.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterable

from celery import Celery

from mgrpo.bus.control import (
    CONTROL_QUEUE,
    EVALUATIONS_QUEUE,
    parse_payload,
    payload_dict,
    queue_of,
)
from mgrpo.bus.errors import RETRY_DELAY_S
from mgrpo.bus.handler import Dedupe, Handler, process_payload
from mgrpo.bus.messages import Message, encode_message
from mgrpo.bus.names import (
    DEAD_LETTER_QUEUE,
    PLANNER_QUEUE,
    PLANNER_REPLY_QUEUE,
    REASON_HEADER,
    SOURCE_QUEUE_HEADER,
    TASK_AGENTS_WEIGHTS_UPDATED,
    TASK_PLANNER_RUN_EPISODES,
    TASK_PLANNER_SUBAGENT_RESULT,
    TASK_ROUND_COMMAND,
    TASK_SUBAGENT_RUN,
    TASK_TRAINER_INGEST,
)
from mgrpo.bus.topology import DLX, WORK_EXCHANGE, dead_letter_queue, work_queue
from mgrpo.config import Settings
from mgrpo.validation import StrictModel

# Which task consumes a message kind (a sender picks the queue, the kind picks the task).
TASK_FOR_KIND = {
    "episode_task": TASK_PLANNER_RUN_EPISODES,
    "subagent_call": TASK_SUBAGENT_RUN,
    "subagent_result": TASK_PLANNER_SUBAGENT_RESULT,
    "trajectory": TASK_TRAINER_INGEST,
    "round_command": TASK_ROUND_COMMAND,
    "weights": TASK_AGENTS_WEIGHTS_UPDATED,
}


def make_celery_app(settings: Settings, queues: Iterable[str] = (), *,
                    dead_letter_queue_name: str = DEAD_LETTER_QUEUE) -> Celery:
    """A Celery app on ``settings.broker_url`` declaring ``queues`` (+ the planner queues).

    ``queues``: the ``trainer.<model>`` / ``subagent.<name>`` queues this process sends to or
    consumes (see ``mgrpo.bus.names``). Results are not stored (no result backend).
    """
    names = list(dict.fromkeys([PLANNER_QUEUE, PLANNER_REPLY_QUEUE, *queues]))
    app = Celery("mgrpo", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_delivery_mode="persistent",
        task_queues=[work_queue(name, dead_letter_queue_name) for name in names]
        + [dead_letter_queue(dead_letter_queue_name)],
        task_default_queue=PLANNER_QUEUE,
        task_default_exchange=WORK_EXCHANGE.name,
        task_default_routing_key=PLANNER_QUEUE,
        task_create_missing_queues=False,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        # an undecodable body is dead-lettered with the reason, not acked and discarded
        worker_consumer="mgrpo.bus.celery_consumer:DeadLetteringConsumer",
    )
    app.conf.mgrpo_dead_letter_queue = dead_letter_queue_name
    return app


def worker_name(role: str) -> str:
    """A Celery node name no other process uses, ``<role>-<pid>-<random>@<host>``: two
    workers of one role on one host (two control workers, replicas in one pod) never share
    a name (a shared one clashes on the broker's per-node queues)."""
    return f"{role}-{os.getpid()}-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"


def control_queue(settings: Settings) -> str:
    return settings.queue_prefix + CONTROL_QUEUE


def control_app(settings: Settings) -> Celery:
    """The Celery app of the control plane: the settings of :func:`make_celery_app`, declaring
    only ``<prefix>mgrpo.control``, ``<prefix>mgrpo.evaluations`` and the deployment's
    dead-letter queue. Its default queue is the control queue."""
    name, dlq = control_queue(settings), settings.queue_prefix + DEAD_LETTER_QUEUE
    evaluations = settings.queue_prefix + EVALUATIONS_QUEUE
    app = make_celery_app(settings, [name], dead_letter_queue_name=dlq)
    app.conf.update(task_queues=[work_queue(name, dlq), work_queue(evaluations, dlq),
                                 dead_letter_queue(dlq)],
                    task_default_queue=name, task_default_routing_key=name)
    app.conf.mgrpo_control_queue = name
    app.conf.mgrpo_evaluations_queue = evaluations
    app.conf.mgrpo_queue_prefix = settings.queue_prefix
    return app


def send_control(app: Celery, task: str, payload: StrictModel,
                 task_id: str | None = None) -> str:
    """Send ``payload`` (checked against ``task``'s model first) to the queue of ``task``
    (``mgrpo.bus.control.queue_of``) on ``app`` (:func:`control_app`); returns the task id."""
    body = payload_dict(payload)
    parse_payload(task, body)
    name = app.conf.mgrpo_queue_prefix + queue_of(task)
    task_id = task_id or uuid.uuid4().hex
    app.send_task(task, args=[body], queue=work_queue(name, app.conf.mgrpo_dead_letter_queue),
                  exchange=WORK_EXCHANGE, routing_key=name, task_id=task_id)
    return task_id


def send_message(app: Celery, queue: str, message: Message) -> None:
    """Send ``message`` to the task its kind maps to, on ``queue`` (a declared work queue)."""
    app.send_task(TASK_FOR_KIND[message.kind], args=[encode_message(message)],
                  queue=work_queue(queue, app.conf.mgrpo_dead_letter_queue),
                  exchange=WORK_EXCHANGE, routing_key=queue, task_id=message.message_id)


def register_task(app: Celery, name: str, handler: Handler, *, dedupe: Dedupe | None = None,
                  consumer: str = ""):
    """Register ``handler`` as Celery task ``name``: decode -> dedupe -> handle -> done."""

    @app.task(name=name, bind=True, acks_late=True, reject_on_worker_lost=True)
    def task(self, payload) -> str:
        outcome = process_payload(payload, handler, dedupe=dedupe, consumer=consumer or name)
        if outcome.status == "retry":  # infrastructure down (mgrpo.bus.errors): run it later
            raise self.retry(countdown=RETRY_DELAY_S, max_retries=None)
        if outcome.status == "dead_letter":
            source = (self.request.delivery_info or {}).get("routing_key", "")
            _publish_dead_letter(app, payload, outcome.reason or "", source)
        return outcome.status

    return task


def _publish_dead_letter(app: Celery, payload, reason: str, source: str) -> None:
    with app.producer_or_acquire() as producer:
        producer.publish(payload, serializer="json", exchange=DLX,
                         routing_key=app.conf.mgrpo_dead_letter_queue, delivery_mode=2,
                         headers={REASON_HEADER: reason[:4000], SOURCE_QUEUE_HEADER: source},
                         retry=True)
