"""The distributed system on the real RabbitMQ and PostgreSQL, each service its own process:
a planner worker, two sub-agent types, three trainers. Scripted policies in the workers
(``services_testkit``), real tiny models in the trainers."""

from __future__ import annotations

import json

import httpx
import pytest
import waiting

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.messages import TrajectoryMessage
from mgrpo.config import Settings
from mgrpo.services.context import Queues, load_service_config
from mgrpo.services.launcher import free_port
from mgrpo.services.rounds import start_round
from mgrpo.types import Trajectory

MODELS = ("planner", "searcher", "coder")


def start_system(services, trainers=MODELS) -> None:
    services.start("subagent-searcher", "subagent", "--name", "searcher", "--tool", "search")
    services.start("subagent-coder", "subagent", "--name", "coder", "--tool", "python")
    services.start("planner-worker", "planner-worker")
    for model in trainers:
        services.start(f"trainer-{model}", "trainer", "--model", model)
    for name in list(services.procs):
        services.wait_healthy(name)


def wait_for(predicate, timeout_s: float = 180.0, poll_s: float = 0.1) -> bool:
    """``waiting.wait_for`` with the longer default of the process tests (which import it
    from here)."""
    return waiting.wait_for(predicate, timeout_s, poll_s)


def run_round(env, store):
    settings = Settings(**{k[6:].lower(): v for k, v in env.items()
                           if k.startswith("MGRPO_") and k != "MGRPO_HEALTH_PORT"})
    cfg = load_service_config(settings)
    bus = KombuBus(settings.broker_url, store, dead_letter_queue_name=Queues(
        settings.queue_prefix).dead_letter)
    record = start_round(store, bus, cfg, Queues(settings.queue_prefix))
    return settings, cfg, bus, record


def test_query_and_round_through_separate_processes(deployment):
    env, store, services = deployment
    sandbox_port, api_port = free_port(), free_port()
    services.start("sandbox", "sandbox", "--port", str(sandbox_port), port=sandbox_port)
    services.wait_healthy("sandbox")
    services.env.update(MGRPO_SANDBOX_URL=f"http://127.0.0.1:{sandbox_port}",
                        MGRPO_API_TOKEN="tok")
    start_system(services)
    assert {a.name for a in store.list_agents()} == {"searcher", "coder"}
    services.start("planner", "planner", "--port", str(api_port), port=api_port)
    services.wait_healthy("planner")
    api, auth = f"http://127.0.0.1:{api_port}", {"Authorization": "Bearer tok"}
    answer = httpx.post(f"{api}/v1/queries", headers=auth, timeout=120,
                        json={"question": "What is the population of Velmora?"})
    assert answer.status_code == 200, answer.text
    trace = answer.json()["trace"]
    print("QUERY TRACE", json.dumps(answer.json(), indent=1))
    assert [e["delegate"] for e in trace if "delegate" in e][0] == "searcher"
    tools = [s["tool"] for e in trace for s in e.get("steps", [])]
    assert "search" in tools
    coded = httpx.post(f"{api}/v1/queries", headers=auth, timeout=120,
                       json={"question": "add 2 and 3"}).json()
    steps = [s for e in coded["trace"] for s in e.get("steps", [])]
    assert [(s["tool"], s["observation"].strip()) for s in steps] == [("python", "5")]
    assert coded["answer"] == "5"  # computed in the sandbox service, not in-process
    assert "sandbox_calls_total" in httpx.get(f"http://127.0.0.1:{sandbox_port}/metrics").text
    started = httpx.post(f"{api}/v1/rounds", headers=auth, json={}, timeout=60)
    assert started.status_code == 201, started.text
    rid = started.json()["round_id"]
    cfg = load_service_config(Settings(run_config=env["MGRPO_RUN_CONFIG"]))
    assert wait_for(lambda: store.get_round(rid).status == "done"), \
        f"round {store.get_round(rid).status}:\n{services.log('planner-worker')[-2000:]}"
    assert store.round_progress(rid).completed == 6
    assert store.published_models(rid) == set(MODELS)
    # each trainer received only its own model's trajectories (and every one of them)
    for model in MODELS:
        trajs = store.round_trajectories(rid, model)
        assert {t.model for t in trajs} == {model} and {t.agent for t in trajs} == {model}
        assert store.count_trajectories(rid, model) == len(trajs)
    assert len(store.round_trajectories(rid, "planner")) == 6
    for role in ("searcher", "coder"):
        assert len(store.round_trajectories(rid, role)) == sum(store.d_counts(role))
    assert sum(store.d_counts("searcher")) + sum(store.d_counts("coder")) == 12
    # every trainer wrote group statistics; sub-agent ones come from the stored outcomes
    for model in MODELS:
        assert store.read_group_stats(rid, model=model)
    check_subagent_stats_use_stored_outcomes(store, cfg, rid)
    assert {(c.model, c.version) for c in store.list_checkpoints()} == {(m, 1) for m in MODELS}
    summary = httpx.get(f"{api}/v1/rounds/{rid}", timeout=10).json()
    assert summary["status"] == "done" and summary["published_models"] == sorted(MODELS)
    assert [c["version"] for c in httpx.get(f"{api}/v1/checkpoints").json()] == [1, 1, 1]


