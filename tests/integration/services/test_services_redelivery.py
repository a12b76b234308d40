"""An infrastructure failure in a batch handler (the sandbox service is down) requeues the
batch on the real RabbitMQ instead of dead-lettering it: the messages come back and are
handled once the service is up; a model-side error still goes to the dead-letter queue."""

from __future__ import annotations

import threading

from queues_cleanup import delete_queues

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import RoundCommand
from mgrpo.sandbox.client import SandboxUnavailable
from mgrpo.services import batching
from mgrpo.services.batching import consume_batches
from mgrpo.services.context import Queues


def test_sandbox_unavailable_requeues_the_batch(rabbitmq_url, unique_name, monkeypatch):
    monkeypatch.setattr(batching, "RETRY_DELAY_S", 0.05)
    queues = Queues(f"{unique_name}.")
    work = queues.subagent("coder")
    bus = KombuBus(rabbitmq_url, dead_letter_queue_name=queues.dead_letter)
    seen: list[list[str]] = []
    handled = threading.Event()

    def handler(messages) -> None:
        seen.append([m.round_id for m in messages])
        if len(seen) <= 2:  # down for the first two deliveries
            raise SandboxUnavailable("sandbox at http://sandbox:8080: connection refused")
        if messages[0].round_id == "poison":
            raise ValueError("the model's fault")
        handled.set()

    stop = threading.Event()
    thread = None
    try:
        thread = consume_batches(bus, work, handler, consumer="test", batch_size=1,
                                 linger_s=0.05, stop=stop)
        bus.publish(work, RoundCommand(command="train", run_id="r", round_id="ok"))
        assert handled.wait(60), f"never handled after the outage; deliveries: {seen}"
        assert seen == [["ok"], ["ok"], ["ok"]]
        assert bus.dead_letters() == []
        bus.publish(work, RoundCommand(command="train", run_id="r", round_id="poison"))
        letters = []
        for _ in range(100):
            letters += bus.dead_letters()
            if letters:
                break
            stop.wait(0.1)
        assert [letter.reason for letter in letters] == [
            "handler test failed: ValueError: the model's fault"]
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=10)  # the consumer goes before its queue does
        bus.close()
        delete_queues(rabbitmq_url, work, queues.dead_letter)
