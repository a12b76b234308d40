"""A three-level hierarchy (planner -> researcher -> searcher, one model per level) through
the services == the same round embedded.

Distributed side, in this process on the real RabbitMQ and a fresh PostgreSQL database: the
planner worker, a sub-agent worker per role (the researcher's delegates: it sends its own
calls to ``subagent.searcher`` and waits for the replies on its own reply queue) and a
trainer per model, started by ``start_round``. Embedded side: ``run_round`` on SQLite with
the same config. Every engine writes scripted turns (:class:`ScriptedTurns`, from the
request's text and seed, in both modes); the real tiny models train on those tokens.

The searcher's answer depends on its request's seed, which the researcher derives from its
own call's seed: so the same tokens in both modes means every depth got embedded mode's
seeds. Compared as the other parity tests do (``parity_kit.assert_rounds_equal``): tokens
and planner outcomes exactly, group statistics within 1e-6, metrics and updated weights
within 1e-5. Also: each model's trainer got only its own role's trajectories (B*K each),
d_k = 1 per rollout for both sub-agent roles, one group statistics row per (model, role,
query) with n = K in the store, and the planner's header lists the researcher only.

Then the same deployment as ``mgrpo up`` starts it (``service_commands``: the planner API, the
planner worker, a worker per sub-agent role, the delegating one without a tool, a trainer per
model), each its own process: a REST query's trace nests the searcher's call under the
researcher's, and a round trains every level."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from parity_kit import assert_rounds_equal, load_bench_round
from queues_cleanup import delete_queues, delete_run_queues
from scripted_turns import TurnEngine

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.config import Settings
from mgrpo.envs import load_benchmark
from mgrpo.services.context import Queues
from mgrpo.services.planner.worker import PlannerRuntime, PlannerWorker
from mgrpo.services.rounds import start_round
from mgrpo.services.subagent.worker import SubagentWorker
from mgrpo.services.trainer.service import TrainerService
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database
from mgrpo.training.config import RunConfig

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]

bench_round = load_bench_round()

B, K = 3, 4
MODELS = ("planner", "researcher", "searcher")
NESTED = {"planner": {"model": "planner", "calls": ["researcher"]},
          "researcher": {"model": "researcher", "calls": ["searcher"]},
          "searcher": "searcher"}
GOLD: dict[str, str] = {}  # question -> answer, for the scripted planner (set by the test)


def _between(text: str, start: str, end: str) -> str:
    return text.rsplit(start, 1)[1].split(end, 1)[0]


def turn(text: str, seed: int) -> str:
    """The scripted turn for a context: the planner delegates the question, then answers by
    the researcher's word; the researcher passes the task on, then returns what came back;
    the searcher finds it or not by its request's seed."""
    if "<|planner|>" in text:
        if "<ret>" not in text.split("<|planner|>", 1)[1]:
            return f"<call>researcher|{_between(text, '<|question|>', '<|planner|>')}</call>"
        question = _between(text, "<|question|>", "<|planner|>")
        found = _between(text, "<ret>", "</ret>") == "found"
        return f"<answer>{GOLD[question] if found else 'x'}</answer>"
    if "<|researcher|>" in text:
        if "<ret>" not in text:
            return f"<call>searcher|{_between(text, '<|task|>', '<|researcher|>')}</call>"
        return f"<return>{_between(text, '<ret>', '</ret>')}</return>"
    return "<return>found</return>" if seed % 3 else "<return>lost</return>"


def ScriptedTurns(tokenizer) -> TurnEngine:  # noqa: N802 - the engine these tests name
    """An engine writing :func:`turn` (logprobs: -1 per token)."""
    return TurnEngine(tokenizer, turn)


def scripted(path: str, device: str):
    """``MGRPO_ENGINE=test_services_nested:scripted``: (model, tokenizer, engine). In a
    service process the planner's answers come from the run config's benchmark."""
    from mgrpo.models import load_tokenizer
    from mgrpo.training.config_files import load_run_config

    if not GOLD and os.environ.get("MGRPO_RUN_CONFIG"):
        bench = load_benchmark(load_run_config(os.environ["MGRPO_RUN_CONFIG"]).bench_dir)
        GOLD.update({q.question: q.answer for q in bench.all_questions})
    tokenizer = load_tokenizer(path)
    return None, tokenizer, ScriptedTurns(tokenizer)


