"""A local tokenizer with a ChatML chat template that supports tools (as Qwen2.5's does).

Trained here like the project's tiny tokenizers (``mgrpo.models.tiny.train_tokenizer``: Qwen2's
pre-tokenizer, byte-level BPE), but WITHOUT the agent protocol's markers: only ChatML's
``<|im_start|>``/``<|im_end|>``/``<|endoftext|>`` special tokens and Qwen2.5's added tool tags.
Nothing is downloaded. :func:`tiny_chat_model` gives a random float32 Qwen2 model for it.
"""

from __future__ import annotations

from functools import lru_cache

# Qwen2.5's template, shortened: system + <tools> block, ChatML turns, tool results as
# <tool_response> inside a user turn.
CHATML_TOOLS_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou are provided with function signatures within <tools></tools> "
    "XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls)"
    " %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# SmolLM2-135M-Instruct's own template: ChatML that never renders tools=
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

_CORPUS = [
    "<|im_start|>system\nYou are the planner.<|im_end|>\n<|im_start|>user\nWhat is the "
    "population of Velmora?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": "
    "\"searcher\", \"arguments\": {\"task\": \"population of Velmora\"}}\n</tool_call>"
    "<|im_end|>\n<|im_start|>user\n<tool_response>\n48210\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n48210<|im_end|>\n",
    "{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\": \"look up "
    "facts\", \"parameters\": {\"type\": \"object\", \"properties\": {\"input\": {\"type\": "
    "\"string\"}}, \"required\": [\"input\"]}}}",
    "the quick brown fox jumps over the lazy dog 0123456789 + - * / ( ) = . , ; : ? !",
]


@lru_cache(maxsize=1)
def chat_tokenizer():
    """A fast tokenizer (vocab 512) whose ``chat_template`` is :data:`CHATML_TOOLS_TEMPLATE`;
    eos is ``<|im_end|>`` as in Qwen2.5-Instruct."""
    from tokenizers import (
        AddedToken,
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

    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    backend.train_from_iterator(_CORPUS, trainer=trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"],
                                  clean_up_tokenization_spaces=False)
    tok.chat_template = CHATML_TOOLS_TEMPLATE
    return tok


def tiny_chat_model(tok, seed: int = 0):
    """A random float32 Qwen2 (2 layers, hidden 64) for ``tok``."""
    from mgrpo.models.tiny import TinyModelConfig, build_tiny_model

    cfg = TinyModelConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, intermediate_size=128, seed=seed)
    return build_tiny_model(cfg, len(tok), tok.pad_token_id, tok.eos_token_id)


class ChatScriptedPolicy:
    """An Engine for the services tests, speaking the chat format: the planner delegates to
    the searcher once and answers with the start of the result; a sub-agent calls its tool
    once and returns the start of the output."""

    def __init__(self, tokenizer, version: int = 0) -> None:
        self.tokenizer, self.version = tokenizer, version

    def load_weights(self, source, version: int) -> None:
        self.version = version

    @staticmethod
    def turn(text: str) -> str:
        import json
        import re

        results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.S)
        if results:
            return results[0][:20].strip() + "<|im_end|>"
        task = text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        name, arg = (("searcher", "task") if "You are the planner" in text
                     else ("search", "input"))
        call = json.dumps({"name": name, "arguments": {arg: task[:40]}})
        return f"<tool_call>\n{call}\n</tool_call><|im_end|>"

    def generate(self, requests):
        from mgrpo.engines.base import Completion

        out = []
        for req in requests:
            turn = self.turn(self.tokenizer.decode(req.prompt_ids, skip_special_tokens=False))
            ids = self.tokenizer.encode(turn, add_special_tokens=False)
            out.append(Completion(prompt_ids=list(req.prompt_ids), completion_ids=ids,
                                  logprobs=[-0.5] * len(ids), text=turn, finish_reason="stop"))
        return out


def chat_scripted_engine(path: str, device: str):
    """``MGRPO_ENGINE=chat_tokenizer:chat_scripted_engine``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return None, tokenizer, ChatScriptedPolicy(tokenizer)


def save_chat_model(folder):
    """:func:`tiny_chat_model` and :func:`chat_tokenizer` saved as a Hugging Face folder."""
    tok = chat_tokenizer()
    tiny_chat_model(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
