"""Transient failures versus bad messages (``mgrpo.bus.errors``), with real errors: a database
that refuses connections is the infrastructure's fault (retry), a constraint violation or a
wrong-kind message is the message's (dead letter). The duplicate check is inside that sorting:
a store that cannot be reached gives ``retry``, it does not raise out of the consumer."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError, OperationalError

from mgrpo.bus import InMemoryBus, RoundCommand, process_payload
from mgrpo.bus import errors as bus_errors
from mgrpo.bus.errors import is_transient
from mgrpo.bus.transport import to_wire
from mgrpo.store import Store

UNREACHABLE = "postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2"


def refused() -> OperationalError:
    engine = create_engine(UNREACHABLE)
    try:
        with pytest.raises(OperationalError) as caught:
            engine.connect()
        return caught.value
    finally:
        engine.dispose()


def integrity_error() -> IntegrityError:
    engine = create_engine("sqlite://")
    with engine.begin() as connection:
        connection.execute(text("create table t (k integer primary key)"))
        connection.execute(text("insert into t values (1)"))
    with pytest.raises(IntegrityError) as caught, engine.begin() as connection:
        connection.execute(text("insert into t values (1)"))
    return caught.value


def test_database_down_is_transient_and_data_errors_are_not():
    assert is_transient(refused())
    assert not is_transient(integrity_error())
    assert not is_transient(TypeError("planner.episodes takes episode_task messages"))
    assert is_transient(ConnectionResetError(104, "Connection reset by peer"))


def test_only_an_explicit_cause_counts():
    down = refused()
    try:
        raise RuntimeError("store call failed") from down
    except RuntimeError as wrapped:
        assert is_transient(wrapped)
    try:
        try:
            raise down
        except OperationalError:
            raise KeyError("a bug while handling it")  # noqa: B904 - the point of the test
    except KeyError as implicit:
        assert not is_transient(implicit)


def test_unreachable_store_in_the_duplicate_check_is_a_retry_not_a_crash():
    store = Store(UNREACHABLE)
    ran: list = []
    try:
        outcome = process_payload(to_wire(RoundCommand(command="train", run_id="r",
                                                       round_id="x")),
                                  ran.append, dedupe=store, consumer="trainer-planner")
    finally:
        store.close()
    assert outcome.status == "retry" and "OperationalError" in outcome.reason
    assert ran == []  # the handler did not run: the check could not say "not a duplicate"


def test_in_memory_bus_requeues_a_transient_failure(monkeypatch):
    monkeypatch.setattr("mgrpo.bus.transport.RETRY_DELAY_S", 0.01)
    assert bus_errors.RETRY_DELAY_S == 2.0
    down = refused()
    calls: list[str] = []

    def handler(message) -> None:
        calls.append(message.round_id)
        if len(calls) < 3:
            raise down

    bus = InMemoryBus()
    try:
        bus.consume("q", handler)
        bus.publish("q", RoundCommand(command="train", run_id="r", round_id="x"))
        assert bus.wait_idle(30)
        assert calls == ["x", "x", "x"] and bus.dead_letters() == []
    finally:
        bus.close()


def test_each_rooms_transient_errors_share_one_base_and_the_bus_imports_neither_room():
    """The sandbox's and the bus's own transient errors derive from ``TransientError``; the
    store registers its database check on import; ``mgrpo.bus.errors`` itself pulls in
    neither the sandbox client nor the store."""
    import subprocess
    import sys

    from mgrpo.bus.confirmed_batch import PublishNotConfirmed
    from mgrpo.errors import TransientError
    from mgrpo.sandbox.client import SandboxUnavailable

    assert is_transient(SandboxUnavailable("down")) and is_transient(PublishNotConfirmed("x"))
    assert issubclass(SandboxUnavailable, TransientError)
    code = ("import sys, mgrpo.bus.errors; "
            "print(sorted(m for m in sys.modules if m.startswith(('mgrpo.sandbox', "
            "'mgrpo.store'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
