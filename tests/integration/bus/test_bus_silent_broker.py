"""A broker that stops answering without closing the connection (a half-open TCP link, a
broker stalled on a loaded machine): every publish of :class:`KombuBus` gives up after its
confirm timeout with a transient error, to be retried, instead of waiting for a confirm that
never comes. Before, ``publish`` and ``announce_weights`` waited forever: a trainer blocked
there after publishing its statistics never marked its round ``done`` and never ran another
pass (the round stayed ``training``).

The silence is a TCP proxy in this process between the bus and the real RabbitMQ that, once
frozen, keeps every connection open and forwards nothing."""

from __future__ import annotations

import contextlib
import socket
import threading
from urllib.parse import urlsplit, urlunsplit

import pytest
from kombu import Connection

from mgrpo.bus.errors import is_transient
from mgrpo.bus.messages import RoundCommand, WeightsAnnouncement
from mgrpo.bus.topology import dead_letter_queue, work_queue


@pytest.fixture
def names(unique_name):
    return {"queue": f"{unique_name}.work", "dlq": f"{unique_name}.dlq"}


class FreezingProxy:
    """Forwards 127.0.0.1:<port> to ``target`` until :meth:`freeze`; then reads nothing and
    writes nothing more, leaving the sockets open."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.frozen = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = [self.server]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while not self.frozen.is_set():
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                return
            if self.frozen.is_set():
                return  # swallowed: the broker never answers
            sink.sendall(data)

    def freeze(self) -> None:
        self.frozen.set()

    def close(self) -> None:
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture
def proxied_url(rabbitmq_url):
    parts = urlsplit(rabbitmq_url)
    proxy = FreezingProxy((parts.hostname, parts.port or 5672))
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{proxy.port}"
    yield proxy, urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2
                                           else host))
    proxy.close()


def gives_up(call, limit_s: float) -> BaseException | None:
    """Run ``call`` on a thread; the exception it raised within ``limit_s``. Fails the test
    when it is still waiting then."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as error:  # noqa: BLE001 - what the test looks at
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"still waiting for the broker after {limit_s:.0f} s"
    return raised[0] if raised else None


@pytest.mark.parametrize("publish", ["publish", "announce_weights", "publish_many"])
def test_a_publish_to_a_silent_broker_gives_up_with_a_transient_error(
        proxied_url, names, publish, rabbitmq_url):
    from mgrpo.bus.kombu_bus import KombuBus

    proxy, url = proxied_url
    bus = KombuBus(url, dead_letter_queue_name=names["dlq"], publish_retries=0,
                   confirm_timeout_s=2.0)
    command = RoundCommand(command="train", run_id="run", round_id="r1", model="planner")
    sends = {
        "publish": lambda: bus.publish(names["queue"], command),
        "announce_weights": lambda: bus.announce_weights(WeightsAnnouncement(
            model="planner", version=1, uri="file:///nowhere", sha256="0" * 64,
            round_id="r1")),
        "publish_many": lambda: bus.publish_many([(names["queue"], command)]),
    }
    try:
        sends[publish]()  # the link works: declared, confirmed
        proxy.freeze()
        error = gives_up(sends[publish], limit_s=20.0)
        assert error is not None and is_transient(error), repr(error)
    finally:
        proxy.close()
        with contextlib.suppress(Exception):
            bus.close()
        with Connection(rabbitmq_url) as connection:
            channel = connection.channel()
            work_queue(names["queue"], names["dlq"])(channel).delete()
            dead_letter_queue(names["dlq"])(channel).delete()
