"""A broker restart (``rabbitmqctl stop_app; start_app``) on a PRIVATE RabbitMQ node: every
consumer (one-message and batch) reconnects and handles what is published afterwards, a
publish made while the broker is down goes through once it is back, nothing is handled twice,
and the health checks say "not consuming" while it is down and recover by themselves."""

from __future__ import annotations

import threading
import time

from http_json import get_json
from prometheus_client import CollectorRegistry
from waiting import wait_for

from mgrpo.bus import MemoryDedupe
from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import RoundCommand
from mgrpo.services.batching import consume_batches
from mgrpo.services.health import serve_health


def command(round_id: str) -> RoundCommand:
    return RoundCommand(command="train", run_id="r", round_id=round_id)


def test_consumers_reconnect_after_broker_restart(private_rabbitmq, unique_name):
    broker = private_rabbitmq
    bus = KombuBus(broker.url, MemoryDedupe(), dead_letter_queue_name=f"{unique_name}.dlq")
    single: list[str] = []
    batched: list[str] = []
    lock = threading.Lock()

    def on_single(message) -> None:
        with lock:
            single.append(message.round_id)

    def on_batch(messages) -> None:
        with lock:
            batched.extend(m.round_id for m in messages)

    one, many = f"{unique_name}.one", f"{unique_name}.many"
    health = serve_health(0, CollectorRegistry(), alive=lambda: True, host="127.0.0.1",
                          problems=lambda: bus.consumer_problems(grace_s=1.0),
                          not_ready=lambda: bus.consumer_problems(0.0))
    port = health.server_address[1]
    try:
        bus.consume(one, on_single, consumer="single")
        consume_batches(bus, many, on_batch, consumer="batch", batch_size=4, linger_s=0.1)
        for i in range(3):
            bus.publish(one, command(f"before-{i}"))
            bus.publish(many, command(f"before-{i}"))
        assert wait_for(lambda: len(single) == 3 and len(batched) == 3)
        assert get_json(f"http://127.0.0.1:{port}/healthz")[0] == 200

        broker.stop_app()
        assert wait_for(lambda: len(bus.consumer_problems(0.0)) == 2, 30), \
            bus.consumer_problems(0.0)
        status, body = get_json(f"http://127.0.0.1:{port}/readyz")
        assert status == 503 and len(body["problems"]) == 2
        assert all("not consuming" in p for p in body["problems"]), body
        time.sleep(1.5)  # past the liveness grace: the worker must say it is unhealthy
        status, body = get_json(f"http://127.0.0.1:{port}/healthz")
        assert status == 503 and body["status"] == "down", body
        # a publish while the broker is down waits for it instead of being lost
        during = threading.Thread(target=bus.publish, args=(one, command("during")))
        during.start()
        time.sleep(2)
        broker.start_app()
        during.join(timeout=60)
        assert not during.is_alive(), "a publish made while the broker was down never returned"

        assert wait_for(lambda: bus.consumer_problems(0.0) == [], 60), \
            bus.consumer_problems(0.0)
        assert get_json(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert get_json(f"http://127.0.0.1:{port}/readyz")[0] == 200
        for i in range(3):
            bus.publish(one, command(f"after-{i}"))
            bus.publish(many, command(f"after-{i}"))
        assert wait_for(lambda: len(single) >= 7 and len(batched) >= 6, 60), (single, batched)
        time.sleep(0.5)  # anything handled twice would show up now
        assert sorted(single) == sorted([f"before-{i}" for i in range(3)] + ["during"]
                                        + [f"after-{i}" for i in range(3)])
        assert sorted(batched) == sorted([f"before-{i}" for i in range(3)]
                                         + [f"after-{i}" for i in range(3)])
        assert bus.dead_letters() == []
        assert all(state.reconnects >= 1 for state in bus.consumers)
    finally:
        health.shutdown()
        bus.close()
