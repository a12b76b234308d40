"""Tiny Qwen2 models for CPU tests and the demo, built from a config, with a local tokenizer.

:func:`init_tiny` trains a byte-level BPE tokenizer on the given texts with the ``tokenizers``
library (every agent-protocol marker in :data:`mgrpo.protocol_tokens.SPECIAL_TOKENS` is
ONE special token), builds a randomly initialised ``Qwen2ForCausalLM`` (about 1-5M parameters
with the defaults) and saves both as an ordinary Hugging Face folder, so the same loading code
(:func:`mgrpo.models.load_model`) serves tiny and real models.

Deterministic: the same config, corpus and seed give identical tokenizer files and weights.

What it does NOT do: download anything, pretrain the model (weights are random; the supervised
warm start, :mod:`mgrpo.models.sft`, teaches it the protocol), or build non-Qwen2 shapes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import Field, model_validator

from mgrpo import protocol_tokens as pt
from mgrpo.models.loading import quiet_transformers
from mgrpo.models.permissions import make_readable
from mgrpo.validation import StrictModel

# Jinja chat template: each message is its role token, its content, then <|end|>. Roles that are
# protocol roles (planner, searcher, coder) map to their single special token.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|planner|>{% endif %}"
)

# Used when no corpus is given: enough text that the BPE learns protocol-shaped merges.
_FALLBACK_CORPUS = [
    "<|agents|>searcher: look up facts; coder: run python<|question|>What is the population "
    "of Velmora?<|planner|><call>searcher|population of Velmora</call><ret>48210</ret>"
    "<answer>48210</answer><|end|>",
    "<|task|>population of Velmora<|searcher|><tool>Velmora population</tool>"
    "<obs>Velmora is a city. Its population is 48210.</obs><return>48210</return><|end|>",
    "<|task|>add 12 and 30<|coder|><tool>print(12 + 30)</tool><obs>42</obs>"
    "<return>42</return><|end|>",
    "the quick brown fox jumps over the lazy dog 0123456789 + - * / ( ) = . , ; : ? !",
]


class TinyModelConfig(StrictModel):
    """Shape of a tiny Qwen2 model and its tokenizer.

    Defaults give about 1.1M parameters: small enough that SFT and RL steps take well under a
    second on 2 CPU cores, large enough to learn the benchmark's protocol.
    """

    hidden_size: int = Field(128, gt=0)
    num_hidden_layers: int = Field(5, gt=0)
    num_attention_heads: int = Field(4, gt=0)
    num_key_value_heads: int = Field(2, gt=0)
    intermediate_size: int = Field(384, gt=0)
    vocab_size: int = Field(1024, ge=300, description="BPE target size (>= 256 bytes + specials)")
    max_position_embeddings: int = Field(2048, gt=0)
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    seed: int = 0

    @model_validator(mode="after")
    def _check_heads(self) -> TinyModelConfig:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}; pick heads that divide the hidden size")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention "
                "shares each kv head among a whole number of query heads)")
        return self


def train_tokenizer(corpus_texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE on ``corpus_texts``; return a transformers fast tokenizer.

    The protocol markers are added as special tokens before training, so the BPE never splits
    them and each encodes to exactly one id. No post-processor: encoding inserts no BOS/EOS,
    which is what segment-wise encoding (:func:`mgrpo.models.sft.encode_segments`) needs.
    """
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    texts = [t for t in corpus_texts if t] or list(_FALLBACK_CORPUS)
    backend = Tokenizer(models.BPE())
    # Exactly Qwen2's normalizer and pre-tokenizer (digits one by one): AutoTokenizer loads a
    # qwen2 folder as Qwen2Tokenizer, which installs these, so training must use them too or
    # the loaded tokenizer would split text differently from the trained one.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(pt.SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=pt.PAD, eos_token=pt.EOS,
        # unk set explicitly: byte-level BPE never emits it, and leaving it unset makes
        # AutoTokenizer (Qwen2Tokenizer for model_type qwen2) add a stray <|endoftext|> token.
        unk_token=pt.EOS,
        additional_special_tokens=[t for t in pt.SPECIAL_TOKENS if t not in (pt.PAD, pt.EOS)],
        clean_up_tokenization_spaces=False, model_max_length=1 << 20)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(config: TinyModelConfig, vocab_size: int, pad_id: int, eos_id: int):
    """A randomly initialised ``Qwen2ForCausalLM`` (float32), seeded by ``config.seed``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    quiet_transformers()  # save_pretrained's "Writing model shards" bar
    hf_config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        intermediate_size=config.intermediate_size,
        max_position_embeddings=config.max_position_embeddings,
        rope_theta=config.rope_theta, tie_word_embeddings=config.tie_word_embeddings,
        pad_token_id=pad_id, eos_token_id=eos_id, bos_token_id=None)
    # fork_rng: seeding must not disturb the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = Qwen2ForCausalLM(hf_config)
    return model.float().eval()


def init_tiny(out_dir: str | Path, config: TinyModelConfig | None = None,
              corpus_texts: Iterable[str] = ()) -> Path:
    """Build a tiny model + tokenizer and save them as a Hugging Face folder at ``out_dir``.

    Returns the folder path. ``AutoModelForCausalLM.from_pretrained(out_dir)`` and
    ``AutoTokenizer.from_pretrained(out_dir)`` load the result.
    """
    config = config or TinyModelConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus_texts, config.vocab_size)
    model = build_tiny_model(config, len(tokenizer), tokenizer.pad_token_id,
                             tokenizer.eos_token_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "mgrpo_tiny.json").write_text(json.dumps(config.model_dump(), indent=2))
    make_readable(out)  # save_pretrained leaves model.safetensors at 0600
    return out


def count_parameters(model) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
