"""mgrpo's OpenAI-compatible server driven by the official ``openai`` client, as a user would:
every bound is a 4xx with OpenAI's error body (never a 5xx), streaming works, and the model
list passes the client's strict parse."""

from __future__ import annotations

import httpx
import openai
import pytest
from serving import running_server

from mgrpo.engines.openai_server import create_app
from mgrpo.engines.torch_engine import TorchEngine

CONTEXT = 256


@pytest.fixture(scope="module")
def served(tiny_dir):
    from mgrpo.models import load_model

    model, tok = load_model(tiny_dir)
    app = create_app(TorchEngine(model, tok), tok, "tiny", max_model_len=CONTEXT)
    with running_server(app) as url:
        yield url, tok


@pytest.fixture
def client(served):
    url, _ = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    yield client
    client.close()


def refused(client, status: int, param: str | None = None, **kwargs) -> dict:
    """The error body of a completions request that must be refused with ``status``."""
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(**{"model": "tiny", "prompt": [[40, 41]], **kwargs})
    assert caught.value.status_code == status, caught.value
    error = caught.value.body if "message" in (caught.value.body or {}) \
        else caught.value.response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def test_models_list_passes_the_clients_strict_parse(client):
    models = client.models.list()
    card = models.data[0]
    assert card.id == "tiny" and card.object == "model" and card.owned_by == "mgrpo"
    assert isinstance(card.created, int) and card.created > 0
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("big")


def test_completion_through_the_client(client):
    out = client.completions.create(model="tiny", prompt=[[40, 41, 42]], max_tokens=4,
                                    temperature=0, logprobs=0, n=2, seed=1)
    assert len(out.choices) == 2 and out.usage.completion_tokens <= 8
    assert out.choices[0].text == out.choices[1].text  # greedy
    assert len(out.choices[0].logprobs.token_logprobs) == len(out.choices[0].logprobs.tokens)
    text = client.completions.create(model="tiny", prompt="hello there", max_tokens=2)
    assert text.choices[0].finish_reason in ("stop", "length")


def test_max_tokens_beyond_the_context_is_400(client):
    error = refused(client, 400, "max_tokens", max_tokens=10**9)
    assert error["code"] == "context_length_exceeded" and str(CONTEXT) in error["message"]
    refused(client, 400, "max_tokens", max_tokens=CONTEXT)  # prompt + completion > context
    refused(client, 400, "max_tokens", max_tokens=0)
    refused(client, 400, "max_tokens", max_tokens=-5)
    # max_tokens=None: up to the context length, accepted
    out = client.completions.create(model="tiny", prompt=[[40] * (CONTEXT - 2)],
                                    max_tokens=None, temperature=0)
    assert out.usage.completion_tokens <= 2


def test_a_10_mb_prompt_is_413(client):
    error = refused(client, 413, prompt="a" * 10_000_000, max_tokens=1)
    assert error["code"] == "request_too_large"
    refused(client, 413, prompt=[[40] * 2_000_000], max_tokens=1)


def test_a_prompt_longer_than_the_context_is_400(client):
    error = refused(client, 400, "prompt", prompt=[[40] * (CONTEXT + 1)], max_tokens=1)
    assert error["code"] == "context_length_exceeded"


def test_token_ids_out_of_the_vocabulary_are_400(client, served):
    _, tok = served
    for bad in (-1, -(2**70), len(tok), 2**70):
        error = refused(client, 400, "prompt", prompt=[[40, bad]], max_tokens=1)
        assert error["code"] == "invalid_token_id" or bad in (-(2**70), 2**70), error
    refused(client, 400, "stop_token_ids", max_tokens=1,
            extra_body={"stop_token_ids": [len(tok) + 7]})
    refused(client, 400, "prompt", prompt=[], max_tokens=1)


