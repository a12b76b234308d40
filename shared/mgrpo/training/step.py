"""One single-agent GRPO step, public: prompts in, one policy update out.

The M-GRPO round (``mgrpo.training.rounds``) is multi-agent and episode-based; a user (or a
benchmark against TRL's ``GRPOTrainer``) that wants plain GRPO on one model would otherwise
have to fake trajectories, samples and group ids to reach :func:`policy_update`. Here:

1. every prompt is sampled ``group_size`` times by the engine (seed ``seed + i`` for the i-th
   request, so a step is reproducible and independent of batch composition);
2. ``reward_fn(prompt_ids, completion)`` scores each completion;
3. advantages per prompt group by ``loss.advantage_estimator`` (default ``grpo``;
   ``loss.scale``: std = GRPO, none = Dr. GRPO; ``loss.dynamic_sampling`` leaves out groups
   with equal rewards);
4. :func:`mgrpo.training.update.policy_update` trains on them at the sampling temperature,
   with Dr. GRPO's constant L = ``max_new_tokens``.

Not here: multi-turn episodes, tools, sub-agents, checkpoints, a KL reference (pass
``ref_model`` when ``loss.kl_coef > 0``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from mgrpo.algo.estimators import AdvantageBatch, get_estimator
from mgrpo.engines.base import Completion, GenerationRequest, SamplingParams
from mgrpo.engines.torch_engine import TorchEngine
from mgrpo.training.config import LossConfig, ModelConfig
from mgrpo.training.scoring import Sample, estimator_config
from mgrpo.training.update import UpdateSpec, policy_update
from mgrpo.types import Trajectory

RewardFn = Callable[[list[int], Completion], float]


@dataclass
class StepResult:
    """What one step produced: the update's metrics (plus ``reward_mean``, ``gen_s``,
    ``update_s``), and per completion (request order: prompt-major, ``group_size`` each)
    the completion, its reward and its advantage."""

    metrics: dict[str, float]
    completions: list[Completion]
    rewards: list[float]
    advantages: list[float]


def grpo_step(model: torch.nn.Module, tokenizer, optimizer: torch.optim.Optimizer,
              prompts: list[list[int]], reward_fn: RewardFn, *, group_size: int = 8,
              max_new_tokens: int = 64, temperature: float = 1.0, seed: int = 0,
              model_cfg: ModelConfig | None = None, loss_cfg: LossConfig | None = None,
              engine: TorchEngine | None = None, stop_at_eos: bool = True,
              ref_model: torch.nn.Module | None = None,
              reuse_first_pass: bool = True) -> StepResult:
    """Generate ``group_size`` completions per prompt, score, and take one policy update.

    ``engine``: reuse one across steps (it must wrap ``model``); default a
    :class:`TorchEngine` on ``model``. ``stop_at_eos=False`` makes every completion exactly
    ``max_new_tokens`` long (fixed-length benchmarks). ``model_cfg``: mini-batches,
    micro-batch size, grad clip (its ``path`` is not read; default one mini-batch of 16).
    ``reuse_first_pass``: see :class:`UpdateSpec` (False = a separate pi_old pass).
    """
    if not prompts or any(not p for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    if group_size < 2:
        raise ValueError(f"group_size={group_size}: GRPO needs >= 2 completions per prompt")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (greedy has no logprobs)")
    model_cfg = model_cfg or ModelConfig(path="-")
    loss_cfg = loss_cfg or LossConfig()
    if engine is None:
        engine = TorchEngine(model, tokenizer, device=str(next(model.parameters()).device),
                             stop_at_eos=stop_at_eos)
    elif engine.model is not model:
        raise ValueError("engine wraps another model: pass TorchEngine(model, ...) or None")
    requests = [GenerationRequest(list(p), SamplingParams(
        temperature=temperature, max_new_tokens=max_new_tokens, seed=seed + i))
        for i, p in enumerate(p for p in prompts for _ in range(group_size))]
    start = time.perf_counter()
    completions = engine.generate(requests)
    gen_s = time.perf_counter() - start
    rewards = torch.tensor([float(reward_fn(r.prompt_ids, c))
                            for r, c in zip(requests, completions, strict=True)])
    group_ids = torch.arange(len(prompts)).repeat_interleave(group_size)
    zeros = torch.zeros_like(group_ids)
    batch = AdvantageBatch(rewards, group_ids, agent_ids=zeros, turn_ids=zeros,
                           rollout_ids=torch.arange(len(requests)) % group_size)
    adv = get_estimator(loss_cfg.advantage_estimator or "grpo")(batch,
                                                                 estimator_config(loss_cfg))
    samples = []
    for i, c in enumerate(completions):
        if not bool(adv.keep[i]) or not c.completion_ids:
            continue
        n = len(c.prompt_ids)
        traj = Trajectory(
            traj_id=f"step/{seed}/{i}", round_id=f"step/{seed}", query_id=str(i // group_size),
            rollout=i % group_size, agent="policy", model="policy",
            input_ids=c.prompt_ids + c.completion_ids,
            response_mask=[0] * n + [1] * len(c.completion_ids),
            old_logprobs=[0.0] * n + list(c.logprobs))
        samples.append(Sample(traj, advantage=float(adv.advantages[i]),
                              reward=float(rewards[i])))
    start = time.perf_counter()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id
    spec = UpdateSpec(model_cfg, loss_cfg, pad_id, temperature=temperature,
                      norm_length=max_new_tokens, reuse_first_pass=reuse_first_pass)
    metrics = policy_update(model, optimizer, samples, spec, ref_model=ref_model,
                            generator=torch.Generator().manual_seed(seed))
    metrics.update({"reward_mean": float(rewards.mean()), "gen_s": gen_s,
                    "update_s": time.perf_counter() - start})
    return StepResult(metrics, completions, rewards.tolist(), adv.advantages.tolist())
