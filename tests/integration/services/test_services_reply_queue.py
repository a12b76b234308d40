"""Per-worker reply queues on the real RabbitMQ: they go away with their consumer (no leak of
``planner.replies.<worker id>`` queues), while work queues stay (late acks, durable); replies
reach the dispatcher without a store claim each."""

from __future__ import annotations

from amqp.exceptions import NotFound
from kombu import Connection
from queues_cleanup import delete_queues
from waiting import wait_for

from mgrpo.bus import MemoryDedupe
from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import SubAgentCall, SubAgentResult
from mgrpo.bus.topology import REPLY_QUEUE_EXPIRES_MS, work_queue
from mgrpo.services.context import Queues
from mgrpo.services.dispatch import BusDispatch


def queue_exists(broker_url: str, name: str) -> bool:
    with Connection(broker_url) as connection:
        try:
            connection.channel().queue_declare(queue=name, passive=True)
        except NotFound:
            return False
        return True


def gone_within(broker_url: str, name: str, seconds: float = 10.0) -> bool:
    """Polls: the broker deletes the queue asynchronously after the consumer's cancel."""
    return wait_for(lambda: not queue_exists(broker_url, name), seconds, poll_s=0.1)


def test_reply_queue_is_deleted_when_its_consumer_closes(rabbitmq_url, unique_name):
    queues = Queues(f"{unique_name}.")
    reply, work = queues.replies("host-1234-abc"), queues.trainer("planner")
    declared = work_queue(reply)
    assert declared.auto_delete and declared.queue_arguments["x-expires"] == \
        REPLY_QUEUE_EXPIRES_MS
    assert not work_queue(work).auto_delete

    bus = KombuBus(rabbitmq_url, dead_letter_queue_name=queues.dead_letter)
    BusDispatch(bus, reply, lambda role: None)  # consumes its reply queue, as a worker does
    bus.consume(work, lambda message: None)
    assert queue_exists(rabbitmq_url, reply) and queue_exists(rabbitmq_url, work)
    bus.close()
    try:
        assert gone_within(rabbitmq_url, reply)
        assert queue_exists(rabbitmq_url, work)  # work queues outlive their consumers
    finally:
        delete_queues(rabbitmq_url, work, reply, queues.dead_letter)


class CountingDedupe(MemoryDedupe):
    """A MemoryDedupe that records which consumers asked it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def message_seen(self, key: str) -> bool:
        self.asked.append(key.split("|")[0])
        return super().message_seen(key)

    def claim_message(self, key: str, consumer: str = "") -> bool:
        self.asked.append(key.split("|")[0])
        return super().claim_message(key, consumer)


def test_replies_reach_the_dispatcher_without_store_claims(rabbitmq_url, unique_name):
    """Each reply used to cost a duplicate check and a claim in the store (two round trips,
    one reply at a time, while the planner worker waits on the turn); the dispatcher's
    handler is idempotent, so its queue claims nothing and a duplicate reply is harmless."""
    queues = Queues(f"{unique_name}.")
    reply, calls = queues.replies("host-1-x"), queues.subagent("searcher")
    dedupe = CountingDedupe()
    bus = KombuBus(rabbitmq_url, dedupe, dead_letter_queue_name=queues.dead_letter)

    def answer(call) -> None:  # a sub-agent that replies twice (a redelivered call)
        result = SubAgentResult(call_id=call.call_id, attempt=call.attempt, agent="searcher",
                                result=f"answer to {call.subtask}", format_ok=True)
        bus.publish_many([(call.reply_to, result), (call.reply_to, result)])

    try:
        dispatch = BusDispatch(bus, reply, lambda role: calls, timeout_s=30)
        bus.consume(calls, answer, consumer="searcher")
        sends = [(calls, SubAgentCall(call_id=f"c{i}", agent="searcher", subtask=f"t{i}",
                                      reply_to=reply)) for i in range(5)]
        replies = dispatch.request(sends)
        assert [r.result for r in replies] == [f"answer to t{i}" for i in range(5)]
        assert set(dedupe.asked) == {"searcher"}  # only the call consumer used the store
    finally:
        bus.close()
        delete_queues(rabbitmq_url, calls, reply, queues.dead_letter)
