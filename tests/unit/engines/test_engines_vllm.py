"""VLLMEngine: needs CUDA and vllm; skipped elsewhere (marked gpu)."""

from __future__ import annotations

import pytest
import torch

from mgrpo.engines.base import GenerationRequest, SamplingParams


@pytest.mark.gpu
def test_vllm_logprobs_match_teacher_forced(tiny_dir):
    pytest.importorskip("vllm")
    from mgrpo.engines.vllm_engine import VLLMEngine
    from mgrpo.models import load_model
    from mgrpo.models.logprobs import right_pad, token_logprobs

    engine = VLLMEngine(str(tiny_dir), gpu_memory_utilization=0.2, dtype="float32")
    requests = [GenerationRequest(list(range(30, 30 + n)),
                                  SamplingParams(temperature=1.0, max_new_tokens=8, seed=n))
                for n in (2, 7, 4)]
    outs = engine.generate(requests)
    model, tok = load_model(tiny_dir, device="cuda")
    ids, mask = right_pad([o.prompt_ids + o.completion_ids for o in outs], tok.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(model, ids.cuda(), mask.cuda()).cpu()
    for i, o in enumerate(outs):
        ref = logp[i, len(o.prompt_ids):len(o.prompt_ids) + len(o.completion_ids)]
        assert torch.allclose(torch.tensor(o.logprobs), ref, atol=1e-3)


def test_vllm_engine_without_vllm_says_how_to_install():
    try:
        import vllm  # noqa: F401
    except ImportError:
        from mgrpo.engines.vllm_engine import VLLMEngine

        with pytest.raises(ImportError, match=r"mgrpo\[vllm\]"):
            VLLMEngine("x")
    else:  # pragma: no cover
        pytest.skip("vllm is installed")
