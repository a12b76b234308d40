"""One episode as the dashboard's trace viewer shows it, rebuilt from stored trajectories.

The store keeps token ids, not the episode's text trace, so we decode each trajectory with
its model's tokenizer and split it where ``response_mask`` changes: mask-1 spans are what the
agent generated (its turns, raw), mask-0 spans the prompt and the observations fed back
(tool results, ``<ret>`` blocks). Sub-agent calls come with the task they were given, the
result they returned and their reward; the planner with its answer and reward R_M.

What this module does NOT do: load models (tokenizers only, cached by path) or re-run
anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import lru_cache

from mgrpo.types import Trajectory

MAX_SPAN_CHARS = 20000  # a runaway generation still renders


@lru_cache(maxsize=16)
def _tokenizer(path: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


_LOCK = threading.Lock()


def tokenizer_from_config(cfg) -> Callable[[str], object | None]:
    """``model name -> tokenizer`` from a run config (a ``RunConfig``: ``models.<name>.path``);
    None when the model or its folder is not there (the viewer then shows token ids)."""

    def lookup(model: str):
        found = cfg.models.get(model) if cfg is not None else None
        path = found.path if found is not None else None
        if not path:
            return None
        try:
            with _LOCK:
                return _tokenizer(str(path))
        except Exception:  # a missing folder, a remote name offline: show ids instead
            return None
    return lookup


def spans(traj: Trajectory, tokenizer) -> list[dict]:
    """The trajectory split into ``{"generated": bool, "text": str, "tokens": n}`` runs."""
    out: list[dict] = []
    start = 0
    ids, mask = traj.input_ids, traj.response_mask
    for end in range(1, len(ids) + 1):
        if end == len(ids) or mask[end] != mask[start]:
            chunk = ids[start:end]
            text = (tokenizer.decode(chunk, skip_special_tokens=False) if tokenizer is not None
                    else " ".join(map(str, chunk)))
            out.append({"generated": bool(mask[start]), "tokens": len(chunk),
                        "text": text[:MAX_SPAN_CHARS]})
            start = end
    return out


def _turn(traj: Trajectory, tokenizer) -> dict:
    return {"agent": traj.agent, "model": traj.model, "invocation": traj.invocation,
            "turn": traj.turn, "weights_version": traj.weights_version,
            "format_ok": traj.format_ok, "subtask": traj.subtask, "result": traj.result,
            "reward": traj.reward, "decoded": tokenizer is not None,
            "spans": spans(traj, tokenizer)}


def episode_trace(store, round_id: str, query_id: str, rollout: int,
                  tokenizer_for: Callable[[str], object | None],
                  lookup: Callable[[str], tuple] | None = None) -> dict | None:
    """The planner's trajectory and every sub-agent call of one rollout, decoded; None when
    the rollout has no stored trajectories (unknown, or not completed yet)."""
    trajs = store.episode_trajectories(round_id, query_id, rollout)
    if not trajs:
        return None
    outcome = next((o for o in store.read_planner_outcomes(round_id)
                    if o.query_id == query_id and o.rollout == rollout), None)
    question, gold = lookup(query_id) if lookup else (None, None)
    planner = [t for t in trajs if t.agent == "planner"]
    calls = sorted((t for t in trajs if t.agent != "planner"),
                   key=lambda t: (t.invocation, t.agent, t.turn or 0))
    return {"round_id": round_id, "query_id": query_id, "rollout": rollout,
            "question": question, "gold": gold,
            "outcome": outcome.model_dump(mode="json") if outcome else None,
            "planner": [_turn(t, tokenizer_for(t.model)) for t in planner],
            "subagents": [_turn(t, tokenizer_for(t.model)) for t in calls]}
