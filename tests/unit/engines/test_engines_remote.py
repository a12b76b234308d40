"""RemoteEngine against our own OpenAI-compatible server, served in-process by uvicorn."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from serving import running_server

from mgrpo.engines.base import GenerationRequest, SamplingParams
from mgrpo.engines.openai_server import create_app
from mgrpo.engines.remote import RemoteEngine, RemoteEngineError
from mgrpo.engines.torch_engine import TorchEngine


@pytest.fixture
def served(tiny):
    model, tok = tiny
    engine = TorchEngine(model, tok)
    with running_server(create_app(engine, tok, "tiny")) as url:
        yield engine, url, tok


@pytest.fixture
def served_raw(tiny):
    """The stand-in server reporting T = 1 logprobs, as ``vllm serve`` does by default."""
    model, tok = tiny
    engine = TorchEngine(model, tok)
    with running_server(create_app(engine, tok, "tiny", logprobs_mode="raw_logprobs")) as url:
        yield engine, url, tok


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
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "top_p"


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
    from mgrpo.training.config import ModelConfig, RunConfig

    local, url, _ = served
    store = Store(f"sqlite:///{tmp_path}/stats.db")  # a run with no checkpoint yet
    store.upgrade()
    remote = RemoteEngine(url)
    with torch.no_grad():
        local.model.model.embed_tokens.weight.add_(1.0)  # the served weights drift
    cfg = RunConfig(agents={"planner": "planner"},
                    models={"planner": ModelConfig(path=str(tiny_dir))})
    assert refresh_weights(store, remote, "planner", "run-b", cfg)
    fresh = load_model(tiny_dir)[0].model.embed_tokens.weight
    assert torch.equal(local.model.model.embed_tokens.weight, fresh)  # the folder's, again
    remote.close()
    store.close()


def _teacher_forced(model, completion, temperature):
    from mgrpo.models.logprobs import token_logprobs

    ids = torch.tensor([completion.prompt_ids + completion.completion_ids])
    with torch.no_grad():
        logp = token_logprobs(model, ids, temperature=temperature)[0]
    return logp[len(completion.prompt_ids):].tolist()


def test_recorded_logprobs_are_those_of_the_distribution_sampled(served):
    """At T = 0.5 the recorded logprobs are log_softmax(logits / 0.5) of the sampled tokens
    (what the trainer trains), not the T = 1 ones."""
    local, url, tok = served
    remote = RemoteEngine(url, model="tiny")
    request = GenerationRequest([40, 41, 42, 43], SamplingParams(temperature=0.5,
                                                                 max_new_tokens=6, seed=3))
    got = remote.generate([request])[0]
    assert got.logprobs == pytest.approx(_teacher_forced(local.model, got, 0.5), abs=1e-5)
    assert max(abs(a - b) for a, b in zip(got.logprobs, _teacher_forced(local.model, got, 1.0),
                                          strict=True)) > 1e-3
    remote.close()


def test_a_server_reporting_t1_logprobs_is_refused_when_t_is_not_1(served_raw):
    """vllm serve's default (raw_logprobs) reports T = 1 logprobs whatever the request's T:
    training on them would train a distribution that was not sampled, so RemoteEngine
    refuses, saying how to fix the server. At T = 1 and greedy the two agree: no refusal."""
    local, url, tok = served_raw
    remote = RemoteEngine(url, model="tiny")
    prompt = [40, 41, 42, 43]
    at_one = remote.generate([GenerationRequest(prompt, SamplingParams(max_new_tokens=4,
                                                                       seed=1))])[0]
    assert at_one.logprobs == pytest.approx(_teacher_forced(local.model, at_one, 1.0),
                                            abs=1e-5)
    remote.generate([GenerationRequest(prompt, SamplingParams(temperature=0.0,
                                                              max_new_tokens=4))])
    with pytest.raises(RemoteEngineError, match="logprobs-mode processed_logprobs"):
        remote.generate([GenerationRequest(prompt, SamplingParams(temperature=0.7,
                                                                  max_new_tokens=4, seed=1))])
    remote.close()


def _first_whole_token(remote, prompt) -> tuple[int, str]:
    """The greedy first token after ``prompt`` and its text (whole characters)."""
    got = remote.generate([GenerationRequest(prompt, SamplingParams(temperature=0.0,
                                                                    max_new_tokens=1))])[0]
    assert got.text.strip() and "\ufffd" not in got.text, got.text
    return got.completion_ids[0], got.text


def test_remote_engine_keeps_the_stop_marker_in_the_text(served):
    """The server leaves the stop token's or stop string's text out unless asked
    (include_stop_str_in_output, as vLLM); RemoteEngine asks, so the text ends with the
    marker the agents' parsers look for, as the local engine's does."""
    local, url, tok = served
    remote = RemoteEngine(url, model="tiny")
    prompt = [40, 41, 42, 43]
    token, piece = _first_whole_token(remote, prompt)
    for params in (SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=[token]),
                   SamplingParams(temperature=0.0, max_new_tokens=6, stop=[piece])):
        request = GenerationRequest(prompt, params)
        got, expected = remote.generate([request])[0], local.generate([request])[0]
        assert got.finish_reason == "stop" and got.text.endswith(piece)
        assert (got.text, got.completion_ids) == (expected.text, expected.completion_ids)
    remote.close()


class _DropsStopText(httpx.HTTPTransport):
    """A server that ignores include_stop_str_in_output (the field never reaches ours)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/completions":
            body = json.loads(request.content)
            body.pop("include_stop_str_in_output", None)
            request = httpx.Request(request.method, request.url, json=body)
        return super().handle_request(request)


