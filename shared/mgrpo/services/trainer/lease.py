"""Keep a store lease (``mgrpo.store.leases``) from a background thread: how a trainer makes
sure it is the only active trainer of its model.

:class:`LeaseKeeper` tries to take the lease every ``ttl_s / 3`` seconds (for the holder a
try is a renewal). It logs once when it starts waiting (naming the current holder and when
that lease expires), once when it takes the lease, and once if it loses it. :meth:`held` is
this process's view: True only while the last successful renewal is younger than
``ttl_s`` minus one renewal period, so a process that cannot reach the store stops counting
itself the holder before another one can take the lease over.

:meth:`standby_reason` says why this process is not the active one (None while it is),
naming the current holder: the trainer's ``/readyz`` reports it, since a standby cannot
progress a round.

What this module does NOT do: stop the work itself (the trainer checks :meth:`held`).
"""

from __future__ import annotations

import logging
import threading
import time

from mgrpo.bus.errors import is_transient

log = logging.getLogger(__name__)


class LeaseKeeper:
    def __init__(self, store, name: str, holder: str, ttl_s: float) -> None:
        if ttl_s <= 0:
            raise ValueError(f"lease ttl must be > 0 s, got {ttl_s}")
        self.store, self.name, self.holder, self.ttl_s = store, name, holder, ttl_s
        self.period_s = ttl_s / 3
        self._renewed_at: float | None = None  # monotonic time of the last successful try
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._waiting_logged = False

    def held(self) -> bool:
        renewed = self._renewed_at
        return renewed is not None and time.monotonic() - renewed < self.ttl_s - self.period_s

    def standby_reason(self) -> str | None:
        """None while this process holds the lease; else one line: who holds it and until
        when (read from the store), or that nobody does yet."""
        if self.held():
            return None
        try:
            current = self.store.get_lease(self.name)
        except Exception as error:  # noqa: BLE001 - the store's own check reports it
            return f"standby: lease {self.name} not held ({type(error).__name__})"
        if current is None:
            return (f"standby: lease {self.name} not taken yet (next try within "
                    f"{self.period_s:.0f} s)")
        if current.holder == self.holder:
            return f"standby: lease {self.name} not renewed in time (its renewals fail)"
        return (f"standby: lease {self.name} held by {current.holder} until "
                f"{current.expires_at.isoformat()}; this trainer takes over when it is "
                "released or expires")

    def try_once(self) -> bool:
        """One take-or-renew try; logs the transitions. Returns :meth:`held` afterwards."""
        was_held = self.held()
        try:
            started = time.monotonic()
            got = self.store.acquire_lease(self.name, self.holder, self.ttl_s)
        except Exception as error:  # noqa: BLE001 - the store is down: retried next period
            if not is_transient(error):
                raise
            log.warning("lease %s: cannot reach the store (%s); retrying", self.name, error)
            got = False
        else:
            if got:
                self._renewed_at = started
        if got and not was_held:
            log.info("lease %s taken by %s (ttl %.0f s): this process is the active one",
                     self.name, self.holder, self.ttl_s)
            self._waiting_logged = False
        elif not got and was_held and not self.held():
            log.error("lease %s lost by %s: it stops acting until it holds the lease again",
                      self.name, self.holder)
        elif not got and not self._waiting_logged:
            current = self.store.get_lease(self.name)
            log.warning("lease %s is held by %s until %s: %s waits (standby) and does not "
                        "act until that lease is released or expires", self.name,
                        current.holder if current else "?",
                        current.expires_at.isoformat() if current else "?", self.holder)
            self._waiting_logged = True
        return self.held()

    def start(self) -> None:
        """Begin trying (and renewing) in a daemon thread."""
        self._thread = threading.Thread(target=self._run, name=f"lease-{self.name}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.try_once()
            except Exception:  # noqa: BLE001 - keep trying; logged with its traceback
                log.exception("lease %s: try failed", self.name)
            self._stop.wait(self.period_s)

    def wait_held(self, stop: threading.Event) -> bool:
        """Block until the lease is held (True) or ``stop`` is set (False)."""
        while not stop.is_set():
            if self.held():
                return True
            stop.wait(0.2)
        return False

    def stop(self, release: bool = True) -> None:
        """Stop renewing; ``release``: give the lease back so a standby takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if release and self._renewed_at is not None:
            try:
                self.store.release_lease(self.name, self.holder)
                log.info("lease %s released by %s", self.name, self.holder)
            except Exception as error:  # noqa: BLE001 - it expires by itself
                log.warning("lease %s: release failed (%s); it expires in %.0f s",
                            self.name, error, self.ttl_s)
        self._renewed_at = None
