"""A turn_team round through the services == the same round embedded, on each of the five
worlds.

Distributed side, in this process on the real RabbitMQ and a fresh PostgreSQL database: the
coordinator (``TeamWorker``, on ``planner.episodes``), one ``RoleWorker`` per role (each
samples its role's turns with its own engine) and one ``TrainerService`` per model (two
models: specialised policies), started by ``start_round``. Embedded side: ``run_team_round``
on SQLite with the same config. Compared: every candidate's tokens and turn reward, the
group statistics rows (one per (task, role, team turn)), and the updated weights; each
model's trainer got only its own role's candidates, and its weights changed.

The untrained model's turns earn equal rewards within each group (zero advantages; the
entropy bonus still moves the weights), so one more round on plan_path has its turns
written by a scripted engine (:func:`scripted`, chosen by each request's seed, in both
modes): groups with a reward spread, non-zero advantages per (task, role, turn), the real
models trained on those tokens."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import torch
from queues_cleanup import delete_run_queues
from scripted_turns import TurnEngine
from serving import running_server

from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.config import Settings
from mgrpo.envs.worlds import build_world
from mgrpo.models.checkpoint import load_checkpoint, run_root
from mgrpo.services.api.app import create_app
from mgrpo.services.api.deps import ApiState
from mgrpo.services.context import Queues
from mgrpo.services.planner.team import TeamWorker
from mgrpo.services.rounds import start_round
from mgrpo.services.subagent.role import RoleWorker
from mgrpo.services.trainer.service import TrainerService
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database
from mgrpo.training.config import RunConfig
from mgrpo.training.team_round import build_team_system, run_team_round

WORLDS = ("plan_path", "sudoku4", "sokoban", "coder_tester", "math_team")
B, K = 2, 2
# plan_path turns the scripted engine picks from (by the request's seed)
TOOL_TURNS = ("<tool>print('RRDD')</tool>", "<tool>print(1)</tool>", "nonsense")
PLAN_TURNS = ("<answer>R</answer>", "<answer>D</answer>", "junk", "<answer>RRDD</answer>")


def team_turn(prompt: str, seed: int) -> str:
    """One of the plan_path turns above, chosen by the request's seed."""
    turns = TOOL_TURNS if "You are the tool agent" in prompt else PLAN_TURNS
    return turns[seed % len(turns)]


def ScriptedTurns(tokenizer) -> TurnEngine:  # noqa: N802 - the engine these tests name
    return TurnEngine(tokenizer, team_turn)


def scripted(path: str, device: str):
    """``MGRPO_ENGINE=test_services_team:scripted``: (model, tokenizer, engine)."""
    from mgrpo.models import load_tokenizer

    tokenizer = load_tokenizer(path)
    return None, tokenizer, ScriptedTurns(tokenizer)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from mgrpo.models import TinyModelConfig, init_tiny

    config = TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, intermediate_size=64, vocab_size=400)
    return init_tiny(tmp_path_factory.mktemp("tiny"), config)


def team_config(world: str, model: Path, out_dir: Path) -> RunConfig:
    first, second = build_world(world).roles
    return RunConfig.model_validate({
        "name": f"team-{world}", "seed": 5, "out_dir": str(out_dir), "k": K,
        "queries_per_round": B, "report_to": [], "stages": [{"stage": None, "rounds": 1}],
        "sampling": {"max_new_tokens": 8, "temperature": 1.5},
        # the untrained model's turns mostly earn equal rewards (zero advantages): the
        # entropy bonus makes every update move the weights, so the comparison has teeth
        "loss": {"entropy_coef": 0.01},
        "models": {m: {"path": str(model), "lr": 1e-2} for m in ("ma", "mb")},
        "workflow": {"kind": "turn_team", "world": world, "roles": {first: "ma", second: "mb"},
                     "alpha": 1.0, "max_turns": 2, "train_tasks": 8}})


def round_rows(store, cfg: RunConfig, round_id: str) -> dict:
    trajs = {m: store.round_trajectories(round_id, m) for m in ("ma", "mb")}
    return {
        "trajs": trajs,
        "tokens": {t.traj_id: list(t.input_ids) for ts in trajs.values() for t in ts},
        "rewards": {t.traj_id: t.reward for ts in trajs.values() for t in ts},
        "stats": {(s.model, s.agent, s.group_key): (s.n, s.mean, s.std)
                  for s in store.read_group_stats(round_id) if s.n > 0},
        "metrics": store.metrics(cfg.name, round_id).get(round_id, {}),
    }


