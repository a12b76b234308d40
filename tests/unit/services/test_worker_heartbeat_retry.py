"""A worker's heartbeat that fails (the database away) is tried again within about a second,
not a whole period later: the API sees the worker alive right after the database is back."""

from __future__ import annotations

import threading
import time

from waiting import wait_for

from mgrpo.services.subagent.worker import HEARTBEAT_RETRY_S, start_heartbeat


class FlakyStore:
    """Refuses the first ``failures`` heartbeats, as a store during an outage does."""

    closed = False

    def __init__(self, failures: int) -> None:
        self.failures, self.beats = failures, []

    def heartbeat(self, name: str) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionRefusedError(111, "Connection refused")
        self.beats.append(time.monotonic())


def test_a_failed_heartbeat_is_retried_within_a_second():
    store, stop = FlakyStore(failures=2), threading.Event()
    start = time.monotonic()
    start_heartbeat(store, "subagent-coder", stop, every_s=3.0)
    try:
        assert wait_for(lambda: store.beats, timeout_s=10)
        # first beat at 3 s, fails; two retries 1 s apart: alive at ~5 s, not at 9 s
        assert store.beats[0] - start < 3.0 + 2 * HEARTBEAT_RETRY_S + 1.0
    finally:
        stop.set()
