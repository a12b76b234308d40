"""The control plane's Celery tasks: one typed payload each, late acks, retries with back-off
for transient failures only, a refused payload dead-lettered with its reason.

A task body is a thin shell ("a task is much like a web view"): validate the payload with its
model (``mgrpo.bus.control``), skip a task id that already ran, call the handler, record the
id. The handlers call the library: :func:`~mgrpo.services.checkpoints.prune_checkpoints`,
:meth:`KombuBus.replay_report <mgrpo.bus.kombu_bus.KombuBus.replay_report>`,
:func:`~mgrpo.services.rounds.start_round` / :func:`~mgrpo.services.rounds.cancel_round`.

What happens to a delivery:

- a payload that does not match its model, or the wrong number of arguments: dead-lettered at
  once with the validation errors as the reason (``x-mgrpo-reason``), never retried;
- a transient failure (``mgrpo.bus.errors.is_transient``: the database or the broker down,
  any :class:`~mgrpo.errors.TransientError`): retried after ``first_s``, then twice as long
  each time up to ``max_s``; after ``max_retries`` retries it is dead-lettered with the
  reason;
- any other failure (a round that does not exist, a run still busy): dead-lettered with the
  reason, at once;
- a task id that already ran to the end (a redelivery after a worker died before its ack):
  acked without running again (the store's message claims, key ``control|<task id>``).

A dead letter is written in Celery's task-message protocol 1 (the task name, id and payload in
the JSON body), so ``mgrpo dlq replay``, which republishes bodies as they are, hands it back to
this worker as the same task.

What this module does NOT do: start a worker (``mgrpo.services.entrypoints.serve_control``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from celery import Celery

from mgrpo.bus.control import (
    TASK_PRUNE_CHECKPOINTS,
    TASK_REPLAY_DEAD_LETTERS,
    TASK_ROUND,
    CancelRound,
    InvalidPayload,
    PruneCheckpoints,
    ReplayDeadLetters,
    StartRound,
    parse_payload,
)
from mgrpo.bus.errors import is_transient
from mgrpo.bus.names import REASON_HEADER, SOURCE_QUEUE_HEADER
from mgrpo.bus.topology import DLX, dead_letter_queue
from mgrpo.config import Settings
from mgrpo.envs import load_benchmark
from mgrpo.services.checkpoints import prune_checkpoints
from mgrpo.services.context import Queues
from mgrpo.services.rounds import cancel_round, check_round_size, round_id_of, start_round
from mgrpo.services.team import is_team
from mgrpo.training.config import RunConfig
from mgrpo.training.overrides import overridden

log = logging.getLogger("mgrpo.control")


@dataclass
class ControlContext:
    """What the handlers work with: the deployment's store, bus (a ``KombuBus``: round tasks
    are published and dead letters replayed on it), run config and queue names."""

    settings: Settings
    store: object
    bus: object
    cfg: RunConfig
    queues: Queues
    done: dict[str, int] = field(default_factory=dict)  # tasks run to the end, by name


@dataclass(frozen=True)
class Backoff:
    """Waits between the tries of a task that failed for a transient reason."""

    first_s: float = 2.0
    max_s: float = 60.0
    max_retries: int = 10  # 2 + 4 + ... + 60 s: about 7 minutes, then dead-lettered

    def delay(self, retries: int) -> float:
        return min(self.first_s * 2 ** retries, self.max_s)


class UnknownRound(LookupError):
    """A round command names a round the store does not hold."""


def prune(ctx: ControlContext, command: PruneCheckpoints) -> None:
    prune_checkpoints(ctx.store, ctx.settings.checkpoint_uri, command.run_id, command.model,
                      command.keep)


def replay(ctx: ControlContext, command: ReplayDeadLetters) -> None:
    replayed, kept, count = ctx.bus.replay_report(command.limit, source=command.source)
    log.info("replayed %d dead letter(s), kept %d; %d were in the queue", len(replayed),
             len(kept), count)


def round_command(ctx: ControlContext, command: StartRound | CancelRound) -> None:
    if isinstance(command, CancelRound):
        if cancel_round(ctx.store, command.round_id) is None:
            raise UnknownRound(f"round {command.round_id!r} does not exist; nothing to cancel")
        return
    overrides = {k: v for k, v in {"queries_per_round": command.queries_per_round,
                                   "k": command.k}.items() if v is not None}
    cfg = overridden(ctx.cfg, overrides)
    run_id = command.run_id or cfg.name
    if command.index is not None and \
            ctx.store.get_round(round_id_of(run_id, command.index)) is not None:
        log.info("round %d of run %s exists already: left as it is", command.index, run_id)
        return
    bench = None if is_team(cfg) else load_benchmark(cfg.bench_dir)
    check_round_size(cfg, bench)  # the API's 422: refused (dead letter), never clamped
    start_round(ctx.store, ctx.bus, cfg, ctx.queues, run_id=run_id, index=command.index,
                bench=bench)


HANDLERS: dict[str, Callable] = {
    TASK_PRUNE_CHECKPOINTS: prune,
    TASK_REPLAY_DEAD_LETTERS: replay,
    TASK_ROUND: round_command,
}


def register_control_tasks(app: Celery, ctx: ControlContext,
                           backoff: Backoff = Backoff()) -> None:
    for name, handler in HANDLERS.items():
        register_task_body(app, name, handler, ctx, backoff)


def register_task_body(app: Celery, name: str, handler: Callable, ctx, backoff: Backoff,
                       on_dead_letter: Callable | None = None) -> None:
    """Register ``handler(ctx, command)`` as Celery task ``name`` with the deliveries above.
    ``ctx`` has ``store`` (the message claims) and ``done`` (tasks run to the end, by name).
    ``on_dead_letter(ctx, command, reason)``: called when a valid payload is dead-lettered
    (its failure says why)."""

    def dead_letter(request, payload, command, reason: str) -> str:
        if on_dead_letter is not None:
            try:
                on_dead_letter(ctx, command, reason)
            except Exception:  # noqa: BLE001 - the letter keeps the reason anyway
                log.exception("%s: on_dead_letter failed", name)
        return _dead_letter(app, request, name, payload, reason)

    # shared=False: the task is ``app``'s only (a shared one joins every app finalized later,
    # whose own body of the same name is then dropped); a worker of ``app`` makes it the
    # process's default app, where its pool looks tasks up
    @app.task(name=name, bind=True, acks_late=True, reject_on_worker_lost=True,
              ignore_result=True, shared=False)
    def task(self, *args, **kwargs) -> str:
        payload = args[0] if len(args) == 1 and not kwargs else {"args": args, **kwargs}
        try:
            if len(args) != 1 or kwargs:
                raise InvalidPayload(f"{name} takes one argument, its payload; got "
                                     f"{len(args)} argument(s) and keywords {sorted(kwargs)}")
            command = parse_payload(name, payload)
        except InvalidPayload as error:
            log.error("%s refused: %s", name, error)
            return _dead_letter(app, self.request, name, payload, str(error))
        key = f"control|{self.request.id}"
        try:
            if ctx.store.message_seen(key):
                log.info("%s %s ran already: skipped", name, self.request.id)
                return "duplicate"
            handler(ctx, command)
            ctx.store.claim_message(key, "control")
        except Exception as error:  # sorted: retried if transient, else dead-lettered
            why = f"{type(error).__name__}: {error}"
            if not is_transient(error):
                log.exception("%s failed", name)
                return dead_letter(self.request, payload, command, f"{name} failed: {why}")
            if self.request.retries >= backoff.max_retries:
                return dead_letter(self.request, payload, command,
                                   f"{name}: transient failure persisted after "
                                   f"{backoff.max_retries} retries: {why}")
            delay = backoff.delay(self.request.retries)
            log.warning("%s: transient failure (%s), retry %d in %.1f s", name, why,
                        self.request.retries + 1, delay)
            raise self.retry(countdown=delay, max_retries=backoff.max_retries) from error
        ctx.done[name] = ctx.done.get(name, 0) + 1
        return "done"


def _dead_letter(app: Celery, request, name: str, payload, reason: str) -> str:
    """Publish the task to the dead-letter queue with ``reason``, as a protocol-1 task message
    (so a replay runs it as the same task)."""
    body = {"task": name, "id": request.id or uuid.uuid4().hex, "args": [payload],
            "kwargs": {}, "retries": 0}
    source = (request.delivery_info or {}).get("routing_key") or app.conf.mgrpo_control_queue
    dlq = app.conf.mgrpo_dead_letter_queue
    with app.producer_or_acquire() as producer:
        producer.publish(body, serializer="json", exchange=DLX, routing_key=dlq,
                         delivery_mode=2, declare=[dead_letter_queue(dlq)], retry=True,
                         headers={REASON_HEADER: reason[:4000], SOURCE_QUEUE_HEADER: source})
    return "dead_letter"
