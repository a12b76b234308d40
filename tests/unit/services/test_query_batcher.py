"""The planner API's model thread (``QueryBatcher``) without a server: queries go ahead of
background jobs (an evaluation's episodes), which only fill the slots queries leave free;
decoding modes are never mixed in a batch; admission beyond ``max_in_flight`` is refused."""

from __future__ import annotations

import asyncio
import threading

import pytest

from mgrpo.services.api.query_batcher import Busy, QueryBatcher


class Recorder:
    """``play`` for the batcher: records each batch; the first one waits for ``gate``."""

    def __init__(self) -> None:
        self.batches: list[tuple[list, bool]] = []
        self.gate = threading.Event()

    def __call__(self, jobs: list, greedy: bool) -> list:
        self.batches.append((list(jobs), greedy))
        if len(self.batches) == 1:
            assert self.gate.wait(30), "the test never opened the gate"
        return [f"ep-{job}" for job in jobs]


async def until(predicate) -> None:
    for _ in range(3000):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def test_a_query_goes_ahead_of_the_waiting_background_jobs():
    play = Recorder()

    async def scenario():
        batcher = QueryBatcher(play, max_in_flight=4, max_batch=2)
        background = batcher.submit_background([f"e{i}" for i in range(6)], greedy=True)
        await until(lambda: play.batches)  # e0, e1 playing
        query = asyncio.ensure_future(batcher.submit("q0", True))
        await until(lambda: batcher.waiting == (1, 4))
        play.gate.set()
        assert await query == "ep-q0"
        assert await asyncio.gather(*background) == [f"ep-e{i}" for i in range(6)]
        assert batcher.in_flight == 0
        batcher.close()

    asyncio.run(scenario())
    assert [jobs for jobs, _ in play.batches] == [["e0", "e1"], ["q0", "e2"], ["e3", "e4"],
                                                  ["e5"]]


def test_greedy_and_sampled_jobs_are_never_mixed():
    play = Recorder()

    async def scenario():
        batcher = QueryBatcher(play, max_in_flight=4, max_batch=2)
        background = batcher.submit_background([f"e{i}" for i in range(6)], greedy=True)
        await until(lambda: play.batches)
        sampled = asyncio.ensure_future(batcher.submit("q0", False))
        await until(lambda: batcher.waiting == (1, 4))
        play.gate.set()
        await asyncio.gather(sampled, *background)
        batcher.close()

    asyncio.run(scenario())
    assert play.batches == [(["e0", "e1"], True), (["q0"], False), (["e2", "e3"], True),
                            (["e4", "e5"], True)]


def test_queries_beyond_max_in_flight_are_refused_and_background_jobs_are_not_counted():
    play = Recorder()

    async def scenario():
        batcher = QueryBatcher(play, max_in_flight=2, max_batch=8)
        background = batcher.submit_background(["e0"] * 5, greedy=True)
        await until(lambda: play.batches)
        held = [asyncio.ensure_future(batcher.submit(f"q{i}", True)) for i in range(2)]
        await until(lambda: batcher.in_flight == 2)
        with pytest.raises(Busy) as refused:
            await batcher.submit("q2", True)
        assert refused.value.retry_after_s >= 1
        assert "max_in_flight=2" in str(refused.value)
        play.gate.set()
        assert await asyncio.gather(*held) == ["ep-q0", "ep-q1"]
        await asyncio.gather(*background)
        assert batcher.in_flight == 0 and batcher.problem() is None
        batcher.close()

    asyncio.run(scenario())


def test_a_failed_batch_fails_its_jobs_and_the_thread_lives_on():
    calls = []

    def play(jobs, greedy):
        calls.append(list(jobs))
        if len(calls) == 1:
            raise RuntimeError("engine exploded")
        return [f"ep-{job}" for job in jobs]

    async def scenario():
        batcher = QueryBatcher(play, max_in_flight=2, max_batch=1)
        with pytest.raises(RuntimeError, match="engine exploded"):
            await batcher.submit("q0", True)
        assert await batcher.submit("q1", True) == "ep-q1"
        assert batcher.problem() is None and batcher.in_flight == 0
        batcher.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("max_batch, expected", [
    (4, [["q0"], ["q1", "q2", "q3", "e0"], ["q4", "q5", "q6", "e1"], ["q7", "q8"]]),
    (1, [["q0"], ["e0"], ["q1"], ["e1"], ["q2"], ["q3"], ["q4"], ["q5"], ["q6"], ["q7"],
         ["q8"]]),
])
def test_background_jobs_progress_while_queries_keep_every_slot_busy(max_batch, expected):
    """A quarter of a batch (every other batch with max_batch 1) stays for the background
    lane while it has jobs: before, an evaluation made no progress at all under load."""
    play = Recorder()

    async def scenario():
        batcher = QueryBatcher(play, max_in_flight=20, max_batch=max_batch)
        first = asyncio.ensure_future(batcher.submit("q0", True))
        await until(lambda: play.batches)
        queries = [asyncio.ensure_future(batcher.submit(f"q{i}", True)) for i in range(1, 9)]
        await until(lambda: batcher.waiting[0] == 8)
        background = batcher.submit_background(["e0", "e1"], greedy=True)
        play.gate.set()
        await asyncio.gather(first, *queries, *background)
        batcher.close()

    asyncio.run(scenario())
    assert [jobs for jobs, _ in play.batches] == expected
