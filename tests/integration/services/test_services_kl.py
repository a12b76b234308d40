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


def test_round_with_kl_ends_done_and_kl_is_nonzero_after_weights_move(deployment, tmp_path):
    """The scripted policies give every group equal rewards (advantage 0), so only the KL
    term moves weights: the searcher's reference is another tiny model (``ref_path``), the
    planner's and coder's are their starting weights (the default)."""
    from mgrpo.models import TinyModelConfig, init_tiny

    env, store, services = deployment
    other = init_tiny(tmp_path / "ref", TinyModelConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=400, seed=7))
    _edit_config(env, lambda d: (d.update(loss={"kl_coef": 0.5}),
                                 d["models"]["searcher"].update(ref_path=str(other))))
    start_system(services)
    rounds = []
    for _ in range(2):
        settings, cfg, bus, record = run_round(env, store)
        rid = record.round_id
        assert wait_for(lambda rid=rid: store.get_round(rid).status in ("done", "failed"),
                        timeout_s=240.0), \
            f"round {store.get_round(rid).status}:\n" + "\n".join(
                services.log(f"trainer-{m}")[-1500:] for m in ("planner", "searcher", "coder"))
        assert store.get_round(rid).status == "done", store.get_round(rid).error
        rounds.append(store.metrics(cfg.name, rid)[rid])
        bus.close()
    first, second = rounds
    for model in ("planner", "coder"):  # reference = starting weights, no reward signal
        assert first[f"{model}/kl"] == pytest.approx(0.0, abs=1e-7)
        assert second[f"{model}/kl"] == pytest.approx(0.0, abs=1e-7)
        assert first[f"{model}/grad_norm"] == 0.0
    # searcher: far from its reference; the KL gradient moves its weights, so round 1's KL
    # (against the same frozen reference) differs from round 0's
    assert first["searcher/kl"] > 0.01 and first["searcher/grad_norm"] > 0
    assert second["searcher/kl"] > 1e-4 and second["searcher/kl"] != first["searcher/kl"]
    assert second["searcher/loss"] > second["searcher/pg_loss"]
    assert second["searcher/entropy"] > 0
    # the scripted sampler reports -0.5 per token, not the tiny model's logprobs: visible
    assert second["searcher/rollout_logp_diff_mean"] > 1.0
    print("searcher kl", first["searcher/kl"], second["searcher/kl"])


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
    # logged just after the round is marked failed
    assert wait_for(lambda: "marked failed after 3 tries" in services.log("trainer-searcher"), 60)
    assert "try 3/3" in services.log("trainer-searcher")
    assert store.published_models(rid) == set()  # nothing was trained or published
    bus.close()


pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]