def embedded(cfg: RunConfig, script: bool = False) -> tuple[dict, dict]:
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    system = build_team_system(cfg)
    if script:
        for runtime in system.runtimes.values():
            runtime.engine = ScriptedTurns(runtime.tokenizer)
    store = Store(f"sqlite:///{Path(cfg.out_dir).resolve() / 'store.db'}")
    store.upgrade()
    store.create_run(cfg.name, cfg.name, cfg.model_dump(mode="json"))
    pool = system.world.tasks("train", cfg.workflow.train_tasks, cfg.seed)
    run_team_round(system, store, cfg.name, 0, pool)
    rows = round_rows(store, cfg, f"{cfg.name}-r0000")
    weights = {m: {k: v.detach().clone() for k, v in lm.model.state_dict().items()}
               for m, lm in system.models.items()}
    store.close()
    return rows, weights


def distributed(cfg: RunConfig, postgres_url: str, rabbitmq_url: str, prefix: str,
                workdir: Path, engine: str = "torch",
                via_api: bool = False) -> tuple[dict, dict, dict]:
    """The round through the services; ``via_api``: started by ``POST /v1/rounds`` on the
    planner API (which checks every role's worker and model's trainer is alive first)."""
    queues = Queues(f"{prefix}.")
    roles = cfg.flow.roles(cfg)
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        settings = Settings(mode="distributed", database_url=url, broker_url=rabbitmq_url,
                            checkpoint_uri=str(workdir / "ckpt"), queue_prefix=queues.prefix,
                            engine=engine, api_token="team-token")
        bus = KombuBus(rabbitmq_url, store, dead_letter_queue_name=queues.dead_letter)
        trainers, roles_seen = [], {}
        try:
            for role in roles:
                RoleWorker(settings, cfg, store, bus, role).start()
            for model in ("ma", "mb"):
                trainers.append(TrainerService(settings, cfg, store, bus, model))
                trainers[-1].start()
            team = TeamWorker(settings, cfg, store, bus)
            team.start()
            if via_api:  # the API's own bus: the app closes it when it stops
                api_bus = KombuBus(rabbitmq_url, store, dead_letter_queue_name=queues.dead_letter)
                with running_server(create_app(ApiState(settings, cfg, store, api_bus))) as base:
                    posted = httpx.post(f"{base}/v1/rounds", json={}, timeout=60,
                                        headers={"Authorization": "Bearer team-token"})
                    assert posted.status_code == 201, posted.text
                    record = store.get_round(posted.json()["round_id"])
            else:
                record = start_round(store, bus, cfg, queues)
            deadline = time.monotonic() + 120
            while (status := store.get_round(record.round_id).status) != "done":
                assert status not in ("failed", "cancelled") and time.monotonic() < deadline, \
                    (status, store.get_round(record.round_id).error)
                time.sleep(0.05)
            rows = round_rows(store, cfg, record.round_id)
            roles_seen = {m: sorted({t.agent for t in rows["trajs"][m]}) for m in ("ma", "mb")}
            weights = {m: load_checkpoint(run_root(str(workdir / "ckpt"), cfg.name), m,
                                          version=1)[0] for m in ("ma", "mb")}
        finally:
            for trainer in trainers:
                trainer.stop()
            bus.close()
            store.close()
            delete_run_queues(rabbitmq_url, queues, models=("ma", "mb"), subagents=roles)
    return rows, weights, roles_seen


@pytest.mark.parametrize("world", WORLDS)
def test_a_distributed_team_round_equals_embedded(world, tiny_model, tmp_path, postgres_url,
                                                  rabbitmq_url, unique_name):
    spread = compare_modes(world, tiny_model, tmp_path, postgres_url, rabbitmq_url,
                           unique_name)
    print(world, "groups with a reward spread:", spread)


