"""Backpressure and batching for the planner API's model work: one model thread, two lanes.

Why: if every query took the planner's lock in a thread of the server's shared pool, one at
a time, 200 clients would get the throughput of one, ``/healthz`` would wait behind them for
a free thread (down for minutes under load), and an evaluation holding that lock for its
whole length would answer no query until it ended. Here:

- at most ``max_in_flight`` queries are admitted (playing + waiting); the next one is refused
  at once with :class:`Busy` (HTTP 429 with ``Retry-After``), so load is shed instead of
  piling up requests that would time out anyway;
- admitted queries wait on an asyncio future, holding no server thread; ONE model thread
  takes whatever is waiting (up to ``max_batch``, same decoding mode) and plays it as a single
  batched run of the episode runner, so concurrent queries are answered in parallel (one
  batched generation per turn) rather than one after the other;
- background jobs (an evaluation's episodes, :meth:`QueryBatcher.submit_background`) wait in
  a lane of their own: a batch takes the waiting queries first and fills the slots they
  leave free with background jobs, except for a share kept for the background lane while it
  has jobs waiting (a quarter of ``max_batch``, rounded up; with ``max_batch`` 1, every other
  batch), so an evaluation progresses under any query load. A query waits for at most the
  batch that is playing (and, with ``max_batch`` 1, one background batch), never for a
  whole evaluation;
- the event loop and the thread pool that serve ``/healthz`` and reads never run model work.

What this module does NOT do: fairness between clients, priorities among queries, or
time-outs of a query already playing (the planner's own turn and delegation limits bound
that). Background jobs are not counted in ``max_in_flight`` (their caller bounds them); a
batch has one decoding mode, so background jobs whose ``greedy`` differs from that of the
waiting queries wait until no such query does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import deque
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
    admitted: bool  # a query holding an admission slot (background jobs hold none)


def _take(lane: deque[_Item], greedy: bool, n: int) -> list[_Item]:
    """Up to ``n`` items of ``lane`` with this ``greedy``, oldest first; the rest keep order."""
    taken: list[_Item] = []
    kept: list[_Item] = []
    while lane:
        item = lane.popleft()
        (taken if len(taken) < n and item.greedy == greedy else kept).append(item)
    lane.extend(kept)
    return taken


class QueryBatcher:
    """Admit at most ``max_in_flight`` queries; play queries and background jobs in batches
    on one model thread, queries first.

    ``play(jobs, greedy) -> episodes`` (one per job, in order) runs only on that thread.
    """

    def __init__(self, play: Callable[[list, bool], list], max_in_flight: int,
                 max_batch: int) -> None:
        self._play, self.max_in_flight, self.max_batch = play, max_in_flight, max_batch
        self._queries: deque[_Item] = deque()
        self._background: deque[_Item] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._last_had_background = False  # model thread only
        self._thread: threading.Thread | None = None
        self.in_flight = 0  # admitted queries; touched on the event loop only
        self.last_batch_s = 1.0
        self.batch_sizes: list[int] = []  # recent batch sizes (observability, tests)

    async def submit(self, job, greedy: bool):
        """Play one query; raises :class:`Busy` when ``max_in_flight`` are admitted already."""
        if self.in_flight >= self.max_in_flight:
            raise Busy(f"planner busy: {self.in_flight} queries in flight (max_in_flight="
                       f"{self.max_in_flight}, MGRPO_MAX_QUERIES_IN_FLIGHT); retry later",
                       retry_after_s=max(1, math.ceil(self.last_batch_s)))
        self.in_flight += 1  # released on the event loop when the job is played
        (item,) = self._enqueue(self._queries, [job], greedy, admitted=True)
        return await asyncio.shield(item.future)  # a client gone does not free the slot early

    def submit_background(self, jobs: list, greedy: bool) -> list[asyncio.Future]:
        """Queue ``jobs`` in the background lane; one future per job (its episode)."""
        return [item.future for item in self._enqueue(self._background, jobs, greedy,
                                                      admitted=False)]

    def _enqueue(self, lane: deque[_Item], jobs: list, greedy: bool,
                 admitted: bool) -> list[_Item]:
        loop = asyncio.get_running_loop()
        items = [_Item(job, greedy, loop.create_future(), loop, admitted) for job in jobs]
        with self._wake:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="planner-model",
                                                daemon=True)
                self._thread.start()
            lane.extend(items)
            self._wake.notify()
        return items

    @property
    def waiting(self) -> tuple[int, int]:
        """(queries, background jobs) waiting for the model thread (not playing)."""
        with self._wake:
            return len(self._queries), len(self._background)

    def problem(self) -> str | None:
        """Why the model thread cannot play anything (None: it can, or has not started)."""
        if self._thread is not None and not self._thread.is_alive() and not self._closed:
            return "planner model thread is dead"
        return None

    def close(self) -> None:
        """Stop after the batch that is playing; what is still waiting is not played."""
        with self._wake:
            self._closed = True
            self._wake.notify()

    def background_share(self) -> int:
        """Slots of the next batch kept for background jobs while queries wait too."""
        if self.max_batch > 1:
            return math.ceil(self.max_batch / 4)
        return 0 if self._last_had_background else 1  # one slot: every other batch

    def _next_batch(self) -> list[_Item] | None:
        """Block for work; then the background share, the waiting queries (same ``greedy``
        as the oldest query) and background jobs of that ``greedy`` up to ``max_batch``."""
        with self._wake:
            while not self._closed and not self._queries and not self._background:
                self._wake.wait()
            if self._closed:
                return None
            greedy = (self._queries or self._background)[0].greedy
            kept = _take(self._background, greedy, self.background_share()) \
                if self._queries else []
            batch = _take(self._queries, greedy, self.max_batch - len(kept)) + kept
            batch += _take(self._background, greedy, self.max_batch - len(batch))
            self._last_had_background = any(not item.admitted for item in batch)
            return batch

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            started = time.perf_counter()
            try:
                results = self._play([item.job for item in batch], batch[0].greedy)
                outcomes = [(item, result, None) for item, result in zip(batch, results,
                                                                           strict=True)]
            except Exception as error:  # every waiting job gets the error, the thread lives
                log.exception("planner batch of %d jobs failed", len(batch))
                outcomes = [(item, None, error) for item in batch]
            self.last_batch_s = time.perf_counter() - started
            self.batch_sizes = (self.batch_sizes + [len(batch)])[-100:]
            for item, result, error in outcomes:
                # a RuntimeError: the server's loop is closed, nobody is waiting any more
                with contextlib.suppress(RuntimeError):
                    item.loop.call_soon_threadsafe(self._resolve, item, result, error)

    def _resolve(self, item: _Item, result, error) -> None:
        if item.admitted:
            self.in_flight -= 1
        if item.future.done():
            return
        if error is not None:
            item.future.set_exception(error)
        else:
            item.future.set_result(result)
