"""A task (planner worker) or a delegation (sub-agent worker) for a round the store does not
hold is dead-lettered with its reason (before, both workers acked it silently: neither played
nor kept), on the real RabbitMQ and PostgreSQL; the known round's messages of the same batch
are played."""

from __future__ import annotations

import json

import pytest
from fresh_run import fresh_run
from queues_cleanup import delete_queues
from waiting import wait_for

from mgrpo.bus.messages import EpisodeTask, SubAgentCall
from mgrpo.services.context import make_bus
from mgrpo.services.planner.worker import PlannerRuntime, PlannerWorker
from mgrpo.services.rounds import start_round
from mgrpo.services.subagent.worker import SubagentWorker

REPLIES = "unknown-round-test"  # the sub-agent test's reply queue (``queues.replies``)


@pytest.fixture
def run_bus(postgres_url, rabbitmq_url, tmp_path):
    """(run, bus): the run "known" on a fresh database and prefix, and a bus on it."""
    with fresh_run(postgres_url, rabbitmq_url, tmp_path, "known") as run:
        bus = make_bus(run.settings, run.store)
        try:
            yield run, bus
        finally:
            bus.close()
            delete_queues(rabbitmq_url, run.queues.replies(REPLIES))


@pytest.fixture
def planner(run_bus):
    """(store, cfg, bus, queues): a planner worker consuming on a fresh database and prefix."""
    run, bus = run_bus
    PlannerWorker(PlannerRuntime.build(run.settings, run.cfg, run.store, bus)).start()
    return run.store, run.cfg, bus, run.queues


def test_a_task_of_an_unknown_round_is_dead_lettered_with_its_reason(planner):
    store, cfg, bus, queues = planner
    record = start_round(store, bus, cfg, queues)
    bus.publish(queues.episodes, EpisodeTask(run_id="ghost", round_id="ghost-r0007",
                                             query_id="q1", rollout=0))
    letters: list = []
    assert wait_for(lambda: letters.extend(bus.dead_letters()) or letters, timeout_s=120), \
        "the unknown round's task was not dead-lettered"
    assert len(letters) == 1, [letter.reason for letter in letters]
    letter = letters[0]
    assert letter.queue == queues.episodes
    assert json.loads(letter.body)["round_id"] == "ghost-r0007"
    assert "ghost-r0007" in letter.reason and "not in the store" in letter.reason
    assert wait_for(lambda: store.round_progress(record.round_id).done, timeout_s=120)


def test_a_task_naming_what_its_round_does_not_hold_is_dead_lettered(planner):
    store, cfg, bus, queues = planner
    record = start_round(store, bus, cfg, queues)
    query = store.rollouts(record.round_id)[0].query_id
    bad = [EpisodeTask(run_id=record.run_id, round_id=record.round_id, query_id="no-such-q",
                       rollout=0),
           EpisodeTask(run_id=record.run_id, round_id=record.round_id, query_id=query,
                       rollout=99),
           EpisodeTask(run_id="ghost", round_id=record.round_id, query_id=query, rollout=1,
                       attempt=5)]  # its own key: not a duplicate of the real task
    bus.publish_many([(queues.episodes, task) for task in bad])
    letters: list = []
    assert wait_for(lambda: letters.extend(bus.dead_letters()) or len(letters) >= 3,
                    timeout_s=120), [letter.reason for letter in letters]
    reasons = sorted(letter.reason for letter in letters)
    assert len(reasons) == 3, reasons
    assert any("has no rollout 0 of query 'no-such-q'" in r for r in reasons), reasons
    assert any(f"has no rollout 99 of query {query!r}" in r for r in reasons), reasons
    assert any("the task names run 'ghost'" in r for r in reasons), reasons
    assert wait_for(lambda: store.round_progress(record.round_id).done, timeout_s=120)


@pytest.fixture
def subagent(run_bus):
    """(store, cfg, bus, queues): a searcher sub-agent worker on a fresh database and prefix."""
    run, bus = run_bus
    worker = SubagentWorker(run.settings, run.cfg, run.store, bus, "searcher", "search")
    worker.start()
    yield run.store, run.cfg, bus, run.queues
    worker.stop()


def test_a_call_of_an_unknown_round_is_dead_lettered_and_a_known_one_answered(subagent):
    store, cfg, bus, queues = subagent
    record = start_round(store, bus, cfg, queues)  # no planner worker: only its round row
    reply_to = queues.replies(REPLIES)
    replies: list = []
    bus.consume(reply_to, replies.append, consumer=REPLIES, dedupe=False)
    calls = [SubAgentCall(call_id=f"{rid}/q1/0/searcher/0", round_id=rid, query_id="q1",
                          agent="searcher", subtask="population of Velmora", reply_to=reply_to,
                          group="g1", group_size=2)
             for rid in ("ghost-r0007", record.round_id)]
    bus.publish_many([(queues.subagent("searcher"), call) for call in calls])
    letters: list = []
    assert wait_for(lambda: letters.extend(bus.dead_letters()) or letters, timeout_s=120), \
        "the unknown round's call was not dead-lettered"
    assert wait_for(lambda: replies, timeout_s=120), "the known round's call was not answered"
    assert len(letters) == 1, [letter.reason for letter in letters]
    letter = letters[0]
    assert letter.queue == queues.subagent("searcher")
    assert json.loads(letter.body)["round_id"] == "ghost-r0007"
    assert "ghost-r0007" in letter.reason and "not in the store" in letter.reason
    assert [r.call_id for r in replies] == [calls[1].call_id]
