"""Delete test queues on the real RabbitMQ (a queue already gone is fine)."""

from __future__ import annotations

from kombu import Connection


def delete_queues(url: str, *names: str) -> None:
    with Connection(url) as connection:
        channel = connection.channel()
        for name in names:
            try:
                channel.queue_delete(name)
            except Exception:  # noqa: BLE001 - already gone
                channel = connection.channel()
