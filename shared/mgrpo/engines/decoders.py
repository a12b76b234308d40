"""Decode state of one batch: a static KV cache for Llama/Qwen2-shaped models, or transformers' own.

:class:`StaticDecoder` is TorchEngine's fast path; :class:`DynamicDecoder` (the model's own
forward pass on a ``DynamicCache``) serves every other model and is the tests' reference.

Why: at small model sizes a transformers forward pass for ONE new token per row is bound by
per-op Python and dispatch overhead (mask building, cache objects, output dataclasses, a
``torch.cat`` per layer per step to grow the cache), not by arithmetic. StaticDecoder runs the
same computation in fewer ops:

- one KV cache tensor per layer, allocated once per batch at its final length
  (prompt width + the batch's largest ``max_new_tokens``); a step writes one column in place
  (no concatenation, no new cache tensors); keys are stored transposed (B, kv heads, d, L).
  The memory of the longest possible cache is taken at the start, even when every row stops
  early (a ``DynamicCache`` grows only as far as the rows go);
- the rotary cos/sin table is built once per batch by the model's own rotary module
  (``model.model.rotary_emb``), then indexed per step;
- rotary embedding on queries and keys at once: with fused weights the q/k projection also
  outputs ``rotate_half(x)`` (rows permuted and negated, one matmul), then
  ``x * cos + rotate_half(x) * sin``; unfused, ``x * cos + roll(x, d/2) * sin`` with sin's
  first half negated (the same numbers);
- grouped-query attention without repeating the cache: ``baddbmm(mask, q, K^T)`` with the
  queries viewed as (batch * kv heads, group, d), softmax, ``bmm`` with V; pad columns get an
  additive ``-inf``; columns after the current one are not read (the cache is sliced);
- for models of at most 256 MiB of parameters (:data:`FUSE_MAX_BYTES`), the layers' weights
  are copied once per batch, transposed for ``mm``/``addmm`` (residual adds folded in), q/k/v
  (+ the rotate_half images of q and k) in one matrix and gate/up in one: one matmul instead
  of three and one instead of two; larger models read each module's weight.

The prefill (the prompt) still goes through the model's own forward pass; its cache is then
copied into the static one. Weights are read from the modules when a batch starts (fused
copies) or at each step: a change between ``generate`` calls (an optimizer step,
``load_state_dict``) is always seen; a change DURING a call is not, for fused weights.
Forward hooks run on the embedding and ``lm_head`` modules only (the layers' linear maps are
called as functions).

Numerics: the same operations in float32 up to the order of floating-point reductions
(logits within ~1e-6 of the transformers forward pass here;
``tests/unit/engines/test_engines_decoders.py`` asserts 1e-4 on logits and 1e-5 on the
engine's logprobs, and identical tokens for the same seeds). A sampled or greedy token can
differ only where the draw or the argmax falls within that distance of a boundary.

What it does NOT do: sliding-window layers, rope types that depend on the sequence length
(``dynamic``, ``longrope``), q/k norms (Qwen3), biases on o_proj or the MLP, activations other
than SiLU, peft (LoRA) models; :func:`unsupported_reason` names the first of these a model
has, and :func:`make_decoder` then gives a DynamicDecoder. The decode step runs eagerly
unless ``compile_options`` are given (``torch.compile`` of the step; CUDA graphs with
``mode="reduce-overhead"``; measured by ``bench/gpu.py``); the prefill is never compiled.
"""

from __future__ import annotations

import torch

from mgrpo.models.lora import is_lora_model

_MODEL_TYPES = {"qwen2", "llama"}
_STATIC_ROPE = {"default", "linear", "llama3"}


