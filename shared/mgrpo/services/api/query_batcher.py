"""Backpressure and batching for ``POST /v1/queries``: one model thread, bounded admission.

Why: every query used to take the planner's lock in a thread of the server's shared pool,
one at a time, so 200 clients got the throughput of one, and ``/healthz`` waited behind them
for a free thread (down for minutes under load). Here:

- at most ``max_in_flight`` queries are admitted (playing + waiting); the next one is refused
  at once with :class:`Busy` (HTTP 429 with ``Retry-After``), so load is shed instead of
  piling up requests that would time out anyway;
- admitted queries wait on an asyncio future, holding no server thread; ONE model thread
  takes whatever is waiting (up to ``max_batch``, same decoding mode) and plays it as a single
  batched run of the episode runner, so concurrent queries are answered in parallel (one
  batched generation per turn) rather than one after the other;
- the event loop and the thread pool that serve ``/healthz`` and reads never run model work.

What this module does NOT do: fairness between clients, priorities, or time-outs of a
query already playing (the planner's own turn and delegation limits bound that).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


class Busy(RuntimeError):
    """Every admission slot is taken; ``retry_after_s`` is a hint for the client."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class _Item:
    job: object
    greedy: bool
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class QueryBatcher:
    """Admit at most ``max_in_flight`` jobs; play them in batches on one model thread.

    ``play(jobs, greedy) -> episodes`` (one per job, in order) runs only on that thread.
    """

    def __init__(self, play: Callable[[list, bool], list], max_in_flight: int,
                 max_batch: int) -> None:
        self._play, self.max_in_flight, self.max_batch = play, max_in_flight, max_batch
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.in_flight = 0  # touched on the event loop only
        self.last_batch_s = 1.0
        self.batch_sizes: list[int] = []  # recent batch sizes (observability, tests)

    async def submit(self, job, greedy: bool):
        """Play one job; raises :class:`Busy` when ``max_in_flight`` are admitted already."""
        if self.in_flight >= self.max_in_flight:
            raise Busy(f"planner busy: {self.in_flight} queries in flight (max_in_flight="
                       f"{self.max_in_flight}, MGRPO_MAX_QUERIES_IN_FLIGHT); retry later",
                       retry_after_s=max(1, math.ceil(self.last_batch_s)))
        self._ensure_thread()
        loop = asyncio.get_running_loop()
        self.in_flight += 1  # released by the model thread when the job is played
        item = _Item(job, greedy, loop.create_future(), loop)
        self._queue.put(item)
        return await asyncio.shield(item.future)  # a client gone does not free the slot early

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="planner-model",
                                                daemon=True)
                self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)

    def _next_batch(self, carried: list[_Item]) -> list[_Item] | None:
        """Block for one item, then take what else is waiting with the same ``greedy``."""
        first = carried.pop(0) if carried else self._queue.get()
        if first is None:
            return None
        batch = [first]
        while len(batch) < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # stop after this batch
                break
            (batch if item.greedy == first.greedy else carried).append(item)
        return batch

    def _loop(self) -> None:
        carried: list[_Item] = []
        while (batch := self._next_batch(carried)) is not None:
            started = time.perf_counter()
            try:
                results = self._play([item.job for item in batch], batch[0].greedy)
                outcomes = [(item, result, None) for item, result in zip(batch, results,
                                                                           strict=True)]
            except Exception as error:  # every waiting query gets the error, the thread lives
                log.exception("planner batch of %d queries failed", len(batch))
                outcomes = [(item, None, error) for item in batch]
            self.last_batch_s = time.perf_counter() - started
            self.batch_sizes = (self.batch_sizes + [len(batch)])[-100:]
            for item, result, error in outcomes:
                # a RuntimeError: the server's loop is closed, nobody is waiting any more
                with contextlib.suppress(RuntimeError):
                    item.loop.call_soon_threadsafe(self._resolve, item.future, result, error)

    def _resolve(self, future: asyncio.Future, result, error) -> None:
        self.in_flight -= 1
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