def nested_config(tiny, bench, out_dir) -> RunConfig:
    return RunConfig.model_validate({
        "name": "nested", "seed": 4, "algorithm": "mgrpo", "agents": NESTED,
        "models": {m: {"path": str(tiny), "lr": 1e-2, "micro_batch_size": 8} for m in MODELS},
        "k": K, "d": 1, "queries_per_round": B, "report_to": [],
        "rewards": {"subagent": [0.2, 0.8, 0.0]},
        "sampling": {"planner_max_turns": 2, "subagent_max_turns": 2, "max_new_tokens": 8},
        "stages": [{"stage": 1, "rounds": 1}], "eval_questions": 2,
        "bench_dir": str(bench), "out_dir": str(out_dir)})


def embedded(cfg: RunConfig):
    """Round 0 in this process (``run_round``, SQLite), every engine scripted."""
    from mgrpo.training.loop import run_round, stage_pool
    from mgrpo.training.system import build_system

    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    system = build_system(cfg)
    for runtime in system.runtimes.values():
        runtime.engine = ScriptedTurns(runtime.tokenizer)
    store = Store(f"sqlite:///{cfg.out_dir}/store.db")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    run_round(system, store, cfg.name, 0, stage_pool(system, 0))
    data = bench_round.read_round(store, cfg, f"{cfg.name}-r0000",
                                  f"{cfg.out_dir}/checkpoints")
    store.close()
    return data


def distributed(cfg: RunConfig, postgres_url, rabbitmq_url, prefix: str, workdir):
    """Round 0 through the services; (RoundData, store rows per role)."""
    queues = Queues(f"{prefix}.")
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        settings = Settings(mode="distributed", database_url=url, broker_url=rabbitmq_url,
                            checkpoint_uri=str(workdir / "ckpt"), queue_prefix=queues.prefix,
                            engine="test_services_nested:scripted")
        bus = KombuBus(rabbitmq_url, store, dead_letter_queue_name=queues.dead_letter)
        workers, trainers = [], []
        try:
            workers = [SubagentWorker(settings, cfg, store, bus, "searcher", "search"),
                       SubagentWorker(settings, cfg, store, bus, "researcher", "")]
            for worker in workers:
                worker.start()
            for model in MODELS:
                trainers.append(TrainerService(settings, cfg, store, bus, model))
                trainers[-1].start()
            PlannerWorker(PlannerRuntime.build(settings, cfg, store, bus)).start()
            record = start_round(store, bus, cfg, queues)
            deadline = time.monotonic() + 300
            while (status := store.get_round(record.round_id).status) != "done":
                assert status not in ("failed", "cancelled") and time.monotonic() < deadline, \
                    (status, store.get_round(record.round_id).error)
                time.sleep(0.05)
            data = bench_round.read_round(store, cfg, record.round_id, str(workdir / "ckpt"))
            rows = {
                "trajectories": {m: len(store.round_trajectories(record.round_id, m))
                                 for m in MODELS},
                "agents": {m: sorted({t.agent for t in store.round_trajectories(
                    record.round_id, m)}) for m in MODELS},
                "d": {role: sorted(c.d for c in store.observed_d(record.round_id, role))
                      for role in ("researcher", "searcher")},
                "stats": [(s.model, s.agent, s.n) for s in store.read_group_stats(
                    record.round_id)],
                "calls": {w.name: w.calls_done for w in workers},
                "registered": sorted(a.name for a in store.list_agents()),
                "prompts": {m: store.round_trajectories(record.round_id, m)[0].input_ids
                            for m in ("planner", "researcher")},
            }
        finally:
            for worker in workers:
                worker.stop()
            for trainer in trainers:
                trainer.stop()
            bus.close()
            store.close()
            delete_run_queues(rabbitmq_url, queues, models=MODELS,
                              subagents=("researcher", "searcher"))
    return data, rows