def test_scripted_turns_with_reward_spread_train_alike(tiny_model, tmp_path, postgres_url,
                                                       rabbitmq_url, unique_name):
    """Started through the planner API (``POST /v1/rounds``)."""
    spread = compare_modes("plan_path", tiny_model, tmp_path, postgres_url, rabbitmq_url,
                           unique_name, script=True)
    print("scripted plan_path: groups with a reward spread:", spread)
    assert spread >= 4, spread  # non-zero advantages in both roles' groups


def compare_modes(world, tiny_model, tmp_path, postgres_url, rabbitmq_url, unique_name,
                  script: bool = False) -> int:
    """Play round 0 of ``world`` both ways and assert they agree; returns how many (task,
    role, turn) groups had a reward spread."""
    from mgrpo.models import load_model

    emb, emb_weights = embedded(team_config(world, tiny_model, tmp_path / "emb"), script)
    cfg = team_config(world, tiny_model, tmp_path / "svc-out")
    svc, svc_weights, roles_seen = distributed(
        cfg, postgres_url, rabbitmq_url, unique_name, tmp_path / "svc",
        engine="test_services_team:scripted" if script else "torch", via_api=script)
    first, second = build_world(world).roles
    # each policy's trainer got its own role's candidates only, as many as embedded
    assert roles_seen == {"ma": [first], "mb": [second]}
    assert {m: len(ts) for m, ts in svc["trajs"].items()} == \
        {m: len(ts) for m, ts in emb["trajs"].items()}
    assert len(emb["trajs"]["ma"]) >= B * K and len(emb["trajs"]["mb"]) >= B * K
    # the same candidates, turn rewards and group statistics rows
    assert svc["tokens"] == emb["tokens"]
    assert svc["rewards"] == pytest.approx(emb["rewards"], abs=1e-9)
    assert svc["stats"].keys() == emb["stats"].keys()
    assert all(n == K for n, _, _ in svc["stats"].values())
    for key, (n, mean, std) in emb["stats"].items():
        assert svc["stats"][key] == pytest.approx((n, mean, std), abs=1e-6), key
    for key in ("team/accuracy", "team/team_turns", "rollout/generated_tokens",
                f"{first}/turn_reward_mean", f"{second}/samples", "ma/pg_loss", "mb/pg_loss"):
        assert svc["metrics"][key] == pytest.approx(emb["metrics"][key], abs=1e-5), key
    # the same update, and it moved each model
    initial = load_model(tiny_model)[0].state_dict()
    for model in ("ma", "mb"):
        moved = max(float((svc_weights[model][k] - initial[k]).abs().max()) for k in initial)
        assert moved > 0, model
        for name, tensor in emb_weights[model].items():
            torch.testing.assert_close(svc_weights[model][name], tensor, atol=1e-5, rtol=0,
                                       msg=f"{model}.{name}")
    return sum(sd > 0 for _, _, sd in svc["stats"].values())


def test_a_round_with_no_worker_for_a_role_fails_saying_which(tiny_model, tmp_path,
                                                             postgres_url, rabbitmq_url,
                                                             unique_name):
    """Only the ``tool`` role's worker runs: the coordinator marks the round failed, naming
    the role and how to start its worker, instead of leaving it running."""
    cfg = team_config("plan_path", tiny_model, tmp_path / "out")
    queues = Queues(f"{unique_name}.")
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        settings = Settings(mode="distributed", database_url=url, broker_url=rabbitmq_url,
                            checkpoint_uri=str(tmp_path / "ckpt"), queue_prefix=queues.prefix)
        bus = KombuBus(rabbitmq_url, store, dead_letter_queue_name=queues.dead_letter)
        try:
            RoleWorker(settings, cfg, store, bus, "tool").start()
            TeamWorker(settings, cfg, store, bus).start()
            record = start_round(store, bus, cfg, queues)
            deadline = time.monotonic() + 60
            while store.get_round(record.round_id).status == "running":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            failed = store.get_round(record.round_id)
            assert failed.status == "failed", failed.status
            assert "no worker plays role 'plan'" in failed.error
            assert "mgrpo serve subagent --name plan" in failed.error
        finally:
            bus.close()
            store.close()
            delete_run_queues(rabbitmq_url, queues, models=("ma", "mb"),
                              subagents=("tool", "plan"))
