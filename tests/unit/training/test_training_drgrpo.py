"""Dr. GRPO (``loss.agg: seq-mean-token-sum-norm``) divides by a CONSTANT B*L on the training
path, L = the run's generation budget, not by the padded width of the batch (prompt
included), which changes with the longest prompt in the batch."""

from __future__ import annotations

import pytest
import torch

from mgrpo.training.config import LossConfig, ModelConfig, RunConfig
from mgrpo.training.scoring import Sample
from mgrpo.training.update import UpdateSpec, policy_update
from mgrpo.types import Trajectory


def _sample(prompt: int, generated: int, advantage: float, i: int) -> Sample:
    ids = [(5 + 7 * j + i) % 300 + 20 for j in range(prompt + generated)]
    traj = Trajectory(traj_id=f"r/q/{i}/planner/0", round_id="r", query_id="q", rollout=i,
                      agent="planner", model="m", input_ids=ids,
                      response_mask=[0] * prompt + [1] * generated,
                      old_logprobs=[0.0] * (prompt + generated))
    return Sample(traj, advantage, 0.0)


@pytest.mark.parametrize("long_prompt", [3, 40])
def test_policy_update_divides_by_the_constant_budget(tiny_dir, long_prompt):
    """rho = 1 on the first step (old logprobs recomputed), so every generated token's loss
    is -A: pg_loss = -(1.0 * 4 + (-0.5) * 2) / (B * L) = -3 / (2 * 48) = -0.03125 whatever
    the prompt lengths; main divided by the padded width (7 or 44 -> -0.214 or -0.034)."""
    from mgrpo.models import load_model

    model, tokenizer = load_model(tiny_dir)
    samples = [_sample(long_prompt, 4, 1.0, 0), _sample(3, 2, -0.5, 1)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    metrics = policy_update(model, optimizer, samples, UpdateSpec(
        ModelConfig(path=str(tiny_dir)), LossConfig(agg="seq-mean-token-sum-norm"),
        tokenizer.pad_token_id, norm_length=48))
    assert metrics["pg_loss"] == pytest.approx(-3 / (2 * 48), abs=1e-6)


def _cfg(**kw) -> RunConfig:
    return RunConfig.model_validate({"models": {m: {"path": "x"} for m in
                                                ("planner", "searcher", "coder")}, **kw})


def test_norm_length_is_the_generation_budget():
    sampling = {"planner_max_turns": 5, "subagent_max_turns": 3, "max_new_tokens": 32}
    # M-GRPO: the longest trajectory is a planner's 5 turns of <= 32 tokens.
    assert _cfg(sampling=sampling).loss_norm_length() == 5 * 32
    # Single-agent GRPO: the planner also plays the sub-agents' turns inline.
    assert _cfg(sampling=sampling, algorithm="grpo").loss_norm_length() == 5 * (1 + 3) * 32
    # AT-GRPO: a sample is one turn's action.
    assert _cfg(sampling=sampling, algorithm="at_grpo").loss_norm_length() == 32
    # A configured constant wins (as verl's loss_scale_factor).
    assert _cfg(sampling=sampling, loss={"norm_length": 100}).loss_norm_length() == 100
    with pytest.raises(ValueError, match="norm_length"):
        _cfg(loss={"norm_length": 0})
