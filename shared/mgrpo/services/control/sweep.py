"""The control worker's round sweep: at start and every ``PUBLISH_SWEEP_S``, publish the tasks
of any round whose creator died between creating it and publishing them
(:func:`mgrpo.services.rounds.publish_unpublished_rounds`, idempotent by task key).

What this module does NOT do: create or finish rounds.
"""

from __future__ import annotations

import logging
import threading

from mgrpo.services.rounds import PUBLISH_SWEEP_S, publish_unpublished_rounds

log = logging.getLogger("mgrpo.control")


def sweep_rounds(ctx, stop: threading.Event, every_s: float = PUBLISH_SWEEP_S) -> None:
    """Sweep until ``stop``; a failed pass (the store or the broker down) is logged and the
    next one tries again."""
    while True:
        try:
            publish_unpublished_rounds(ctx.store, ctx.bus, ctx.queues, ctx.cfg)
        except Exception:  # noqa: BLE001 - the next pass tries again
            log.exception("round sweep failed; trying again in %.0f s", every_s)
        if stop.wait(every_s):
            return


def start_round_sweep(ctx, every_s: float = PUBLISH_SWEEP_S) -> threading.Event:
    """Run :func:`sweep_rounds` on a daemon thread; set the returned event to stop it."""
    stop = threading.Event()
    threading.Thread(target=sweep_rounds, args=(ctx, stop, every_s), name="round-sweep",
                     daemon=True).start()
    return stop
