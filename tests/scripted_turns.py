"""An engine whose every turn is a function of its prompt's text and the request's seed, for
the services tests that compare a round through the services with the embedded one."""

from __future__ import annotations

from collections.abc import Callable

from mgrpo.engines.base import Completion


class TurnEngine:
    """Writes ``turn(prompt text, seed)`` for each request (logprobs: -1 per token)."""

    def __init__(self, tokenizer, turn: Callable[[str, int], str]) -> None:
        self.tokenizer, self.turn, self.version = tokenizer, turn, 0

    def generate(self, requests) -> list[Completion]:
        out = []
        for req in requests:
            text = self.turn(self.tokenizer.decode(req.prompt_ids), req.params.seed)
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Completion(list(req.prompt_ids), ids, [-1.0] * len(ids),
                                  self.tokenizer.decode(ids), "stop"))
        return out

    def load_weights(self, source, version: int) -> None:
        self.version = version