def test_three_levels_through_the_services_equal_embedded(assets, tmp_path, postgres_url,
                                                          rabbitmq_url, unique_name):
    from mgrpo.models import load_model, load_tokenizer

    tiny, bench = assets
    GOLD.update({q.question: q.answer for q in load_benchmark(bench).all_questions})
    emb = embedded(nested_config(tiny, bench, tmp_path / "emb"))
    svc, rows = distributed(nested_config(tiny, bench, tmp_path / "svc-out"), postgres_url,
                            rabbitmq_url, unique_name, tmp_path / "svc")

    # every level played: B*K trajectories per model, each model's only of its own role
    assert rows["trajectories"] == dict.fromkeys(MODELS, B * K)
    assert rows["agents"] == {m: [m] for m in MODELS}
    assert rows["calls"] == {"searcher": B * K, "researcher": B * K}
    assert rows["d"] == {"researcher": [1] * (B * K), "searcher": [1] * (B * K)}
    # per-agent M-GRPO groups in the store: one row per (model, role, query), n = K
    assert sorted(rows["stats"]) == sorted((m, m, K) for m in MODELS for _ in range(B))
    tok = load_tokenizer(tiny)
    planner_header = _between(tok.decode(rows["prompts"]["planner"]), "<|agents|>",
                              "<|question|>")
    assert planner_header == "researcher: researcher"  # its callee only, not the searcher
    assert tok.decode(rows["prompts"]["researcher"]).startswith(
        "<|agents|>searcher: look up facts<|task|>")
    # not trivial: outcomes and so advantages vary at every level, and every model moved
    correct = [c for _, c, _ in emb.outcomes.values()]
    assert len(correct) == B * K and 0 < sum(correct) < B * K
    assert {model for (model, _, _), (_, _, sd) in emb.stats.items() if sd > 0} == set(MODELS)
    initial = load_model(tiny)[0].state_dict()
    for model in MODELS:
        moved = max(float((svc.weights[model][k] - initial[k]).abs().max()) for k in initial)
        assert moved > 1e-4, model
    # the same round: tokens, outcomes, group statistics, metrics and weights
    compared = assert_rounds_equal(emb, svc)
    for must in ("planner/pg_loss", "researcher/pg_loss", "searcher/pg_loss",
                 "researcher/reward_mean", "searcher/d"):
        assert must in compared, sorted(compared)


def test_mgrpo_up_services_play_three_levels_as_processes(deployment, assets, tmp_path,
                                                          rabbitmq_url):
    import httpx
    import yaml

    from mgrpo.cli.up import service_commands
    from mgrpo.services.launcher import free_port

    env, store, services = deployment
    tiny, bench = assets
    cfg = nested_config(tiny, bench, tmp_path / "out")
    path = tmp_path / "nested.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    here = Path(__file__).resolve().parent  # this module (the engine) and what it imports
    services.env.update(MGRPO_RUN_CONFIG=str(path), MGRPO_API_TOKEN="tok",
                        MGRPO_ENGINE="test_services_nested:scripted",
                        PYTHONPATH=os.pathsep.join([str(here), str(here.parents[1]),
                                                    services.env["PYTHONPATH"]]))
    api_port, queues = free_port(), Queues(env["MGRPO_QUEUE_PREFIX"])
    bus = KombuBus(rabbitmq_url, store, dead_letter_queue_name=queues.dead_letter)
    commands = dict(service_commands(str(path), api_port))
    assert commands["subagent-researcher"][:4] == ["serve", "subagent", "--name", "researcher"]
    assert "--tool" not in commands["subagent-researcher"]
    try:
        for name, argv in commands.items():
            services.start(name, *argv[1:], port=api_port if name == "planner" else None)
        for name in commands:
            services.wait_healthy(name)
        assert sorted(a.name for a in store.list_agents()) == ["researcher", "searcher"]
        question = next(q for q in load_benchmark(bench).questions("train", stage=1))
        answer = httpx.post(f"http://127.0.0.1:{api_port}/v1/queries", timeout=120,
                            headers={"Authorization": "Bearer tok"},
                            json={"question": question.question})
        assert answer.status_code == 200, answer.text
        trace = answer.json()["trace"]
        researcher = next(e for e in trace if e.get("agent") == "researcher" and "steps" in e)
        nested = [c for step in researcher["steps"] for c in step.get("calls", ())]
        assert [c["agent"] for c in nested] == ["searcher"]
        assert nested[0]["result"] in ("found", "lost") and nested[0]["format_ok"]
        assert researcher["result"] == nested[0]["result"]
        record = start_round(store, bus, cfg, queues)
        deadline = time.monotonic() + 300
        while (status := store.get_round(record.round_id).status) != "done":
            assert status not in ("failed", "cancelled") and time.monotonic() < deadline, \
                (status, "\n".join(services.log(n)[-1500:] for n in commands))
            time.sleep(0.1)
        rid = record.round_id
        assert {m: sorted({t.agent for t in store.round_trajectories(rid, m)})
                for m in MODELS} == {m: [m] for m in MODELS}
        assert {m: len(store.round_trajectories(rid, m)) for m in MODELS} == \
            dict.fromkeys(MODELS, B * K)
        assert sorted((s.model, s.agent, s.n) for s in store.read_group_stats(rid)) == \
            sorted((m, m, K) for m in MODELS for _ in range(B))
        assert {c.model for c in store.list_checkpoints()} == set(MODELS)
    finally:
        bus.close()
        delete_queues(rabbitmq_url, queues.subagent("researcher"), queues.trainer("researcher"))