def test_numeric_fields_out_of_range_are_400(client):
    refused(client, 400, "seed", seed=2**70, max_tokens=1)
    refused(client, 400, "seed", seed=-(2**70), max_tokens=1)
    refused(client, 400, "temperature", temperature=-1, max_tokens=1)
    refused(client, 400, "temperature", temperature=1e9, max_tokens=1)
    refused(client, 400, max_tokens=1, temperature=1e-30)  # overflow: use 0 for greedy
    refused(client, 400, "top_p", top_p=0, max_tokens=1)
    refused(client, 400, "n", n=10**6, max_tokens=1)
    refused(client, 400, "n", n=0, max_tokens=1)
    refused(client, 400, "logprobs", logprobs=10**6, max_tokens=1)
    refused(client, 400, "top_k", max_tokens=1, extra_body={"top_k": 2**70})
    refused(client, 400, max_tokens=1, presence_penalty=1.0)  # not implemented: refused
    refused(client, 400, max_tokens=1, echo=True)
    refused(client, 400, "n", prompt=[[40]] * 64, n=8, max_tokens=1)  # 512 completions
    # the largest seed still accepted: seed + n - 1 within int64
    out = client.completions.create(model="tiny", prompt=[[40]], seed=2**63 - 2, n=2,
                                    max_tokens=1)
    assert len(out.choices) == 2


def test_stream_sends_server_sent_events(client):
    plain = client.completions.create(model="tiny", prompt=[[40, 41]], max_tokens=5,
                                      temperature=0, n=2)
    chunks = list(client.completions.create(model="tiny", prompt=[[40, 41]], max_tokens=5,
                                            temperature=0, n=2, stream=True,
                                            stream_options={"include_usage": True}))
    texts = {c.choices[0].index: c.choices[0].text for c in chunks if c.choices}
    assert texts == {c.index: c.text for c in plain.choices}
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_errors_have_openais_shape_at_the_http_level(served):
    url, _ = served
    for response in (httpx.post(f"{url}/v1/completions", content=b"{not json",
                                headers={"content-type": "application/json"}),
                     httpx.post(f"{url}/v1/completions", json={"prompt": [[1]], "top_p": 2}),
                     httpx.post(f"{url}/v1/completions", json={"model": "big", "prompt": [1]}),
                     httpx.get(f"{url}/v1/nothing-here"),
                     httpx.post(f"{url}/mgrpo/load_weights", json={"source": "x",
                                                                   "version": 2**70})):
        assert 400 <= response.status_code < 500, response.text
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_stop_text_is_left_out_unless_asked_for(served):
    """As vLLM: the stop token (or stop string) that ended a completion is in its text only
    with include_stop_str_in_output."""
    url, tok = served
    first = httpx.post(f"{url}/v1/completions", json={
        "prompt": [[40, 41, 42]], "max_tokens": 1, "temperature": 0,
        "return_tokens_as_token_ids": True}).json()["choices"][0]
    stop_id = int(first["logprobs"]["tokens"][0].removeprefix("token_id:"))
    piece = tok.decode([stop_id], skip_special_tokens=False)
    assert piece.strip() and "\ufffd" not in piece  # whole characters: the test can tell
    body = {"prompt": [[40, 41, 42]], "max_tokens": 6, "temperature": 0,
            "stop_token_ids": [stop_id], "return_tokens_as_token_ids": True, "logprobs": 0}
    kept = httpx.post(f"{url}/v1/completions",
                      json={**body, "include_stop_str_in_output": True}).json()["choices"][0]
    dropped = httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]
    assert kept["finish_reason"] == dropped["finish_reason"] == "stop"
    assert kept["stop_reason"] == dropped["stop_reason"] == stop_id
    assert kept["text"].endswith(piece) and not dropped["text"].endswith(piece)
    assert kept["logprobs"]["tokens"] == dropped["logprobs"]["tokens"]  # tokens all kept
    by_string = httpx.post(f"{url}/v1/completions", json={
        "prompt": [[40, 41, 42]], "max_tokens": 6, "temperature": 0,
        "stop": [piece]}).json()["choices"][0]
    assert by_string["stop_reason"] == piece and piece not in by_string["text"]
