"""AT-GRPO with tree sampling through the services == embedded mode (issue 10 item 3).

One round of ``algorithm: at_grpo`` played by embedded mode (``tree_round.run_at_grpo_round``)
and by the services (the planner worker plays each query's tree, its delegations go to the
sub-agent workers as tree calls that branch K continuations per turn, the trainers wait for
every candidate the planner worker counted and train per-turn groups). The services run in
this process on the in-memory bus and SQLite (``bench_round.inprocess_round``, as in
``test_services_algorithms.py``). Compared: tokens of every candidate, planner outcomes,
group statistics (one per (query, agent, turn)), metrics both sides record, updated weights
(max abs difference printed and asserted <= 1e-5). Once more through six service processes
on the real RabbitMQ and a fresh PostgreSQL database (``bench_round.distributed_round``, as
``test_services_parity.py``; about 2.5 min, mostly process start-up, on a loaded machine):
the tree calls cross the real transport.
"""

from __future__ import annotations

import pytest
from parity_kit import assert_rounds_equal, load_bench_round

bench_round = load_bench_round()

B, K = 4, 4
SEED = 6


@pytest.fixture(scope="module")
def rounds(tmp_path_factory, warm_assets):
    root = tmp_path_factory.mktemp("at_grpo")
    make = bench_round.make_config
    emb = bench_round.embedded_round(make(warm_assets, root / "emb", b=B, k=K, seed=SEED,
                                          variant="at_grpo"))
    cfg = make(warm_assets, root / "svc-out", b=B, k=K, seed=SEED, variant="at_grpo")
    svc = bench_round.inprocess_round(cfg, root / "svc")
    return emb, svc, cfg


@pytest.mark.heavy
def test_the_tree_round_is_not_trivial(rounds):
    emb, _, cfg = rounds
    assert len(emb.outcomes) == B * K
    agents = {agent for _, agent, _ in emb.stats}
    assert {"planner", "searcher"} <= agents, agents  # sub-agent subtrees were played
    assert any("|t1" in key for _, _, key in emb.stats)  # more than one turn per agent
    assert any(std > 0 for _, _, std in emb.stats.values())  # candidates' rewards differ
    assert all(n == K for n, _, _ in emb.stats.values())  # every group: K candidates
    assert emb.weights.keys() == set(cfg.trained_models())


@pytest.mark.heavy
def test_services_equal_embedded(rounds):
    emb, svc, _ = rounds
    common = assert_rounds_equal(emb, svc, what="candidates")
    assert {"planner/turn_reward_mean", "searcher/turn_reward_mean",
            "planner/pg_loss"} <= common
    parity = bench_round.compare_rounds(emb, svc)
    print(f"AT-GRPO parity: weight max abs diff {parity['weight_max_abs_diff']:.3g} over "
          f"{parity['weight_tensors']:.0f} tensors, {len(emb.tokens)} candidates")


@pytest.mark.heavy
@pytest.mark.timeout(900)
def test_six_processes_on_rabbitmq_and_postgres_equal_embedded(rounds, tmp_path, postgres_url,
                                                               rabbitmq_url, warm_assets):
    emb, _, _ = rounds
    cfg = bench_round.make_config(warm_assets, tmp_path / "dist-out", b=B, k=K, seed=SEED,
                                  variant="at_grpo")
    dist = bench_round.distributed_round(cfg, postgres_url, rabbitmq_url, tmp_path / "dist")
    parity = bench_round.compare_rounds(emb, dist)
    exact = ("outcome_keys_only_one_side", "outcome_mismatches", "token_keys_only_one_side",
             "token_mismatches", "stat_keys_only_one_side")
    assert {k: parity[k] for k in exact} == dict.fromkeys(exact, 0.0), parity
    assert parity["stat_max_abs_diff"] <= 1e-6 and parity["metric_max_abs_diff"] <= 1e-5
    assert parity["metrics_compared"] > 0 and parity["weight_max_abs_diff"] <= 1e-5, parity
