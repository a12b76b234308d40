"""A vLLM worker extension: ``mgrpo_load_weights(folder)`` reloads the running model in place
from a folder's ``*.safetensors``.

It calls the worker's own ``reload_weights`` (vLLM's layer-wise in-place reload, which
re-processes each layer into its kernel format: on CPU the linear weights are repacked, so a
plain ``model.load_weights`` fails with "Attempted to load weight ... into parameter
(torch.Size([0]))"), then re-processes a TIED ``lm_head``: vLLM processes tied parameters for
one parent layer only, and on CPU the ``lm_head`` keeps a packed copy of the OLD embedding
for its matmul, so without this step the logits stay partly old (found by tests/vllm_tier:
max logprob error 0.56 after an SFT step; 1e-6 with it).

Named by ``VLLMEngine`` (``worker_extension_cls``) and by ``vllm serve
--worker-extension-cls mgrpo.engines.vllm_worker_ext.WeightLoader`` (then
``RemoteEngine.load_weights`` calls it through ``/collective_rpc``). Imports only vLLM,
torch and safetensors: it runs inside vLLM's worker processes, in vLLM's venv (``make
vllm-venv`` installs mgrpo there without dependencies).
"""

from __future__ import annotations

from pathlib import Path

EXTENSION = "mgrpo.engines.vllm_worker_ext.WeightLoader"


class WeightLoader:
    def mgrpo_load_weights(self, folder: str) -> int:
        """Load every ``*.safetensors`` of ``folder``; returns how many tensors were read."""
        from safetensors.torch import load_file
        from vllm.config import set_current_vllm_config

        files = sorted(Path(folder).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{folder}: no *.safetensors to load")
        weights = []
        for path in files:
            weights += list(load_file(str(path)).items())
        with set_current_vllm_config(self.vllm_config):
            self.model_runner.reload_weights(weights_iterator=iter(weights))
            model = self.model_runner.get_model()
            lm_head = getattr(model, "lm_head", None)
            embed = getattr(getattr(model, "model", None), "embed_tokens", None)
            if lm_head is not None and embed is not None and lm_head.weight is embed.weight:
                lm_head.quant_method.process_weights_after_loading(lm_head)
        return len(weights)
