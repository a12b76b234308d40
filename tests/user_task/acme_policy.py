"""A scripted policy for the distributed round (``MGRPO_ENGINE=acme_policy:scripted_engine``),
so the round's calls are known: the planner delegates the question to ``web`` and answers
with what it returns; ``web`` searches the task and returns the observation."""

from __future__ import annotations

import re

from mgrpo.engines.base import Completion, GenerationRequest


class AcmePolicy:
    def __init__(self, tokenizer):
        self.tokenizer, self.version = tokenizer, 0

    def load_weights(self, source, version: int) -> None:
        self.version = version

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        out = []
        for req in requests:
            text = self.tokenizer.decode(req.prompt_ids, skip_special_tokens=False)
            turn = self.turn(text)
            ids = self.tokenizer.encode(turn, add_special_tokens=False)
            out.append(Completion(prompt_ids=list(req.prompt_ids), completion_ids=ids,
                                  logprobs=[-0.5] * len(ids), text=turn, finish_reason="stop"))
        return out

    @staticmethod
    def turn(text: str) -> str:
        if "<|planner|>" in text:
            rets = re.findall(r"<ret>(.*?)</ret>", text, re.S)
            question = text.split("<|question|>", 1)[1].split("<|planner|>", 1)[0]
            return f"<answer>{rets[0]}</answer>" if rets else f"<call>web|{question}</call>"
        obs = re.findall(r"<obs>(.*?)</obs>", text, re.S)
        task = text.split("<|task|>", 1)[1].split("<|", 1)[0]
        return f"<return>{obs[0]}</return>" if obs else f"<tool>{task}</tool>"


def scripted_engine(path: str, device: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return None, tokenizer, AcmePolicy(tokenizer)
