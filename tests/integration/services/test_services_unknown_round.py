"""A task (planner worker) or a delegation (sub-agent worker) for a round the store does not
hold is dead-lettered with its reason (before, both workers acked it silently: neither played
nor kept), on the real RabbitMQ and PostgreSQL; the known round's messages of the same batch
are played."""

from __future__ import annotations

import json
import uuid

import pytest
from queues_cleanup import delete_queues
from services_testkit import make_bench, make_tiny, write_run_config
from waiting import wait_for

from mgrpo.bus.messages import EpisodeTask, SubAgentCall
from mgrpo.config import Settings
from mgrpo.services.context import Queues, load_service_config, make_bus
from mgrpo.services.planner_worker import PlannerRuntime, PlannerWorker
from mgrpo.services.rounds import start_round
from mgrpo.services.subagent_worker import SubagentWorker
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database


@pytest.fixture
def planner(postgres_url, rabbitmq_url, tmp_path):
    """(store, cfg, bus, queues): a planner worker consuming on a fresh database and prefix."""
    cfg_path = write_run_config(tmp_path / "run.yaml", make_tiny(tmp_path / "tiny"),
                                make_bench(tmp_path / "bench"), name="known", k=2, queries=3)
    queues = Queues(f"t{uuid.uuid4().hex[:10]}.")
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        settings = Settings(mode="distributed", database_url=url, broker_url=rabbitmq_url,
                            run_config=str(cfg_path), queue_prefix=queues.prefix,
                            checkpoint_uri=str(tmp_path / "ck"),
                            engine="services_testkit:scripted_engine")
        cfg = load_service_config(settings)
        bus = make_bus(settings, store)
        try:
            PlannerWorker(PlannerRuntime.build(settings, cfg, store, bus)).start()
            yield store, cfg, bus, queues
        finally:
            bus.close()
            delete_queues(rabbitmq_url, queues.episodes, queues.dead_letter,
                          *(queues.trainer(m) for m in ("planner", "searcher", "coder")))
            store.close()


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


@pytest.fixture
def subagent(postgres_url, rabbitmq_url, tmp_path):
    """(store, cfg, bus, queues): a searcher sub-agent worker on a fresh database and prefix."""
    cfg_path = write_run_config(tmp_path / "run.yaml", make_tiny(tmp_path / "tiny"),
                                make_bench(tmp_path / "bench"), name="known", k=2, queries=3)
    queues = Queues(f"t{uuid.uuid4().hex[:10]}.")
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        settings = Settings(mode="distributed", database_url=url, broker_url=rabbitmq_url,
                            run_config=str(cfg_path), queue_prefix=queues.prefix,
                            checkpoint_uri=str(tmp_path / "ck"),
                            engine="services_testkit:scripted_engine")
        cfg = load_service_config(settings)
        bus = make_bus(settings, store)
        worker = SubagentWorker(settings, cfg, store, bus, "searcher", "search")
        try:
            worker.start()
            yield store, cfg, bus, queues
        finally:
            worker.stop()
            bus.close()
            delete_queues(rabbitmq_url, queues.episodes, queues.dead_letter,
                          queues.subagent("searcher"), queues.replies("unknown-round-test"),
                          *(queues.trainer(m) for m in ("planner", "searcher", "coder")))
            store.close()


def test_a_call_of_an_unknown_round_is_dead_lettered_and_a_known_one_answered(subagent):
    store, cfg, bus, queues = subagent
    record = start_round(store, bus, cfg, queues)  # no planner worker: only its round row
    reply_to = queues.replies("unknown-round-test")
    replies: list = []
    bus.consume(reply_to, replies.append, consumer="unknown-round-test", dedupe=False)
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
