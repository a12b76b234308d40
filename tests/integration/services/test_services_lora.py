"""LoRA in distributed mode (issue 12 item 4): the trainer services train and publish
adapter-only checkpoints, and a worker's torch engine loads them into its own LoRA-wrapped
base. Each service its own process on the real RabbitMQ and PostgreSQL; the planner samples
with the varied scripted policy (its rollouts differ in format reward, so the planner's
adapter gets a gradient), the searcher worker with a real TorchEngine."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
import yaml
from test_services_processes import run_round, start_system, wait_for

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(900)]
SPEC = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
# The run id, fixed: the scripted planner's answer is malformed on an odd turn seed, and the
# seeds derive from the round ids, which name the run. With a random run id (the fixture's
# unique name) every query's 2 rollouts scored alike in round 0 about 1 run in 8: advantages
# 0, no gradient, the adapter stayed 0 and the test failed. With this id both rounds have
# queries whose rollouts differ (round 0: 2 of 3, round 1: 1 of 3). The database, queues and
# checkpoint folder are still the test's own.
RUN = "lora-run"


def test_rounds_publish_adapter_checkpoints_that_workers_load(deployment):
    from mgrpo.models.checkpoint import read_checkpoint_dir

    env, store, services = deployment
    services.env["MGRPO_ENGINE"] = "services_testkit:varied_engine"
    path = Path(env["MGRPO_RUN_CONFIG"])
    data = yaml.safe_load(path.read_text())
    data["name"] = RUN
    data["models"]["planner"]["lora"] = SPEC
    data["models"]["searcher"]["lora"] = SPEC
    data["engines"] = {"searcher": "torch"}
    data["loss"] = {"kl_coef": 0.1}
    path.write_text(yaml.safe_dump(data))
    start_system(services)
    searcher_metrics = f"http://127.0.0.1:{services.ports['subagent-searcher']}/metrics"
    rounds = []
    for n in range(2):
        _, cfg, bus, record = run_round(env, store)
        rid = record.round_id
        assert wait_for(lambda rid=rid: store.get_round(rid).status in ("done", "failed"),
                        600), f"round {store.get_round(rid).status}:\n" \
            f"{services.log('trainer-planner')[-3000:]}"
        assert store.get_round(rid).status == "done", store.get_round(rid).error
        rewards: dict[str, set[float]] = {}
        for outcome in store.read_planner_outcomes(rid):
            rewards.setdefault(outcome.query_id, set()).add(outcome.reward)
        # the premise of the gradient checks below (see RUN): some query's rollouts differ
        assert any(len(r) > 1 for r in rewards.values()), (rid, rewards)
        rounds.append(store.metrics(cfg.name, rid)[rid])
        bus.close()
        if n == 0:  # the searcher worker's torch engine loads the adapter at the next round
            assert "mgrpo_subagent_weights_version 0.0" in httpx.get(searcher_metrics).text
    assert wait_for(lambda: "mgrpo_subagent_weights_version 1.0"
                    in httpx.get(searcher_metrics).text), services.log("subagent-searcher")[-3000:]
    assert "Traceback" not in services.log("subagent-searcher")
    states = {}
    for model in ("planner", "searcher", "coder"):
        records = store.list_checkpoints(model)
        assert [c.version for c in records] == [1, 2]
        states[model] = [read_checkpoint_dir(c.uri) for c in records]
    for model in ("planner", "searcher"):
        for state, manifest in states[model]:
            assert manifest["kind"] == "lora" and len(state) == 8
            assert all("lora_A" in k or "lora_B" in k for k in state)
    full = states["coder"][0][1]
    assert full["kind"] == "full"
    size = states["planner"][0][1]["files"]["adapter_model.safetensors"]["size"]
    assert size * 20 < full["files"]["model.safetensors"]["size"]
    # the planner's rollouts differ in reward: its adapter moved (B left 0) and kept moving
    first, second = (s for s, _ in states["planner"])
    b_keys = [k for k in first if "lora_B" in k]
    assert any(first[k].abs().max() > 0 for k in b_keys)
    assert any(not torch.equal(first[k], second[k]) for k in first)
    assert rounds[0]["planner/grad_norm"] > 0
    # reference = the base, adapter disabled: KL 0 at round 0, > 0 once the adapter moved
    assert rounds[0]["planner/kl"] == pytest.approx(0.0, abs=1e-7)
    assert rounds[1]["planner/kl"] > 0
