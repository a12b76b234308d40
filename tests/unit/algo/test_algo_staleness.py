"""Admission control (mgrpo.algo.staleness): over random timings, no sample is ever more
than its model's bound behind the trainer, rounds are trained once and in order, and the
pipeline never deadlocks. N = 0 never overlaps sampling with training."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgrpo.algo.staleness import Admission, StalenessExceeded, staleness


def simulate(adm: Admission, rounds: int, gen_time: list[float],
             train_time: list[dict[str, float]], choice: str) -> dict:
    """Discrete-event run of one sampler and one trainer driven by ``adm``: the sampler
    plays rounds in order as soon as they are admitted; the trainer trains generated rounds
    in order, model by model, publishing each model's new version when its update ends."""
    models = list(adm.max_staleness)
    r0 = adm.first_round
    published = {m: adm.first_version.get(m, 0) for m in models}
    now, gen_next, gen_end, gen_versions = 0.0, r0, None, None
    generated: dict[int, dict[str, int]] = {}
    train_round, train_step, train_end = r0, 0, None
    trained: list[tuple[int, str, int]] = []  # (round, model, staleness)
    overlaps = 0
    spans: dict[int, tuple[float, float]] = {}
    while train_round < r0 + rounds:
        if gen_end is None and gen_next < r0 + rounds:
            versions = adm.sample_versions(gen_next, published, choice)
            if versions is not None:
                gen_versions, gen_end = versions, now + gen_time[gen_next - r0]
                spans[gen_next] = (now, gen_end)
        if train_end is None and train_round in generated:
            train_end = now + train_time[train_round - r0][models[train_step]]
        events = [t for t in (gen_end, train_end) if t is not None]
        assert events, f"deadlock at round {gen_next} (published {published})"
        now = min(events)
        if gen_end is not None and train_end is not None:
            overlaps += 1
        if gen_end == now:
            generated[gen_next], gen_next, gen_end = gen_versions, gen_next + 1, None
        if train_end == now:
            model = models[train_step]
            assert published[model] == adm.train_version(model, train_round)
            worst = adm.check(model, train_round, [generated[train_round][model]])
            trained.append((train_round, model, worst))
            published[model] += 1
            train_step, train_end = train_step + 1, None
            if train_step == len(models):
                train_round, train_step = train_round + 1, 0
    return {"trained": trained, "overlaps": overlaps, "spans": spans}


timings = st.integers(1, 6).flatmap(lambda rounds: st.tuples(
    st.just(rounds),
    st.dictionaries(st.sampled_from(["planner", "searcher", "coder"]), st.integers(0, 3),
                    min_size=1),
    st.lists(st.floats(0.01, 10.0), min_size=rounds, max_size=rounds),
    st.lists(st.fixed_dictionaries({m: st.floats(0.01, 10.0)
                                    for m in ("planner", "searcher", "coder")}),
             min_size=rounds, max_size=rounds),
    st.integers(0, 5), st.integers(0, 3), st.sampled_from(["oldest", "latest"])))


@settings(max_examples=200, deadline=None)
@given(timings)
def test_staleness_never_exceeds_the_bound(case):
    rounds, bounds, gen_time, train_time, first_round, first_version, choice = case
    adm = Admission(bounds, first_round=first_round,
                    first_version={m: first_version for m in bounds})
    out = simulate(adm, rounds, gen_time, train_time, choice)
    assert [(r, m) for r, m, _ in out["trained"]] == [
        (r, m) for r in range(first_round, first_round + rounds) for m in bounds]
    for r, m, worst in out["trained"]:
        assert 0 <= worst <= bounds[m]
        if choice == "oldest":  # deterministic: exactly min(N, rounds since the start)
            assert worst == min(bounds[m], r - first_round)
    if all(n == 0 for n in bounds.values()):
        assert out["overlaps"] == 0  # N = 0: sampling waits for the previous update


def test_n1_overlaps_sampling_with_training():
    adm = Admission({"planner": 1})
    out = simulate(adm, 4, [1.0] * 4, [{"planner": 1.0}] * 4, "oldest")
    assert out["overlaps"] >= 3
    assert out["spans"][1][0] == 1.0  # round 1 samples while round 0 trains


def test_admission_and_check():
    adm = Admission({"planner": 1, "coder": 0}, first_round=2, first_version={"planner": 5,
                                                                             "coder": 2})
    assert adm.min_version("planner", 2) == 5 and adm.min_version("planner", 4) == 6
    assert adm.min_version("coder", 4) == 4
    assert not adm.admitted(3, {"planner": 5, "coder": 2})  # coder (N=0) needs v3
    assert adm.sample_versions(3, {"planner": 6, "coder": 3}) == {"planner": 5, "coder": 3}
    assert adm.sample_versions(3, {"planner": 6, "coder": 3}, "latest") == {"planner": 6,
                                                                          "coder": 3}
    assert adm.check("planner", 3, [5, 6]) == 1 and staleness(6, 5) == 1
    with pytest.raises(StalenessExceeded, match="bound 1"):
        adm.check("planner", 4, [5])
    with pytest.raises(StalenessExceeded):
        adm.check("coder", 3, [4])  # from the future
    with pytest.raises(ValueError, match=">= 0"):
        Admission({"planner": -1})
