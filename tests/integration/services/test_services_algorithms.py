"""Every algorithm the embedded loop offers, through the services (issue 10 item 3).

- ``grpo`` (single agent), ``main-only`` (M-GRPO, frozen sub-agents) and a ``curriculum``
  stage with a difficulty filter: one round played by embedded mode (``run_round``) and by
  the services (planner worker, sub-agent workers, trainers: the classes ``mgrpo serve``
  runs) must agree exactly: tokens, planner outcomes, group statistics, metrics, updated
  weights. The services run in this process on the in-memory bus and SQLite
  (``bench_round.inprocess_round``): the code under test is the services', the transport is
  covered by ``test_services_parity.py`` (M-GRPO through six processes, RabbitMQ,
  PostgreSQL), and one process set per algorithm would cost minutes each.
- ``at_grpo`` (tree sampling through the bus): ``test_services_at_grpo.py``.
- A run's round ``i`` takes its questions from the curriculum stage of round ``i`` (was:
  always the first stage).

Compared as in the M-GRPO parity test; left out by design: timings and metrics only one side
records. Frozen models (main-only) are compared too: both modes store and score their
trajectories (rewards, group statistics, metrics), neither updates them.
"""

from __future__ import annotations

import pytest
from parity_kit import assert_rounds_equal, load_bench_round

bench_round = load_bench_round()

B, K = 6, 4
SEED = 6  # as in test_services_parity.py: varied rewards and searcher calls
VARIANTS = ("grpo", "main-only", "curriculum")


@pytest.fixture(scope="module", params=VARIANTS)
def rounds(request, tmp_path_factory, warm_assets):
    """(variant, embedded RoundData, services' RoundData, config) of one variant."""
    root = tmp_path_factory.mktemp(request.param)
    make = bench_round.make_config
    emb = bench_round.embedded_round(make(warm_assets, root / "emb", b=B, k=K, seed=SEED,
                                          variant=request.param))
    cfg = make(warm_assets, root / "svc-out", b=B, k=K, seed=SEED, variant=request.param)
    svc = bench_round.inprocess_round(cfg, root / "svc")
    return request.param, emb, svc, cfg


@pytest.mark.heavy
def test_the_round_is_not_trivial(rounds):
    variant, emb, _, cfg = rounds
    assert len(emb.outcomes) == B * K
    assert len({reward for _, _, reward in emb.outcomes.values()}) > 1
    assert emb.weights.keys() == set(cfg.trained_models())
    if variant == "grpo":  # the single agent played the searcher in its own context
        assert emb.weights.keys() == {"single"}
        assert emb.metrics["searcher/calls_per_episode"] > 0
    if variant == "main-only":
        assert emb.weights.keys() == {"planner"}
        assert {m for m, _, _ in emb.stats} == {"planner", "searcher"}  # the coder is unused
    if variant == "curriculum":  # the filter changed which questions the round plays
        from mgrpo.envs import load_benchmark
        from mgrpo.training.rounds import sample_questions

        pool = load_benchmark(cfg.bench_dir).questions("train", stage=1)
        unfiltered = {q.id for q in sample_questions(pool, B, cfg.seed, 0)}
        assert {q for q, _ in emb.outcomes} != unfiltered


@pytest.mark.heavy
def test_services_equal_embedded(rounds):
    variant, emb, svc, _ = rounds
    common = assert_rounds_equal(emb, svc)
    assert {"planner/reward_mean", "planner/pg_loss"} <= {k.replace("single/", "planner/")
                                                           for k in common}
    if variant == "main-only":  # the frozen searcher is scored in both modes
        assert {"searcher/reward_mean", "searcher/d", "searcher/samples"} <= common


def test_each_round_takes_its_stage_questions(tmp_path, warm_assets):
    from mgrpo.bus import InMemoryBus
    from mgrpo.envs import load_benchmark
    from mgrpo.services.context import Queues
    from mgrpo.services.rounds import start_round
    from mgrpo.store import Store
    from mgrpo.training.config import RunConfig

    data = bench_round.make_config(warm_assets, tmp_path / "out", b=3, k=2).model_dump()
    data["stages"] = [{"stage": 1, "rounds": 1}, {"stage": 2, "rounds": 1}]
    cfg = RunConfig.model_validate(data)
    bench = load_benchmark(cfg.bench_dir)
    store = Store(f"sqlite:///{tmp_path}/store.db")
    store.upgrade()
    bus = InMemoryBus(store)  # nobody consumes: the tasks just wait
    stages = []
    for _ in range(3):  # the third round is past the schedule: it stays in the last stage
        record = start_round(store, bus, cfg, Queues(), bench=bench)
        ids = {r.query_id for r in store.rollouts(record.round_id)}
        stages.append({store.get_query(q).meta["stage"] for q in ids})
        store.set_round_status(record.round_id, "done")
    assert stages == [{1}, {2}, {2}]



def test_a_filtered_stage_starts_with_its_filter_round(tmp_path, warm_assets):
    """The first call of a ``max_success`` < 1 stage enqueues the filter (no model trains);
    while it runs the run is busy (409); a filter that did not finish cannot choose
    questions (422 at the API), instead of silently training on the unfiltered pool."""
    from mgrpo.bus import InMemoryBus
    from mgrpo.envs import load_benchmark
    from mgrpo.services.context import Queues
    from mgrpo.services.rounds import RoundConflict, RoundRefused, cancel_round, start_round
    from mgrpo.store import Store

    cfg = bench_round.make_config(warm_assets, tmp_path / "out", b=3, k=2, variant="curriculum")
    store = Store(f"sqlite:///{tmp_path}/store.db")
    store.upgrade()
    bus = InMemoryBus(store)  # nobody consumes: the tasks just wait
    record = start_round(store, bus, cfg, Queues())
    assert (record.round_id, record.index) == (f"{cfg.name}-filter0", -1)
    assert record.config["trained_models"] == []
    pool = load_benchmark(cfg.bench_dir).questions("train", stage=1)
    rollouts = store.rollouts(record.round_id)  # every question of the stage, filter_samples
    assert sorted((r.query_id, r.rollout) for r in rollouts) == sorted(
        (q.id, k) for q in pool for k in range(2))
    with pytest.raises(RoundConflict):
        start_round(store, bus, cfg, Queues())
    cancel_round(store, record.round_id)
    with pytest.raises(RoundRefused, match="difficulty filter of stage 0"):
        start_round(store, bus, cfg, Queues())
