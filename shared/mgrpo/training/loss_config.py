"""The run config's ``loss`` and ``rewards`` sections: how a sample's reward is weighed
(paper Eq. 4-5) and how the policy loss is built from it (clipping, KL, aggregation,
rollout importance sampling). Read through :mod:`mgrpo.training.config`, which holds the
whole run config.

What this module does NOT do: compute a loss (``mgrpo.algo``) or know the run's models.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from mgrpo.algo.kl import KL_LOSS_ESTIMATORS
from mgrpo.training import aliases
from mgrpo.validation import StrictModel


class RewardWeights(StrictModel):
    """Reward weights (paper Eq. 4-5; docs/algorithm.md, '1.2 Rewards'). Planner: a = (format,
    correct); sub-agent: b = (format, correct_main, expert)."""

    planner: tuple[float, float] = (0.1, 0.9)
    subagent: tuple[float, float, float] = (0.1, 0.4, 0.5)


class LossConfig(StrictModel):
    """The policy loss (docs/algorithm.md, '1.4 Policy loss'). ``agg``: token-mean (DAPO, default)
    weighs every token equally; seq-mean-token-mean (original GRPO) weighs every sequence equally,
    so short answers pull harder; seq-mean-token-sum-norm (Dr. GRPO) removes the length bias of
    both."""

    key_aliases: ClassVar[dict[str, tuple[str, str]]] = aliases.LOSS

    eps_low: float = Field(0.2, gt=0)
    eps_high: float = Field(0.28, gt=0)
    agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "token-mean"
    kl_coef: float = Field(0.0, ge=0, description="KL to a frozen reference model (each "
                           "model's `ref_path`, default its starting `path`); 0 = off.")
    kl_estimator: Literal["k1", "k2", "k3", "k1+", "k3+"] = Field(
        "k3+", description="Per-token KL estimator (verl's names, mgrpo.algo.kl). In the loss "
        "only k2, k1+ and k3+ have the gradient of KL(pi||pi_ref) (k1+/k3+: value of k1/k3, "
        "gradient of k2); k1 (gradient 0) and k3 (gradient of the reverse KL) are refused "
        "there. In the reward (kl_in_reward) only the value counts: k1 is the usual choice.")
    kl_in_reward: bool = Field(
        False, description="Subtract kl_coef * k_t per generated token from the reward before "
        "the advantages (verl use_kl_in_reward: a sequence's reward falls by kl_coef * "
        "sum_t k_t, pi = the sampler's logprobs) instead of adding a KL term to the loss.")
    kl_control: Literal["fixed", "adaptive"] = Field(
        "fixed", description="The kl_in_reward coefficient: fixed at kl_coef, or adaptive "
        "(mgrpo.algo.kl_control; Ziegler et al. 2019 and TRL AdaptiveKLController, per-sequence "
        "KL; verl kl_ctrl.type is the same rule on a per-token KL): starts at kl_coef and "
        "after each round's batch of n sequences of mean "
        "KL kl becomes coef * (1 + clip(kl / kl_target - 1, -0.2, 0.2) * n / kl_horizon). Kept "
        "per model with its optimizer state, so a resumed run continues with it.")
    kl_target: float | None = Field(
        None, gt=0, description="Target KL per sequence (sum over its tokens) of "
        "kl_control: adaptive. verl's kl_ctrl.target_kl is per token: multiply it by the "
        "mean response length.")
    kl_horizon: int = Field(10000, ge=1, description="Sequences over which kl_control: "
                            "adaptive moves the coefficient by at most 20% (verl "
                            "kl_ctrl.horizon).")
    entropy_coef: float = Field(
        0.0, ge=0, description="Entropy bonus: the loss subtracts entropy_coef * agg(H) over "
        "the trained tokens (verl entropy_coeff). 0 = off (entropy is still reported).")
    rollout_is: Literal["auto", "none", "token", "sequence"] = Field(
        "auto", description="Truncated importance sampling pi_old / pi_rollout on the policy "
        "loss (verl's rollout correction): per token, per sequence, or off. auto: token when "
        "the sampler's logprobs differ from the trainer's by construction (a trained model "
        "with dtype: bfloat16, whose sampler runs float32 weights; or max_staleness > 0), "
        "else none (TRL turns its correction on by default the same way).")
    rollout_is_threshold: float = Field(2.0, ge=1.0, description="Cap C of the IS weights.")
    advantage_estimator: str | None = Field(
        None, description="A registered advantage estimator (mgrpo.algo.estimators: grpo, "
        "dr_grpo, mgrpo, at_grpo, or one a `plugins:` module registers) in place of the "
        "algorithm's own (verl: algorithm.adv_estimator). None: the algorithm's.")
    scale: Literal["std", "none"] = Field(
        "std", description="std: GRPO advantage (r-mu)/(sigma+eps). none: Dr. GRPO, r-mu.")
    dynamic_sampling: bool = Field(
        False, description="DAPO: drop groups whose rewards are all equal (no signal).")
    eps: float = 1e-6

    def is_level(self) -> str:
        """The correction's level as the loss applies it: ``auto`` is resolved by the run
        config (:meth:`RunConfig._check`); a loss config alone treats it as ``none``."""
        return "none" if self.rollout_is == "auto" else self.rollout_is

    def kl_in_loss(self) -> bool:
        """Whether the policy loss carries a KL term (on, and not moved into the reward)."""
        return self.kl_coef > 0 and not self.kl_in_reward
    norm_length: int | None = Field(
        None, ge=1, description="Dr. GRPO's constant L in sum(m*l) / (B*L) "
        "(seq-mean-token-sum-norm; verl: loss_scale_factor). None = the generation budget, "
        "RunConfig.loss_norm_length().")

    @model_validator(mode="after")
    def _kl_in_loss(self) -> LossConfig:
        if self.kl_coef > 0 and not self.kl_in_reward \
                and self.kl_estimator not in KL_LOSS_ESTIMATORS:
            why = {"k1": "its expected gradient is 0 (it regularises nothing)",
                   "k3": "its expected gradient is that of the reverse KL(pi_ref||pi)"}
            plus = "k1+" if self.kl_estimator == "k1" else "k3+"
            raise ValueError(f"loss.kl_estimator={self.kl_estimator} in the loss: "
                             f"{why[self.kl_estimator]}; use {plus} (its value, the gradient "
                             "of KL(pi||pi_ref)) or k2, or set loss.kl_in_reward: true")
        if self.kl_control == "adaptive":
            if not (self.kl_in_reward and self.kl_coef > 0):
                raise ValueError("loss.kl_control=adaptive steers the KL in the reward: set "
                                 "loss.kl_in_reward: true and loss.kl_coef > 0 (its start "
                                 "value), or kl_control: fixed")
            if self.kl_target is None:
                raise ValueError("loss.kl_control=adaptive needs loss.kl_target (the KL per "
                                 "sequence to steer toward, e.g. 6.0 as TRL's default)")
        return self
