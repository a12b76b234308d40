"""The vLLM tier (``tests/vllm_tier``; not ``tests/vllm``, which would shadow the ``vllm``
package as a namespace package): see ``vllm_process``. The fixtures its modules share: the
tiny model, a VLLMEngine process per module and the torch model beside it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """The tiny Qwen2 (float32) of `mgrpo models init-tiny`, shared by both sides."""
    from mgrpo.models import TinyModelConfig, init_tiny

    return Path(init_tiny(tmp_path_factory.mktemp("tiny"), TinyModelConfig(seed=0)))


@pytest.fixture(scope="module")
def vllm(request, tiny_dir, tmp_path_factory):
    """One VLLMEngine process (``vllm_process.VLLMProcess``) on the tiny model for the test
    module, built with the module's ``VLLM_OPTIONS`` (e.g. ``enable_lora=True``) if it has
    any. Start-up 20-340 s here."""
    from vllm_process import VLLMProcess, print_figure

    options = getattr(request.module, "VLLM_OPTIONS", {})
    proc = VLLMProcess(str(tiny_dir), tmp_path_factory.mktemp("vllm") / "vllm.log",
                       max_model_len=512, seed=0, **options)
    label = "vllm (enable_lora)" if options.get("enable_lora") else "vllm"
    print_figure(f"{label} start-up s", round(proc.ready["load_s"], 1))
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def torch_side(tiny_dir):
    """The torch model on the same weights, per module (a module's last test trains it)."""
    from mgrpo.models import load_model

    model, tok = load_model(tiny_dir)
    model.eval()
    return model, tok
