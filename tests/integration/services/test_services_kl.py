"""KL to a reference and failing rounds in distributed mode (issue 10 item 1), each service
its own process on the real RabbitMQ and PostgreSQL; scripted policies in the workers, real
tiny models (and real updates) in the trainers."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml
from test_services_processes import run_round, start_system, wait_for

from mgrpo.services.launcher import free_port


def _edit_config(env, update) -> None:
    path = Path(env["MGRPO_RUN_CONFIG"])
    data = yaml.safe_load(path.read_text())
    update(data)
    path.write_text(yaml.safe_dump(data))


def test_round_with_kl_ends_done_and_kl_is_nonzero_after_weights_move(deployment):
    env, store, services = deployment
    _edit_config(env, lambda d: d.update(loss={"kl_coef": 0.1}))
    start_system(services)
    rounds = []
    for _ in range(2):
        settings, cfg, bus, record = run_round(env, store)
        rid = record.round_id
        assert wait_for(lambda rid=rid: store.get_round(rid).status in ("done", "failed")), \
            f"round {store.get_round(rid).status}:\n{services.log('trainer-searcher')[-3000:]}"
        assert store.get_round(rid).status == "done", store.get_round(rid).error
        rounds.append(store.metrics(cfg.name, rid)[rid])
        bus.close()
    first, second = rounds
    moved = [m for m in ("planner", "searcher", "coder") if first[f"{m}/grad_norm"] > 0]
    assert moved, first
    for model in ("planner", "searcher", "coder"):
        # round 0 trains at the reference (= the starting weights): KL exactly 0
        assert first[f"{model}/kl"] == pytest.approx(0.0, abs=1e-7)
        assert second[f"{model}/entropy"] > 0
    for model in moved:  # updated in round 0: round 1 starts away from the reference
        assert second[f"{model}/kl"] > 1e-6, (model, second)
    # the scripted sampler reports -0.5 per token, not the tiny model's logprobs: visible
    assert second["searcher/rollout_logp_diff_mean"] > 1.0
    print({m: second[f"{m}/kl"] for m in moved})


def test_round_that_cannot_train_fails_with_the_reason(deployment):
    env, store, services = deployment
    missing = Path(env["MGRPO_CHECKPOINT_URI"]).parent / "no-such-reference"
    _edit_config(env, lambda d: (d.update(loss={"kl_coef": 0.1}),
                                 d["models"]["searcher"].update(ref_path=str(missing))))
    api_port = free_port()
    start_system(services, trainers=("searcher",))
    services.start("planner", "planner", "--port", str(api_port), port=api_port)
    services.wait_healthy("planner")
    settings, cfg, bus, record = run_round(env, store)
    rid = record.round_id
    assert wait_for(lambda: store.get_round(rid).status == "failed", 240), \
        f"round {store.get_round(rid).status}:\n{services.log('trainer-searcher')[-3000:]}"
    summary = httpx.get(f"http://127.0.0.1:{api_port}/v1/rounds/{rid}", timeout=10).json()
    assert summary["status"] == "failed"
    assert summary["error"].startswith("trainer searcher: ModelLoadError: model folder")
    assert str(missing) in summary["error"] and "does not exist" in summary["error"]
    log = services.log("trainer-searcher")
    assert "marked failed after 3 tries" in log and "try 3/3" in log
    assert store.published_models(rid) == set()  # nothing was trained or published
    bus.close()


pytestmark = pytest.mark.timeout(600)
