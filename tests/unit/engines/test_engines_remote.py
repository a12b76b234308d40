"""RemoteEngine against our own OpenAI-compatible server, served in-process by uvicorn."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import torch
import uvicorn

from mgrpo.engines.base import GenerationRequest, SamplingParams
from mgrpo.engines.openai_server import create_app
from mgrpo.engines.remote import RemoteEngine, RemoteEngineError
from mgrpo.engines.torch_engine import TorchEngine


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def served(tiny):
    model, tok = tiny
    engine = TorchEngine(model, tok)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine, tok, "tiny"), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield engine, f"http://127.0.0.1:{port}", tok
    server.should_exit = True
    thread.join(timeout=10)


def _requests(tok):
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(30, len(tok), (n,), generator=gen).tolist() for n in (2, 9, 5)]
    return [GenerationRequest(p, SamplingParams(temperature=t, top_k=40, max_new_tokens=8,
                                                seed=11 + i, stop=["</tool>"]))
            for i, (p, t) in enumerate(zip(prompts, (0.0, 1.0, 0.8), strict=True))]


def test_remote_engine_returns_what_the_local_engine_returns(served):
    local, url, tok = served
    remote = RemoteEngine(url, model="tiny")
    requests = _requests(tok)
    expected = local.generate(requests)
    got = remote.generate(requests)
    for a, b in zip(expected, got, strict=True):
        assert b.prompt_ids == a.prompt_ids
        assert b.completion_ids == a.completion_ids
        assert b.finish_reason == a.finish_reason
        assert b.text == a.text
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-6)
    remote.close()


def test_server_speaks_openai_completions_shape(served):
    _, url, tok = served
    body = {"model": "tiny", "prompt": [[40, 41, 42]], "max_tokens": 3, "temperature": 0,
            "logprobs": 0, "n": 2}
    data = httpx.post(f"{url}/v1/completions", json=body).json()
    assert data["object"] == "text_completion" and len(data["choices"]) == 2
    choice = data["choices"][0]
    assert len(choice["logprobs"]["token_logprobs"]) == 3
    assert data["usage"]["completion_tokens"] == 6
    text = httpx.post(f"{url}/v1/completions", json={"prompt": "<|task|>add", "max_tokens": 2})
    assert text.status_code == 200
    wrong = httpx.post(f"{url}/v1/completions", json={"model": "big", "prompt": [[1]]})
    assert wrong.status_code == 404 and "not served" in wrong.text
    bad = httpx.post(f"{url}/v1/completions", json={"prompt": [[1]], "top_p": 2})
    assert bad.status_code == 422


def test_remote_load_weights_reaches_the_served_engine(served, tmp_path):
    from mgrpo.models.checkpoint import save_checkpoint

    local, url, _ = served
    uri = save_checkpoint(local.model, str(tmp_path), "p", 2)
    remote = RemoteEngine(url)
    remote.load_weights(uri, version=2)
    assert local.version == 2 and remote.version == 2
    assert httpx.get(f"{url}/mgrpo/version").json() == {"version": 2}
    with pytest.raises(TypeError, match="checkpoint URI"):
        remote.load_weights({}, version=3)
    with pytest.raises(RemoteEngineError, match="400|422"):
        RemoteEngine(url, model="tiny")._one(GenerationRequest([1], SamplingParams(top_p=5)))


def test_refresh_weights_gives_a_remote_engine_the_plain_folder(served, tiny_dir, tmp_path):
    """Before a run's first checkpoint the services load the model's own folder; a remote
    server gets that folder's path (it reads it), not a state dict it could not receive."""
    from mgrpo.models import load_model
    from mgrpo.services.context import refresh_weights
    from mgrpo.store import Store

    local, url, _ = served
    store = Store(f"sqlite:///{tmp_path}/stats.db")  # a run with no checkpoint yet
    store.upgrade()
    remote = RemoteEngine(url)
    with torch.no_grad():
        local.model.model.embed_tokens.weight.add_(1.0)  # the served weights drift
    assert refresh_weights(store, remote, "planner", "run-b",
                           {"models": {"planner": {"path": str(tiny_dir)}}})
    fresh = load_model(tiny_dir)[0].model.embed_tokens.weight
    assert torch.equal(local.model.model.embed_tokens.weight, fresh)  # the folder's, again
    remote.close()
    store.close()