def check_subagent_stats_use_stored_outcomes(store, cfg, rid: str) -> None:
    """Recompute the searcher's group statistics from the store's planner outcomes; then again
    with r_correct_main flipped, which must differ (so the check can fail)."""
    from mgrpo.envs import load_benchmark
    from mgrpo.envs.rewards import RuleExpertJudge
    from mgrpo.training.episodes import mix_seed
    from mgrpo.training.scoring import subagent_rewards, subagent_samples

    judge = RuleExpertJudge(load_benchmark(cfg.bench_dir))
    trajs = store.round_trajectories(rid, "searcher")
    outcomes = {(o.query_id, o.rollout): o for o in store.read_planner_outcomes(rid)}
    flipped = {key: o.model_copy(update={"correct": 1.0 - o.correct})
               for key, o in outcomes.items()}
    published = {s.group_key: (s.n, round(s.mean, 6), round(s.std, 6))
                 for s in store.read_group_stats(rid, model="searcher", agent="searcher")}

    def stats(outs):
        rewards = subagent_rewards(trajs, outs, judge, cfg.rewards.subagent)
        _, rows = subagent_samples(trajs, rewards, cfg.k, int(cfg.d), cfg,
                                   seed=mix_seed(cfg.seed, "searcher", 0))
        return {s.group_key: (s.n, round(s.mean, 6), round(s.std, 6)) for s in rows}

    assert stats(outcomes) == published
    assert stats(flipped) != published


def test_duplicate_gives_one_row_and_malformed_goes_to_the_dlq(deployment):
    env, store, services = deployment
    services.start("trainer-searcher", "trainer", "--model", "searcher")
    services.wait_healthy("trainer-searcher")
    queues = Queues(env["MGRPO_QUEUE_PREFIX"])
    bus = KombuBus(env["MGRPO_BROKER_URL"], store, dead_letter_queue_name=queues.dead_letter)
    traj = Trajectory(traj_id="r/q/0/searcher/0", round_id="r", query_id="q", rollout=0,
                      agent="searcher", model="searcher", input_ids=[1, 2],
                      response_mask=[0, 1], old_logprobs=[0.0, -0.3])
    message = TrajectoryMessage(trajectory=traj)
    bus.publish(queues.trainer("searcher"), message)
    bus.publish(queues.trainer("searcher"), message)  # the same message again
    bus.publish(queues.trainer("searcher"), TrajectoryMessage(trajectory=traj))  # new id, same key
    bus.publish_raw(queues.trainer("searcher"), b"{not json")
    wrong = TrajectoryMessage(trajectory=traj.model_copy(update={"traj_id": "x", "model": "coder"}))
    bus.publish(queues.trainer("searcher"), wrong)
    letters: list = []
    assert wait_for(lambda: letters.extend(bus.dead_letters()) or len(letters) >= 2, 60)
    assert store.count_trajectories("r") == 1
    reasons = sorted(letter.reason for letter in letters)
    assert any("undecodable message: payload is not JSON" in r for r in reasons), reasons
    assert any("is of model 'coder', sent to trainer 'searcher'" in r for r in reasons), reasons
    assert all(letter.queue == queues.trainer("searcher") for letter in letters)
    bus.close()


def test_trainer_killed_mid_round_restarts_and_counts_exactly(deployment):
    env, store, services = deployment
    start_system(services, trainers=("planner", "coder"))
    settings, cfg, bus, record = run_round(env, store)
    rid = record.round_id
    # Without the searcher trainer the round cannot end: its trajectories wait in its queue.
    assert wait_for(lambda: store.round_progress(rid).done
                    and {"planner", "coder"} <= store.published_models(rid))
    assert store.get_round(rid).status != "done"
    expected = sum(store.d_counts("searcher"))
    assert expected >= 6
    services.start("trainer-searcher", "trainer", "--model", "searcher")
    assert wait_for(lambda: store.count_trajectories(rid, "searcher") >= 1, 120, poll_s=0.01)
    services.kill("trainer-searcher")  # SIGKILL, mid-ingestion or mid-training
    killed_at = store.count_trajectories(rid, "searcher")
    assert store.get_round(rid).status != "done", "the trainer finished before the kill"
    services.start("trainer-searcher-2", "trainer", "--model", "searcher")
    assert wait_for(lambda: store.get_round(rid).status == "done"), \
        services.log("trainer-searcher-2")[-2000:]
    assert store.count_trajectories(rid, "searcher") == expected  # none lost, none twice
    assert len(store.round_trajectories(rid, "searcher")) == expected
    assert store.published_models(rid) == set(MODELS)
    assert [c.version for c in store.list_checkpoints("searcher")] == [1]
    print(f"killed after {killed_at}/{expected} searcher trajectories were ingested")
    bus.close()


pytestmark = pytest.mark.timeout(400)
