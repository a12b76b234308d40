"""TorchEngine: batched sampling with a KV cache on a transformers causal LM (CPU or CUDA).

The hot path of training: thousands of short multi-turn generations. Per call to
:meth:`TorchEngine.generate`:

1. requests are sorted by prompt length and cut into batches of ``max_batch_size`` (less
   padding); results come back in request order;
2. each batch is LEFT-padded; ``position_ids = cumsum(attention_mask) - 1`` so every row's
   first real token is at position 0, exactly as in an unpadded forward pass;
3. one prefill pass (the model's forward) fills the KV cache; then one token per step for
   every live row: for Qwen2/Llama-shaped models on a static, pre-allocated cache
   (:class:`mgrpo.engines.decoders.StaticDecoder`, ``static_cache=True``, the default),
   otherwise through the model's forward pass on a ``DynamicCache``;
4. a row stops at one of its ``stop_token_ids``, at the tokenizer's eos (``stop_at_eos``), when
   its decoded tail contains one of its ``stop`` strings (the stop text is kept), or at its
   ``max_new_tokens`` (finish_reason "length"). Finished rows are dropped from the cache
   so the batch shrinks; the loop exits when no row is left.

Logprobs: ``log_softmax(logits / T)`` at the chosen token, T the row's sampling temperature
(T = 1 for greedy rows), before top-k/top-p: the quantity a teacher-forced pass at the same
temperature computes (``mgrpo.models.logprobs.token_logprobs(..., temperature=T)``), which is
what the trainer trains. They are NOT renormalised over a top-k/top-p set (the run config
refuses those for training, see ``mgrpo.training.config.SamplingConfig``).

Seeds: see :mod:`mgrpo.engines.sampling` (one generator per request; a batch draws each row's
uniforms at its start, :func:`~mgrpo.engines.sampling.draw_uniforms`). Without top-k/top-p
the draw skips the vocabulary sort (``sort_free=True``, the default; ``False`` gives the
sorted inverse CDF, same distribution, other tokens for a seed).

What it does NOT do: continuous batching (a batch runs to its end), prefix caching across
calls, speculative decoding, or beam search.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mgrpo.engines.base import Completion, GenerationRequest, SamplingParams
from mgrpo.engines.decoders import make_decoder
from mgrpo.engines.sampling import (
    RowSampling,
    draw_uniforms,
    hits_stop_string,
    make_generator,
    stop_window,
)
from mgrpo.models.lora import is_lora_model, load_adapter_state, load_base_state
from mgrpo.models.weights_read import read_weights


@dataclass
class _Row:
    """Mutable generation state of one request."""

    request: GenerationRequest
    generator: torch.Generator
    stop_ids: set[int]
    window: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None


class TorchEngine:
    """The default :class:`~mgrpo.engines.base.Engine`: transformers + PyTorch."""

    def __init__(self, model, tokenizer, device: str = "cpu", max_batch_size: int = 64,
                 stop_at_eos: bool = True, version: int = 0, sort_free: bool = True,
                 static_cache: bool = True, compile_options: dict | None = None):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size={max_batch_size} must be >= 1")
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.stop_at_eos = stop_at_eos
        self.version = version
        self.sort_free = sort_free  # see mgrpo.engines.sampling.sample_next
        self.static_cache = static_cache  # see mgrpo.engines.decoders.StaticDecoder
        self.compile_options = compile_options  # torch.compile of the static decode step
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
            else tokenizer.eos_token_id
        self.refusal: str | None = None  # set by refuse_generation

    # -- public API -------------------------------------------------------------------------
    def refuse_generation(self, reason: str) -> None:
        """From now on :meth:`generate` raises ``RuntimeError(reason)`` (a model this process
        cannot run alone, e.g. sharded over several ranks); weights still load."""
        self.refusal = reason

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """Sample completions for ``requests``; returns one :class:`Completion` per request."""
        if self.refusal is not None:
            raise RuntimeError(self.refusal)
        for i, req in enumerate(requests):
            if not req.prompt_ids:
                raise ValueError(f"request {i} has an empty prompt; give at least one token id")
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        results: list[Completion | None] = [None] * len(requests)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start:start + self.max_batch_size]
            for index, completion in zip(chunk, self._generate_batch(
                    [requests[i] for i in chunk]), strict=True):
                results[index] = completion
        return results  # type: ignore[return-value]

    def load_weights(self, source, version: int) -> None:
        """Load a state dict (copied in place into the parameters), or a checkpoint version
        directory (path or fsspec URI; ``mgrpo.models.weights_read.read_weights``: the weights
        file once, crc32-checked, as views of the bytes read). A LoRA
        (peft) model takes an adapter checkpoint into its adapter, and full weights into its
        base with the adapter reset (``mgrpo.models.lora.load_base_state``)."""
        if isinstance(source, dict):
            state = source
        else:
            state, manifest = read_weights(str(source))
            if manifest.get("kind") == "lora":
                load_adapter_state(self.model, state)
                self.version = version
                return

        if is_lora_model(self.model):  # full weights: the base's, with the adapter reset
            load_base_state(self.model, state)
            self.version = version
            return
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        tied = set(getattr(self.model, "_tied_weights_keys", None) or [])
        if unexpected or set(missing) - tied:
            raise ValueError(f"weights do not fit the model: missing={sorted(missing)[:5]} "
                             f"unexpected={sorted(unexpected)[:5]}; load a checkpoint of the "
                             "same architecture")
        self.version = version

    # -- internals ---------------------------------------------------------------------------
    def _new_row(self, req: GenerationRequest) -> _Row:
        stop_ids = set(req.params.stop_token_ids)
        if self.stop_at_eos and self.tokenizer.eos_token_id is not None:
            stop_ids.add(self.tokenizer.eos_token_id)
        return _Row(req, make_generator(req.params.seed, self.device), stop_ids,
                    stop_window(req.params.stop))

    def _left_pad(self, rows: list[_Row]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r.request.prompt_ids) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r.request.prompt_ids)
            ids[i, width - n:] = torch.tensor(r.request.prompt_ids, dtype=torch.long)
            mask[i, width - n:] = 1
        return ids.to(self.device), mask.to(self.device)

    def _record(self, row: _Row, token: int, logprob: float) -> None:
        """Append one token to a row and decide whether the row is finished."""
        row.tokens.append(token)
        row.logprobs.append(logprob)
        params: SamplingParams = row.request.params
        stopped = token in row.stop_ids or (params.stop and hits_stop_string(
            self.tokenizer.decode(row.tokens[-row.window:], skip_special_tokens=False),
            params.stop))
        if stopped:
            row.finish_reason = "stop"
        elif len(row.tokens) >= params.max_new_tokens:
            row.finish_reason = "length"

    @torch.inference_mode()
    def _generate_batch(self, requests: list[GenerationRequest]) -> list[Completion]:
        rows = [self._new_row(r) for r in requests]
        live = [r for r in rows if r.request.params.max_new_tokens > 0]
        for r in rows:
            if r.request.params.max_new_tokens <= 0:
                r.finish_reason = "length"
        if live:
            self._decode_loop(live)
        return [Completion(prompt_ids=list(r.request.prompt_ids), completion_ids=r.tokens,
                           logprobs=r.logprobs,
                           text=self.tokenizer.decode(r.tokens, skip_special_tokens=False),
                           finish_reason=r.finish_reason or "length") for r in rows]

    def _decode_loop(self, live: list[_Row]) -> None:
        input_ids, mask = self._left_pad(live)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
        steps = [r.request.params.max_new_tokens for r in live]
        decoder = make_decoder(self.model, len(live), input_ids.shape[1], max(steps),
                               static=self.static_cache,
                               compile_options=self.compile_options)
        logits = decoder.prefill(input_ids, mask, positions)
        # per-row constants and every row's uniforms, built once per batch (not per token)
        sampling = RowSampling([r.request.params for r in live], logits.shape[-1],
                               self.device, self.sort_free)
        uniforms = None if sampling.all_greedy else draw_uniforms(
            [r.generator for r in live], steps, self.device)
        step = 0
        while True:
            tokens, scaled = sampling.draw(logits, None if uniforms is None
                                           else uniforms[:, step])
            logp = scaled.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(scaled, -1)
            for row, tok, lp in zip(live, tokens.tolist(), logp.tolist(), strict=True):
                self._record(row, tok, lp)
            keep = [i for i, r in enumerate(live) if r.finish_reason is None]
            if not keep:
                return
            if len(keep) < len(live):  # shrink the batch: finished rows cost nothing more
                index = torch.tensor(keep, device=self.device)
                decoder.select(index)
                sampling.select(index)
                tokens = tokens[index]
                uniforms = None if uniforms is None else uniforms[index]
                live = [live[i] for i in keep]
            logits = decoder.step(tokens)
            step += 1
