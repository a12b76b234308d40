"""A tiny Llama written as a GGUF file with the ``gguf`` package, as llama.cpp's converter
writes one (q/k rows permuted, llama.cpp tensor names, a byte-level BPE vocabulary with its
merges and a chat template), so the GGUF import is tested without the network. Its float32
reference is the Hugging Face model the file was written from."""

from __future__ import annotations

import json
from pathlib import Path


def _permute(weights, n_head: int):
    """llama.cpp's ``LlamaModel.permute``: rotary halves interleaved per head."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def tiny_llama(tokenizer, seed: int = 0):
    """A random float32 LlamaForCausalLM (2 layers, hidden 64, 4 heads, 2 kv heads)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=True, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1, so a mixed-up tensor shows in the logits
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


def write_gguf(path: str | Path, model, tokenizer) -> Path:
    """Write ``model`` and ``tokenizer`` (a byte-level BPE fast tokenizer) to ``path``."""
    import gguf
    import numpy as np

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = tokenizer.get_vocab()
    tokens = [None] * len(vocab)
    for text, index in vocab.items():
        tokens[index] = text
    special = set(tokenizer.all_special_tokens)
    added = set(tokenizer.get_added_vocab())
    types = [gguf.TokenType.CONTROL if t in special else
             gguf.TokenType.USER_DEFINED if t in added else gguf.TokenType.NORMAL
             for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(tokenizer.chat_template)

    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    for layer in range(cfg.num_hidden_layers):
        for hf, cpp in names.items():
            value = state[f"model.layers.{layer}.{hf}.weight"]
            if cpp == "attn_q":
                value = _permute(value, cfg.num_attention_heads)
            elif cpp == "attn_k":
                value = _permute(value, cfg.num_key_value_heads)
            writer.add_tensor(f"blk.{layer}.{cpp}.weight", np.ascontiguousarray(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
