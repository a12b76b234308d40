"""VLLMEngine: the :class:`Engine` interface over vLLM's offline ``LLM`` (GPU; extra
``mgrpo[vllm]``).

Token-id prompts in, token ids and the sampled tokens' logprobs out. vLLM is asked for
``logprobs=0`` (the sampled token only) with ``logprobs_mode="raw_logprobs"``, i.e. the raw
distribution before temperature/top-k/top-p, the same quantity TorchEngine returns.
``load_weights`` pushes a state dict (or a verified checkpoint) into the running model with
vLLM's ``load_weights`` so no restart is needed between rounds.

What it does NOT do: run without vLLM (importing this module is fine; constructing the engine
raises an ImportError that says how to install it), LoRA hot-swap, or multi-GPU set-up
beyond what ``llm_kwargs`` passes to ``vllm.LLM``. Untested here: no GPU in CI; the tests are
marked ``gpu``.
"""

from __future__ import annotations

from mgrpo.engines.base import Completion, GenerationRequest


class VLLMEngine:
    def __init__(self, model_path: str, version: int = 0, **llm_kwargs):
        try:
            import vllm
        except ImportError as exc:
            raise ImportError("VLLMEngine needs vLLM: pip install 'mgrpo[vllm]' on a CUDA "
                              "machine, or use TorchEngine") from exc
        self._vllm = vllm
        llm_kwargs.setdefault("logprobs_mode", "raw_logprobs")
        self.llm = vllm.LLM(model=model_path, skip_tokenizer_init=False, **llm_kwargs)
        self.version = version

    def _params(self, request: GenerationRequest):
        p = request.params
        return self._vllm.SamplingParams(
            temperature=p.temperature, top_p=p.top_p, top_k=p.top_k if p.top_k > 0 else -1,
            max_tokens=p.max_new_tokens, stop=list(p.stop) or None,
            stop_token_ids=list(p.stop_token_ids) or None, seed=p.seed, logprobs=0,
            include_stop_str_in_output=True)

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
        if isinstance(source, dict):
            state = source
        else:
            from mgrpo.models.checkpoint import read_checkpoint_dir

            state, _ = read_checkpoint_dir(str(source))
        weights = list(state.items())

        def _load(worker_self):  # runs inside each vLLM worker
            worker_self.model_runner.model.load_weights(weights=weights)

        self.llm.collective_rpc(_load)
        self.llm.reset_prefix_cache()
        self.version = version
