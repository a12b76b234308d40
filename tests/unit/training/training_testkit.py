"""Helpers for the training tests (a plain module: conftest files are not importable).

``ScriptedEngine`` stands in for a model: it answers each request with token ids chosen by a
``respond(prompt_ids, params)`` function and a deterministic, position-dependent logprob, so
tests can check where the runner puts every id, mask bit and logprob.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from mgrpo.engines.base import Completion, GenerationRequest, SamplingParams


def fake_logprob(position: int) -> float:
    """The logprob the scripted engine reports for the token at ``position`` of a context."""
    return -0.01 * (position % 97) - 0.001


class ScriptedEngine:
    """An Engine whose completions come from ``respond(prompt_ids, params) -> ids``."""

    def __init__(self, tokenizer, respond: Callable[[list[int], SamplingParams], list[int]],
                 version: int = 0):
        self.tokenizer, self.respond, self.version = tokenizer, respond, version
        self.requests: list[GenerationRequest] = []

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        out = []
        for req in requests:
            self.requests.append(req)
            ids = list(self.respond(list(req.prompt_ids), req.params))
            start = len(req.prompt_ids)
            out.append(Completion(
                prompt_ids=list(req.prompt_ids), completion_ids=ids,
                logprobs=[fake_logprob(start + i) for i in range(len(ids))],
                text=self.tokenizer.decode(ids), finish_reason="stop"))
        return out

    def load_weights(self, source, version: int) -> None:
        self.version = version


def replay_responder(records: list[tuple[list[int], list[int]]]):
    """``respond`` that replays recorded (ids, mask) sequences: given a prompt that is a
    prefix of a record, return that record's next generated (mask-1) tokens up to and
    including the first stop token of the request, as a real engine would."""

    def respond(prompt: list[int], params: SamplingParams) -> list[int]:
        n = len(prompt)
        for ids, mask in records:
            if len(ids) > n and ids[:n] == prompt and mask[n] == 1:
                end = n
                while end < len(ids) and mask[end] == 1:
                    end += 1
                    if ids[end - 1] in params.stop_token_ids:
                        break
                return ids[n:end]
        raise AssertionError(f"no recorded sequence continues this prompt (len {n})")

    return respond


def text_responder(tokenizer, turn_for: Callable[[str, SamplingParams], str]):
    """``respond`` from text: ``turn_for(prompt_text, params) -> turn text``."""

    def respond(prompt: list[int], params: SamplingParams) -> list[int]:
        text = tokenizer.decode(prompt)
        return tokenizer.encode(turn_for(text, params), add_special_tokens=False)

    return respond


def run_config_dict(tmp: Path, model_path: Path, bench_dir: Path, **overrides) -> dict:
    """A tiny RunConfig for loop tests: 2 queries x K=2, short turns, a few eval questions."""
    cfg = {
        "name": "t", "seed": 0, "algorithm": "mgrpo",
        "models": {m: {"path": str(model_path), "lr": 1e-3, "micro_batch_size": 4}
                   for m in ("planner", "searcher", "coder")},
        "k": 2, "queries_per_round": 2,
        "sampling": {"planner_max_turns": 2, "subagent_max_turns": 2, "max_new_tokens": 6},
        "stages": [{"stage": 1, "rounds": 2}], "eval_questions": 2,
        "bench_dir": str(bench_dir), "out_dir": str(tmp / "run"),
    }
    cfg.update(overrides)
    return cfg


def sampled_samples(model, tok, prompts: list[list[int]], params: Callable[[int], SamplingParams],
                    advantage: Callable[[int], float], shift: float = 0.0) -> list:
    """Samples for ``policy_update`` drawn by the real torch engine: prompt ``i`` with
    ``params(i)``, advantage ``advantage(i)``, planner and searcher alternating, and the
    recorded rollout logprobs moved by ``shift`` (a sampler that disagrees with the trainer)."""
    from mgrpo.engines.torch_engine import TorchEngine
    from mgrpo.training.scoring import Sample
    from mgrpo.types import Trajectory

    engine = TorchEngine(model, tok, stop_at_eos=False)
    outs = engine.generate([GenerationRequest(p, params(i)) for i, p in enumerate(prompts)])
    samples = []
    for i, out in enumerate(outs):
        n = len(out.prompt_ids)
        traj = Trajectory(
            traj_id=f"r/q/{i}/x/0", round_id="r", query_id="q", rollout=i,
            agent="planner" if i % 2 else "searcher", model="m",
            input_ids=out.prompt_ids + out.completion_ids,
            response_mask=[0] * n + [1] * len(out.completion_ids),
            old_logprobs=[0.0] * n + [lp + shift for lp in out.logprobs])
        samples.append(Sample(traj, advantage=advantage(i), reward=0.0))
    return samples
