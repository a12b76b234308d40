"""Ports the launcher hands its children: never one an outgoing connection can take first.

A port the kernel hands out for ``bind(0)`` lies in its ephemeral range, the same range every
outgoing connection (to RabbitMQ, PostgreSQL) takes its local port from; given to a child as
its health port, it can be taken before the child binds it ("Address already in use")."""

from __future__ import annotations

import socket

from mgrpo.services.launcher import ephemeral_range, free_port


def test_free_ports_lie_below_the_ephemeral_range_and_are_never_repeated():
    low, _high = ephemeral_range()
    ports = [free_port() for _ in range(200)]
    assert all(port < low for port in ports), [p for p in ports if p >= low][:5]
    assert len(set(ports)) == len(ports)
    with socket.socket() as sock:  # and one of them really binds
        sock.bind(("127.0.0.1", ports[-1]))


def test_a_port_someone_listens_on_is_never_handed_out(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        import mgrpo.services.launcher as launcher

        picks = iter([port, port, port + 1 if port + 1 < ephemeral_range()[0] else port - 1])

        class Picks:
            def randrange(self, _start, _stop):
                return next(picks)

        monkeypatch.setattr(launcher.random, "Random", Picks)
        assert free_port() != port


def test_a_machine_without_the_proc_file_uses_linux_defaults(monkeypatch, tmp_path):
    import mgrpo.services.launcher as launcher

    monkeypatch.setattr(launcher, "Path", lambda _path: tmp_path / "absent")
    assert launcher.ephemeral_range() == (32768, 60999)