def test_a_server_that_drops_the_stop_text_is_refused_on_connect(served):
    local, url, tok = served
    remote = RemoteEngine(url, model="tiny")
    remote.client = httpx.Client(base_url=url, transport=_DropsStopText(), timeout=120)
    with pytest.raises(RemoteEngineError, match="include_stop_str_in_output"):
        remote.generate([GenerationRequest([40, 41, 42, 43],
                                           SamplingParams(max_new_tokens=4, seed=0))])
    remote.close()


def test_a_server_that_restarts_costs_retries_not_the_call(monkeypatch):
    """Connection refused twice, then a read timeout, then an answer: the call succeeds after
    backing off 0.25, 0.5, 1 s; a server down for good raises, and the bus calls that
    transient (the message is requeued, not dead-lettered)."""
    from mgrpo.bus.errors import is_transient
    from mgrpo.retry import call_with_backoff

    failures = [httpx.ConnectError("refused"), httpx.ConnectError("refused"),
                httpx.ReadTimeout("slow")]
    body = {"choices": [{"text": "ok", "finish_reason": "stop",
                         "logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-0.5]}}]}

    def handler(request):
        if failures:
            raise failures.pop(0)
        return httpx.Response(200, json=body)

    waits: list[float] = []
    remote = RemoteEngine("http://judge:8000")
    remote.client = httpx.Client(base_url="http://judge:8000",
                                 transport=httpx.MockTransport(handler))
    monkeypatch.setattr("mgrpo.retry._sleep", waits.append)
    (out,) = remote.generate([GenerationRequest([1, 2], SamplingParams(max_new_tokens=1))])
    assert out.completion_ids == [7] and waits == [0.25, 0.5, 1.0]

    def down():
        raise httpx.ConnectError("refused")

    with pytest.raises(httpx.ConnectError) as caught:
        call_with_backoff(down, attempts=3, sleep=waits.append)
    assert is_transient(caught.value) and waits[-2:] == [0.25, 0.5]
    assert is_transient(httpx.ReadTimeout("slow"))
    assert not is_transient(RemoteEngineError("POST -> 400"))


def test_a_server_answering_503_is_a_transient_error():
    """A server starting or overloaded (503): the services requeue the batch
    (mgrpo.bus.errors.is_transient) instead of dead-lettering it."""
    from mgrpo.bus.errors import is_transient
    from mgrpo.engines.remote import RemoteEngineUnavailable

    remote = RemoteEngine("http://vllm:8001")
    remote.client = httpx.Client(base_url="http://vllm:8001", transport=httpx.MockTransport(
        lambda request: httpx.Response(503, text="starting")))
    with pytest.raises(RemoteEngineUnavailable, match="503") as caught:
        remote.generate([GenerationRequest([1, 2], SamplingParams(max_new_tokens=2))])
    assert is_transient(caught.value)
    remote.close()


def test_the_stop_probe_gives_up_after_calls_that_cannot_tell():
    """A model whose greedy tokens never make whole characters cannot show whether the server
    keeps stop text: the probe is retried on the next calls, STOP_PROBE_CALLS in all, not on
    every call of the run."""
    from mgrpo.engines.remote import STOP_PROBE_CALLS

    bodies = []
    answer = {"choices": [{"text": "", "finish_reason": "length", "logprobs": {
        "tokens": ["token_id:7"], "token_logprobs": [-0.5]}}]}

    def handler(request):
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=answer)

    remote = RemoteEngine("http://engine:8001")
    remote.client = httpx.Client(base_url="http://engine:8001",
                                 transport=httpx.MockTransport(handler))
    for _ in range(STOP_PROBE_CALLS + 2):
        remote.generate([GenerationRequest([1, 2], SamplingParams(max_new_tokens=1))])
    probes = [b for b in bodies if b["temperature"] == 0.0]
    assert len(probes) == 2 * STOP_PROBE_CALLS  # 1 token, then 2 (the model stops at 1)
    assert len(bodies) - len(probes) == STOP_PROBE_CALLS + 2
    remote.close()