def unsupported_reason(model) -> str | None:
    """None when :class:`StaticDecoder` can run ``model``; otherwise why not (one line)."""
    if is_lora_model(model):
        return "a peft (LoRA) model"
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in _MODEL_TYPES:
        return f"model_type {getattr(config, 'model_type', None)!r} is not one of " \
               f"{sorted(_MODEL_TYPES)}"
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return "sliding-window layers"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    inner = getattr(model, "model", None)
    rope = getattr(getattr(inner, "rotary_emb", None), "rope_type", None)
    if rope not in _STATIC_ROPE:
        return f"rope type {rope!r}"
    attn = inner.layers[0].self_attn
    if getattr(attn, "q_norm", None) is not None or attn.o_proj.bias is not None:
        return "q/k norms or an o_proj bias"
    if inner.layers[0].mlp.gate_proj.bias is not None:
        return "MLP biases"
    return None


def _rms_norm(x: torch.Tensor, norm) -> torch.Tensor:
    """transformers' RMSNorm (Qwen2RMSNorm / LlamaRMSNorm): in float32 ``F.rms_norm`` (one
    call), other dtypes op for op (normalised in float32, cast, then scaled)."""
    if x.dtype == torch.float32:
        return torch.nn.functional.rms_norm(x, norm.weight.shape, norm.weight,
                                            norm.variance_epsilon)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _rotate_rows(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Rows (or entries) of a q/k projection such that ``x @ result.T`` is transformers'
    ``rotate_half`` of ``x @ w.T``, per head: (-second half, first half)."""
    heads = w.reshape(-1, head_dim, *w.shape[1:])
    half = head_dim // 2
    return torch.cat([-heads[:, half:], heads[:, :half]], dim=1).reshape(w.shape)


def _fuse(layer, head_dim: int) -> dict[str, torch.Tensor | None]:
    """Transposed, contiguous copies of one layer's weights for ``mm``/``addmm``: q, k, v and
    the rotate_half images of q and k in one matrix (the rotary embedding then needs no
    roll), gate and up in one, o and down alone."""
    attn, mlp = layer.self_attn, layer.mlp
    q, k, v = attn.q_proj, attn.k_proj, attn.v_proj
    weights = [q.weight, k.weight, v.weight, _rotate_rows(q.weight, head_dim),
               _rotate_rows(k.weight, head_dim)]
    bias = None if q.bias is None else torch.cat(
        [q.bias, k.bias, v.bias, _rotate_rows(q.bias, head_dim), _rotate_rows(k.bias, head_dim)])
    return {"qkv": torch.cat(weights).t().contiguous(), "qkv_bias": bias,
            "o": attn.o_proj.weight.t().contiguous(),
            "gate_up": torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t().contiguous(),
            "down": mlp.down_proj.weight.t().contiguous()}


class StaticDecoder:
    """Decode state of one batch: a KV cache per layer sized for the whole batch.

    ``prefill`` runs the prompt (left-padded ids, mask, positions) through the model and
    returns the last position's logits (B, V); each ``step(tokens)`` appends one token per row
    and returns the next logits; ``select(index)`` keeps only the given rows.
    """

    def __init__(self, model, batch: int, prompt_width: int, max_new_tokens: int,
                 fuse: bool = True, compile_options: dict | None = None):
        self.model = model
        inner = model.model
        config = model.config
        self.layers = list(inner.layers[: config.num_hidden_layers])
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.groups = self.heads // self.kv_heads
        self.length = prompt_width + max_new_tokens
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        # keys transposed, (B, kv heads, d, L): the score matmul then reads them as they lie
        self.keys = [torch.zeros((batch, self.kv_heads, self.head_dim, self.length),
                                 device=self.device, dtype=self.dtype) for _ in self.layers]
        self.values = [torch.zeros((batch, self.kv_heads, self.length, self.head_dim),
                                   device=self.device, dtype=self.dtype) for _ in self.layers]
        self.fused = [_fuse(layer, self.head_dim) for layer in self.layers] if fuse else None
        # rotary table for positions 0 .. length-1, from the model's own module
        positions = torch.arange(self.length, device=self.device)[None, :]
        cos, sin = inner.rotary_emb(self.values[0][:1, 0], positions)  # (1, length, d)
        half = self.head_dim // 2
        self.cos = cos[0]
        # the fused q/k weights already give rotate_half(x) (its sign included); the unfused
        # path rolls x, so its sin carries rotate_half's sign: (-sin first half, sin second)
        self.sin = sin[0] if self.fused is not None else torch.cat(
            [-sin[0, :, :half], sin[0, :, half:]], dim=-1)
        self.bias = torch.zeros((batch, self.length), device=self.device, dtype=self.dtype)
        self.column = 0  # next cache column to write (the same for every row)
        self.positions = torch.zeros(batch, dtype=torch.long, device=self.device)
        self._compiled, self._column = None, None  # the compiled step and its (1,) column
        if compile_options is not None:
            self._compiled = torch.compile(self._fixed_shape_step, **compile_options)

    def prefill(self, input_ids: torch.Tensor, mask: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
        """Run the left-padded prompts (B, W); returns each row's last logits (B, V).

        Packed: the token-wise maps (norms, projections, MLP) run on the N real tokens only,
        not on B * W padded places; only attention uses the padded (B, W) layout."""
        batch, width = input_ids.shape
        d, nh, nkv = self.head_dim, self.heads, self.kv_heads
        rows, cols = mask.nonzero(as_tuple=True)  # (N,) each: row-major, so a row's last
        last = mask.sum(-1).cumsum(0) - 1  # real token is at these packed indices
        pos = positions[rows, cols]
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]  # (N, 1, d)
        # (B, 1, W, W) mask: causal, real keys only; a pad query sees itself (no row without
        # a key, no NaN; its output is never read)
        allowed = torch.ones((width, width), dtype=torch.bool, device=self.device).tril()
        allowed = (allowed & mask.bool()[:, None, :]) | torch.eye(
            width, dtype=torch.bool, device=self.device)
        allowed = allowed[:, None]  # (B, 1, W, W)
        h = self.model.model.embed_tokens(input_ids[rows, cols])  # (N, hidden)
        for i in range(len(self.layers)):
            q, k, v = self._qkv(i, h, cos, sin)  # (N, heads, d)
            self.keys[i][rows, :, :, cols] = k  # keys transposed: (B, nkv, d, L)
            self.values[i][rows, :, cols] = v
            padded = q.new_zeros((batch, width, nh, d))
            padded[rows, cols] = q
            keys = self.keys[i][..., :width].transpose(-1, -2)  # (B, nkv, W, d)
            values = self.values[i][:, :, :width]
            if nkv != nh:  # repeated: SDPA's enable_gqa takes a slower path on CPU
                keys = keys.repeat_interleave(self.groups, dim=1)
                values = values.repeat_interleave(self.groups, dim=1)
            ctx = torch.nn.functional.scaled_dot_product_attention(
                padded.transpose(1, 2), keys, values, attn_mask=allowed,
                scale=self.scaling)  # (B, nh, W, d)
            h = self._finish_layer(i, h, ctx.transpose(1, 2)[rows, cols].reshape(-1, nh * d))
        # pads never get attention; a step reads columns up to its own (sliced), never later
        self.bias[:, :width].masked_fill_(mask == 0, float("-inf"))
        self.column = width
        self.positions = positions[:, -1] + 1
        return self.model.lm_head(_rms_norm(h[last], self.model.model.norm))

    def select(self, index: torch.Tensor) -> None:
        """Keep only the rows in ``index`` (finished rows leave the batch)."""
        self.keys = [k.index_select(0, index) for k in self.keys]
        self.values = [v.index_select(0, index) for v in self.values]
        self.bias = self.bias.index_select(0, index)
        self.positions = self.positions.index_select(0, index)
        if self._compiled is not None:  # new tensors: new addresses (a new graph)
            self._mark_static()

    def _qkv(self, i: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer i's queries, keys (rotary applied) and values for tokens h (N, hidden):
        (N, heads, d), (N, kv heads, d), (N, kv heads, d)."""
        layer, n = self.layers[i], h.shape[0]
        d, nh, nkv = self.head_dim, self.heads, self.kv_heads
        attn, linear = layer.self_attn, torch.nn.functional.linear
        x = _rms_norm(h, layer.input_layernorm)
        if self.fused is not None:
            w = self.fused[i]
            out = torch.mm(x, w["qkv"]) if w["qkv_bias"] is None else torch.addmm(
                w["qkv_bias"], x, w["qkv"])
            qk, v, rotated = out.split([(nh + nkv) * d, nkv * d, (nh + nkv) * d], dim=1)
            qk = qk.view(n, nh + nkv, d) * cos + rotated.view(n, nh + nkv, d) * sin
            q, k = qk.split([nh, nkv], dim=1)
            return q, k, v.view(n, nkv, d)
        qk = torch.cat([linear(x, attn.q_proj.weight, attn.q_proj.bias),
                        linear(x, attn.k_proj.weight, attn.k_proj.bias)],
                       dim=-1).view(n, nh + nkv, d)
        v = linear(x, attn.v_proj.weight, attn.v_proj.bias).view(n, nkv, d)
        qk = qk * cos + qk.roll(d // 2, -1) * sin  # rotary on queries and keys at once
        q, k = qk.split([nh, nkv], dim=1)
        return q, k, v

    def _finish_layer(self, i: int, h: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, norm, MLP, residual: h (N, hidden), ctx (N, nh*d)."""
        layer, linear = self.layers[i], torch.nn.functional.linear
        if self.fused is not None:
            w = self.fused[i]
            h = torch.addmm(h, ctx, w["o"])
            gate, up = torch.mm(_rms_norm(h, layer.post_attention_layernorm),
                                w["gate_up"]).chunk(2, dim=-1)
            return torch.addmm(h, torch.nn.functional.silu(gate) * up, w["down"])
        mlp = layer.mlp
        h = h + linear(ctx, layer.self_attn.o_proj.weight)
        x = _rms_norm(h, layer.post_attention_layernorm)
        gate, up = linear(x, mlp.gate_proj.weight), linear(x, mlp.up_proj.weight)
        return h + linear(torch.nn.functional.silu(gate) * up, mlp.down_proj.weight)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append ``tokens`` (B,) at each row's next position; returns logits (B, V)."""
        if self.column >= self.length:
            raise ValueError(f"static cache full ({self.length} columns); size it for the "
                             "batch's largest max_new_tokens")
        if self._compiled is None:
            logits = self._decode_step(tokens, self.column)
            self.positions = self.positions + 1
        else:
            if self._column is None:
                self._mark_static()
            logits = self._compiled(tokens, self._column, self.positions)
            self._column.add_(1)
            self.positions.add_(1)
        self.column += 1
        return logits

    def _mark_static(self) -> None:
        """The compiled step's inputs at fixed addresses (written in place every step), so a
        CUDA graph (``mode="reduce-overhead"``) replays over them instead of being skipped."""
        self._column = torch.tensor([self.column], device=self.device)
        self.positions = self.positions.clone()
        for tensor in (*self.keys, *self.values, self.bias, self.cos, self.sin,
                       self._column, self.positions):
            torch._dynamo.mark_static_address(tensor)

    def _fixed_shape_step(self, tokens: torch.Tensor, column: torch.Tensor,
                          positions: torch.Tensor) -> torch.Tensor:
        """:meth:`_decode_step` with shapes that do not change from step to step (what
        ``compile_options`` compile: one graph for every step): the column is a (1,) tensor,
        the cache is written with ``index_copy_`` and attention reads all L columns, those
        after ``column`` masked with -inf (they add exactly 0). Same numbers up to the order
        of the softmax's sums."""
        batch = tokens.shape[0]
        d, nh, nkv, length = self.head_dim, self.heads, self.kv_heads, self.length
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        rows, groups = batch * nkv, self.groups
        future = torch.arange(length, device=self.device) > column  # (L,)
        bias = self.bias.masked_fill(future, float("-inf"))[:, None, None, :].expand(
            batch, nkv, 1, length).reshape(rows, 1, length)
        h = self.model.model.embed_tokens(tokens)
        for i in range(len(self.layers)):
            q, k, v = self._qkv(i, h, cos, sin)
            self.keys[i].index_copy_(3, column, k[..., None])
            self.values[i].index_copy_(2, column, v[:, :, None])
            scores = torch.baddbmm(bias, q.reshape(rows, groups, d),
                                   self.keys[i].view(rows, d, length), alpha=self.scaling)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
            ctx = torch.bmm(probs, self.values[i].view(rows, length, d))
            h = self._finish_layer(i, h, ctx.view(batch, nh * d))
        return self.model.lm_head(_rms_norm(h, self.model.model.norm))

    def _decode_step(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        """:meth:`step`'s arithmetic at cache column ``t``."""
        batch = tokens.shape[0]
        d, nh, nkv = self.head_dim, self.heads, self.kv_heads
        cos = self.cos[self.positions][:, None, :]  # (B, 1, d)
        sin = self.sin[self.positions][:, None, :]
        rows, groups = batch * nkv, self.groups
        # (B * nkv, 1, T): the additive mask, one copy per step shared by every layer
        bias = self.bias[:, None, None, : t + 1].expand(batch, nkv, 1, t + 1).reshape(
            rows, 1, t + 1)
        h = self.model.model.embed_tokens(tokens)  # (B, hidden)
        for i in range(len(self.layers)):
            q, k, v = self._qkv(i, h, cos, sin)
            self.keys[i][:, :, :, t].copy_(k)  # keys stored transposed: (B, nkv, d, L)
            self.values[i][:, :, t].copy_(v)
            # (B * nkv, groups, T) = bias + scaling * q k^T; the cache slices are views
            scores = torch.baddbmm(bias, q.reshape(rows, groups, d),
                                   self.keys[i][:, :, :, : t + 1].reshape(rows, d, t + 1),
                                   alpha=self.scaling)
            if self.dtype == torch.float32:
                probs = torch.softmax(scores, dim=-1)
            else:
                probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.dtype)
            ctx = torch.bmm(probs, self.values[i][:, :, : t + 1].reshape(rows, t + 1, d))
            h = self._finish_layer(i, h, ctx.view(batch, nh * d))
        h = _rms_norm(h, self.model.model.norm)
        return self.model.lm_head(h)


class DynamicDecoder:
    """The same interface on the model's own forward pass and a transformers
    ``DynamicCache`` (grown by one column per step): for models :class:`StaticDecoder` does
    not cover, and as the reference the tests compare it with."""

    def __init__(self, model):
        from transformers import DynamicCache

        self.model = model
        self.cache = DynamicCache()

    def prefill(self, input_ids: torch.Tensor, mask: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.mask, self.positions = mask, positions[:, -1:] + 1
        return out.logits[:, -1]

    def select(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.mask, self.positions = self.mask[index], self.positions[index]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(tokens), 1)], dim=1)
        out = self.model(input_ids=tokens[:, None], attention_mask=self.mask,
                         position_ids=self.positions, past_key_values=self.cache,
                         use_cache=True)
        self.positions = self.positions + 1
        return out.logits[:, -1]


FUSE_MAX_BYTES = 256 * 2**20


def make_decoder(model, batch: int, prompt_width: int, max_new_tokens: int,
                 static: bool = True, compile_options: dict | None = None
                 ) -> StaticDecoder | DynamicDecoder:
    """A :class:`StaticDecoder` when ``static`` and the model is supported, else a
    :class:`DynamicDecoder`. The static decoder fuses (copies) the q/k/v and gate/up weights
    only when the model's parameters take at most ``FUSE_MAX_BYTES`` (256 MiB): above that
    the copies would cost memory and a copy per batch, and it reads the modules' weights.
    ``compile_options``: the static decoder's step goes through ``torch.compile(**options)``
    (e.g. ``{"mode": "reduce-overhead"}``: CUDA graphs on a GPU); the dynamic one ignores
    them."""
    if static and unsupported_reason(model) is None:
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        return StaticDecoder(model, batch, prompt_width, max_new_tokens,
                             fuse=size <= FUSE_MAX_BYTES, compile_options=compile_options)
    return DynamicDecoder(model)
