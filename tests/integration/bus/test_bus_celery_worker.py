"""The Celery app on the real RabbitMQ: a registered task decodes, dedupes and handles; a
malformed payload is dead-lettered with its reason."""

from __future__ import annotations

import time

from celery.contrib.testing.worker import start_worker
from kombu import Connection

from mgrpo.bus import MemoryDedupe
from mgrpo.bus.app import make_celery_app, register_task, send_message
from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import RoundCommand
from mgrpo.bus.names import TASK_ROUND_COMMAND
from mgrpo.bus.topology import dead_letter_queue, work_queue
from mgrpo.config import Settings


def test_celery_task_handles_once_and_dead_letters(rabbitmq_url, unique_name):
    queue, dlq = f"{unique_name}.celery", f"{unique_name}.dlq"
    app = make_celery_app(Settings(broker_url=rabbitmq_url), [queue], dead_letter_queue_name=dlq)
    got: list[str] = []
    register_task(app, TASK_ROUND_COMMAND, lambda m: got.append(m.round_id),
                  dedupe=MemoryDedupe(), consumer="trainer.planner")
    reader = KombuBus(rabbitmq_url, dead_letter_queue_name=dlq)
    try:
        with start_worker(app, pool="solo", queues=[queue], perform_ping_check=False,
                          shutdown_timeout=10):
            message = RoundCommand(command="train", run_id="run", round_id="r1")
            send_message(app, queue, message)
            send_message(app, queue, RoundCommand(command="train", run_id="run",
                                                  round_id="r1"))  # same key: duplicate
            app.send_task(TASK_ROUND_COMMAND, args=[{"kind": "round_command"}],
                          queue=work_queue(queue, dlq), routing_key=queue)
            letters: list = []
            deadline = time.monotonic() + 30
            while not letters and time.monotonic() < deadline:
                letters.extend(reader.dead_letters())
                time.sleep(0.1)
        assert got == ["r1"]
        assert len(letters) == 1
        assert "undecodable message: invalid 'round_command' message" in letters[0].reason
        assert letters[0].queue == queue
    finally:
        reader.close()
        with Connection(rabbitmq_url) as connection:
            work_queue(queue, dlq)(connection.channel()).delete()
            dead_letter_queue(dlq)(connection.channel()).delete()
