"""The trainer's lease keeper on a SQLite store (issue 13; the process-level test on
PostgreSQL is tests/integration/services/test_services_trainer_lease.py): the second keeper
waits with a log line naming the holder, takes over only once the first one's lease expired
(it died without releasing) or at once after a clean release, and the first one's own view
(``held``) turns False before the expiry a standby acts on."""

from __future__ import annotations

import logging
import threading
import time

from waiting import wait_for

from mgrpo.services.trainer.lease import LeaseKeeper


def test_standby_waits_then_takes_over_an_expired_lease(store, caplog):
    caplog.set_level(logging.INFO, logger="mgrpo.services.trainer.lease")
    # ttl 6 s: far above what the store calls below take on a loaded machine
    first = LeaseKeeper(store, "trainer:m", "host:1:a", ttl_s=6)
    second = LeaseKeeper(store, "trainer:m", "host:2:b", ttl_s=6)
    assert first.try_once() and first.held()
    assert not second.try_once() and not second.held()
    assert "lease trainer:m is held by host:1:a until" in caplog.text
    assert "host:2:b waits (standby)" in caplog.text
    first.stop(release=False)  # dies: no release, no more renewals
    took = time.monotonic()
    assert not second.try_once()  # not expired yet: still refused
    assert wait_for(second.try_once, timeout_s=30.0, poll_s=0.05)
    waited = time.monotonic() - took
    assert store.get_lease("trainer:m").holder == "host:2:b"
    assert waited > 2, waited  # it waited for the expiry, not taken at once
    assert "lease trainer:m taken by host:2:b" in caplog.text


def test_clean_release_hands_over_at_once_and_holder_view_expires(store):
    first = LeaseKeeper(store, "trainer:m", "a", ttl_s=3)
    second = LeaseKeeper(store, "trainer:m", "b", ttl_s=3)
    first.start()
    assert wait_for(first.held, timeout_s=10.0, poll_s=0.02)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    second.start()
    assert not second.wait_held(stop)  # refused while the first renews
    first.stop(release=True)
    lease = store.get_lease("trainer:m")  # released (or already taken by b's next try)
    assert lease is None or lease.holder == "b"
    assert second.wait_held(threading.Event())
    assert store.get_lease("trainer:m").holder == "b"
    second.stop()
    assert store.get_lease("trainer:m") is None
    short = LeaseKeeper(store, "trainer:x", "c", ttl_s=0.6)
    assert short.try_once()
    time.sleep(0.45)  # past ttl - period: this process stops counting itself the holder
    assert not short.held()
    assert store.get_lease("trainer:x").holder == "c"  # ... before anyone could take it
