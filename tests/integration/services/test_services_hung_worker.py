"""A planner worker whose batch handler hangs (its engine never returns) on the real RabbitMQ
and PostgreSQL: past its handler deadline (``MGRPO_HANDLER_DEADLINE_S``, 3 s here) it closes
its consumer connection, the broker redelivers the batch to a second worker at once, and the
round completes within a bound well under the ~4 minutes (two missed 120 s AMQP heartbeats)
the hung worker kept its batch before. The hung worker says why on its readiness
(``consumer_problems``); once its handler returns, its acks fail on the dead channel and it
consumes again; the round's counts stay exact (its late attempts are zombies)."""

from __future__ import annotations

import threading
import time

import pytest
from fresh_run import fresh_run
from waiting import wait_for

from mgrpo.services.context import make_bus
from mgrpo.services.planner.worker import PlannerRuntime, PlannerWorker
from mgrpo.services.rounds import start_round

pytestmark = pytest.mark.timeout(300)

DEADLINE_S = 3.0
BOUND_S = 30.0  # from the hang to the round's rollouts all completed by the second worker


def test_a_hung_worker_gives_its_batch_back_within_its_deadline(postgres_url, rabbitmq_url,
                                                                tmp_path):
    with fresh_run(postgres_url, rabbitmq_url, tmp_path, "hung",
                   handler_deadline_s=DEADLINE_S) as run:
        settings, cfg, store, queues = run.settings, run.cfg, run.store, run.queues
        buses = [make_bus(settings, store), make_bus(settings, store)]
        release, entered = threading.Event(), threading.Event()
        try:
            hung = PlannerRuntime.build(settings, cfg, store, buses[0], reply_suffix="-hung")
            play = hung.runtime.engine.generate

            def hanging(requests, *args, **kwargs):
                entered.set()
                release.wait(120)  # a stuck engine
                return play(requests, *args, **kwargs)

            hung.runtime.engine.generate = hanging
            PlannerWorker(hung).start()
            record = start_round(store, buses[0], cfg, queues)
            assert wait_for(entered.is_set, timeout_s=120), "the hung worker took no batch"
            hung_at = time.monotonic()
            # the second worker's own batch may take long on a loaded machine: no deadline
            calm = settings.model_copy(update={"handler_deadline_s": 600.0})
            PlannerWorker(PlannerRuntime.build(calm, cfg, store, buses[1],
                                               reply_suffix="-calm")).start()
            assert wait_for(lambda: store.round_progress(record.round_id).done,
                            timeout_s=BOUND_S + 60), "the hung worker's batch never came back"
            took = time.monotonic() - hung_at
            print(f"rollouts all completed {took:.1f} s after the hang "
                  f"(deadline {DEADLINE_S:.0f} s)")
            assert took < BOUND_S, took
            problems = buses[0].consumer_problems()
            assert any("handler hung" in p and "MGRPO_HANDLER_DEADLINE_S" in p
                       for p in problems), problems
            assert buses[1].consumer_problems() == []

            release.set()  # the hung handler returns: its acks fail, it consumes again
            assert wait_for(lambda: buses[0].consumer_problems() == [], timeout_s=60), \
                buses[0].consumer_problems()
            progress = store.round_progress(record.round_id)
            assert progress.completed == progress.total == 6
            letters = buses[0].peek_dead_letters()  # its failed acks requeue, never refuse
            assert letters == [], [letter.reason for letter in letters]
        finally:
            release.set()
            for bus in buses:
                bus.close()
