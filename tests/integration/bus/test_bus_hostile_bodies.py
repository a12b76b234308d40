"""Hostile bodies on the real RabbitMQ never stop a queue: a 200 KB body nested 100,000 levels
deep is a dead letter with its reason, on the one-message consumer and on the batch consumer,
and the valid message behind it is handled without a single reconnect; a message whose
handling crashes the consumer loop is redelivered, then dead-lettered after
``HANDLER_CRASH_LIMIT`` crashes (its batch neighbours are handled, alone)."""

from __future__ import annotations

import threading

from queues_cleanup import delete_queues
from waiting import wait_for

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import EpisodeTask, decode_message
from mgrpo.services import batching

NESTED = b'{"kind":' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def _task(i: int) -> EpisodeTask:
    return EpisodeTask(run_id="r", round_id="x", query_id=f"q{i}", rollout=0)


def _letters(bus: KombuBus, count: int) -> list:
    letters: list = []
    wait_for(lambda: letters.extend(bus.dead_letters()) or len(letters) >= count, 20)
    return letters


def _serve_and_check(bus, queue, start) -> None:
    handled: list[str] = []
    bus.publish_raw(queue, NESTED)
    bus.publish(queue, _task(0))
    start(handled)
    assert wait_for(lambda: handled == ["q0"], 20), \
        f"the valid task behind the nested body was never handled: {bus.consumer_problems()}"
    letters = _letters(bus, 1)
    assert len(letters) == 1 and letters[0].queue == queue
    assert "nests 100001 levels deep" in letters[0].reason, letters[0].reason
    assert [state.reconnects for state in bus.consumers] == [0]
    assert bus.consumer_problems() == []


def test_deep_nesting_is_a_dead_letter_on_the_one_message_consumer(rabbitmq_url, unique_name):
    queue, dlq = f"{unique_name}.subagent.coder", f"{unique_name}.dlq"
    bus = KombuBus(rabbitmq_url, dead_letter_queue_name=dlq)
    try:
        _serve_and_check(bus, queue, lambda handled: bus.consume(
            queue, lambda m: handled.append(m.query_id), consumer="subagent-coder",
            dedupe=False))
    finally:
        bus.close()
        delete_queues(rabbitmq_url, queue, dlq)


def test_deep_nesting_is_a_dead_letter_on_the_batch_consumer(rabbitmq_url, unique_name):
    queue, dlq = f"{unique_name}.planner.episodes", f"{unique_name}.dlq"
    bus = KombuBus(rabbitmq_url, dead_letter_queue_name=dlq)
    stop = threading.Event()
    try:
        _serve_and_check(bus, queue, lambda handled: batching.consume_batches(
            bus, queue, lambda ms: handled.extend(m.query_id for m in ms),
            consumer="planner-worker", batch_size=16, linger_s=0.2, claims=False, stop=stop))
    finally:
        stop.set()
        bus.close()
        delete_queues(rabbitmq_url, queue, dlq)


def test_a_message_that_crashes_its_consumer_is_dead_lettered(rabbitmq_url, unique_name):
    from mgrpo.bus.consumer import HANDLER_CRASH_LIMIT

    queue, dlq = f"{unique_name}.trainer.coder", f"{unique_name}.dlq"
    bus = KombuBus(rabbitmq_url, dead_letter_queue_name=dlq)
    handled: list[str] = []
    tries: list[str] = []

    def on_message(message) -> None:  # a transport-level handler with a bug for one body
        task = decode_message(message.body)
        tries.append(task.query_id)
        if task.query_id == "poison":
            raise RuntimeError("handler bug")
        handled.append(task.query_id)
        message.ack()

    try:
        bus.publish(queue, EpisodeTask(run_id="r", round_id="x", query_id="poison", rollout=0))
        bus.publish(queue, _task(1))
        bus.serve(bus.work_queue(queue), "trainer-coder", on_message, prefetch=1)
        assert wait_for(lambda: handled == ["q1"], 30), (tries, bus.consumer_problems())
        letters = _letters(bus, 1)
        assert len(letters) == 1 and "poison message" in letters[0].reason
        assert "RuntimeError: handler bug" in letters[0].reason
        assert tries.count("poison") == HANDLER_CRASH_LIMIT
        assert bus.consumers[0].crashes == HANDLER_CRASH_LIMIT
    finally:
        bus.close()
        delete_queues(rabbitmq_url, queue, dlq)


def test_a_batch_that_crashes_runs_alone_and_only_the_poison_is_dead_lettered(
        rabbitmq_url, unique_name, monkeypatch):
    queue, dlq = f"{unique_name}.planner.episodes", f"{unique_name}.dlq"
    bus = KombuBus(rabbitmq_url, dead_letter_queue_name=dlq)
    handled: list[str] = []
    real_run_batch = batching._run_batch

    def crashing_run_batch(bus_, queue_, raw, *args, **kwargs):  # a bug outside the sorting
        if any(getattr(decoded, "query_id", "") == "poison" for _, decoded in raw):
            raise RuntimeError("batch plumbing bug")
        return real_run_batch(bus_, queue_, raw, *args, **kwargs)

    monkeypatch.setattr(batching, "_run_batch", crashing_run_batch)
    stop = threading.Event()
    try:
        bus.publish(queue, EpisodeTask(run_id="r", round_id="x", query_id="poison", rollout=0))
        for i in range(4):
            bus.publish(queue, _task(i))
        batching.consume_batches(bus, queue, lambda ms: handled.extend(m.query_id for m in ms),
                                 consumer="planner-worker", batch_size=16, linger_s=0.3,
                                 claims=False, stop=stop)
        assert wait_for(lambda: sorted(handled) == [f"q{i}" for i in range(4)], 30), \
            (handled, bus.consumer_problems())
        letters = _letters(bus, 1)
        assert len(letters) == 1 and "poison message" in letters[0].reason, letters
        assert '"poison"' in letters[0].body
    finally:
        stop.set()
        bus.close()
        delete_queues(rabbitmq_url, queue, dlq)
