"""The asynchronous mode across the services (max_staleness 1) on the real RabbitMQ and
PostgreSQL, each service its own process: round 1 starts while round 0 is in flight, round 2
is refused until every model has published version 1, and a trainer SIGKILLed while both
rounds are in flight loses and duplicates nothing. Scripted policies in the workers, real
tiny models in the trainers."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_services_processes import MODELS, run_round, start_system, wait_for

from mgrpo.services.context import Queues
from mgrpo.services.rounds import RoundConflict, start_round

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(400)]


def test_async_rounds_overlap_and_a_killed_trainer_loses_nothing(deployment):
    env, store, services = deployment
    path = Path(env["MGRPO_RUN_CONFIG"])
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "max_staleness": 1,
                                    "loss": {"rollout_is": "token"}}))
    start_system(services, trainers=("planner", "coder"))
    settings, cfg, bus, r0 = run_round(env, store)
    assert cfg.staleness("searcher") == 1
    queues = Queues(settings.queue_prefix)
    # Round 1 is sampled by version >= 0: admitted while round 0 is in flight.
    r1 = start_round(store, bus, cfg, queues)
    assert r1.index == 1 and store.get_round(r0.round_id).status != "done"
    # Round 2 needs version 1 of every model; no searcher trainer runs yet.
    with pytest.raises(RoundConflict, match="may start once versions"):
        start_round(store, bus, cfg, queues)
    rids = (r0.round_id, r1.round_id)
    assert wait_for(lambda: all(store.round_progress(r).done for r in rids)
                    and all({"planner", "coder"} <= store.published_models(r) for r in rids))
    expected = sum(store.d_counts("searcher"))
    assert expected >= 6
    services.start("trainer-searcher", "trainer", "--model", "searcher")
    assert wait_for(lambda: store.count_trajectories(rids[0], "searcher") >= 1, 120,
                    poll_s=0.01)
    services.kill("trainer-searcher")  # SIGKILL, mid-ingestion or mid-training
    assert store.get_round(r1.round_id).status != "done", "finished before the kill"
    services.start("trainer-searcher-2", "trainer", "--model", "searcher")
    assert wait_for(lambda: all(store.get_round(r).status == "done" for r in rids)), \
        services.log("trainer-searcher-2")[-2000:]
    stored = sum(store.count_trajectories(r, "searcher") for r in rids)
    assert stored == expected  # none lost, none twice
    assert sum(len(store.round_trajectories(r, "searcher")) for r in rids) == expected
    for model in MODELS:
        assert [c.version for c in store.list_checkpoints(model)] == [1, 2]
        for index, rid in enumerate(rids):
            versions = {t.weights_version for t in store.round_trajectories(rid, model)}
            assert versions <= {0, index}  # round 1 may be sampled by version 0 or 1
            metrics = store.metrics(cfg.name, rid)[rid]
            assert 0 <= metrics[f"{model}/staleness_max"] <= index
    assert start_round(store, bus, cfg, queues).index == 2  # admitted now
    bus.close()
