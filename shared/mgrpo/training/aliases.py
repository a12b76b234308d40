"""TRL's and verl's names of the run config's options, per config section: an unknown key
that is one of them is answered with our name (``unknown key 'learning_rate' (TRL's
learning_rate is 'lr' here)``), not only with the nearest spelling. docs/configuration.md
("Coming from TRL or verl") has the same table; a test keeps the two in step.

Each table maps a foreign key, as it would be written in that section, to (our key, whose
name it is). What this module does NOT do: accept the foreign names. A run config has one
name per option, so a file reads the same to everyone.
"""

from __future__ import annotations

TRL, VERL, BOTH = "TRL", "verl", "TRL/verl"

RUN = {
    "num_generations": ("k", TRL),
    "rollout": ("k (rollout.n), sampling.* (temperature, response_length)", VERL),
    "n": ("k", VERL),
    "learning_rate": ("models.<model>.lr", TRL),
    "lr": ("models.<model>.lr", VERL),
    "beta": ("loss.kl_coef", TRL),
    "kl_loss_coef": ("loss.kl_coef", VERL),
    "kl_loss_type": ("loss.kl_estimator", VERL),
    "epsilon": ("loss.eps_low", TRL),
    "epsilon_high": ("loss.eps_high", TRL),
    "clip_ratio_low": ("loss.eps_low", VERL),
    "clip_ratio_high": ("loss.eps_high", VERL),
    "loss_type": ("loss.agg", TRL),
    "loss_agg_mode": ("loss.agg", VERL),
    "scale_rewards": ("loss.scale", TRL),
    "max_completion_length": ("sampling.max_new_tokens", TRL),
    "max_response_length": ("sampling.max_new_tokens", VERL),
    "temperature": ("sampling.temperature", BOTH),
    "output_dir": ("out_dir", TRL),
    "default_local_dir": ("out_dir", VERL),
    "model_name_or_path": ("models.<model>.path", TRL),
    "max_grad_norm": ("models.<model>.grad_clip", TRL),
    "per_device_train_batch_size": ("models.<model>.micro_batch_size", TRL),
    "train_batch_size": ("queries_per_round", VERL),
    "max_steps": ("stages[].rounds, or `mgrpo train --rounds N`", TRL),
    "total_training_steps": ("stages[].rounds, or `mgrpo train --rounds N`", VERL),
    "logging_steps": ("`mgrpo train --log-every N`", TRL),
    "actor_rollout_ref": ("models.<model> (lr, path), k and sampling.*; see the table in "
                          "docs/configuration.md", VERL),
    "data": ("bench_dir, queries_per_round, sampling.max_new_tokens", VERL),
}

MODEL = {
    "learning_rate": ("lr", TRL),
    "optim": ("lr", VERL),
    "max_grad_norm": ("grad_clip", TRL),
    "model_name_or_path": ("path", TRL),
    "per_device_train_batch_size": ("micro_batch_size", TRL),
    "ppo_micro_batch_size_per_gpu": ("micro_batch_size", VERL),
    "num_iterations": ("ppo_epochs", TRL),
    "lr_scheduler_type": ("lr_schedule", TRL),
    "warmup_ratio": ("warmup_steps", TRL),
    "lr_warmup_steps": ("warmup_steps", VERL),
    "bf16": ("dtype: bfloat16", TRL),
    "ppo_max_token_len_per_gpu": ("micro_batch_tokens", VERL),
    "enable_gradient_checkpointing": ("gradient_checkpointing", VERL),
}

LOSS = {
    "kl_ctrl": ("kl_control, kl_target, kl_horizon", VERL),
    "target_kl": ("kl_target", VERL),
    "horizon": ("kl_horizon", VERL),
    "beta": ("kl_coef", TRL),
    "kl_loss_coef": ("kl_coef", VERL),
    "kl_loss_type": ("kl_estimator", VERL),
    "epsilon": ("eps_low", TRL),
    "epsilon_high": ("eps_high", TRL),
    "clip_ratio_low": ("eps_low", VERL),
    "clip_ratio_high": ("eps_high", VERL),
    "loss_type": ("agg", TRL),
    "loss_agg_mode": ("agg", VERL),
    "scale_rewards": ("scale", TRL),
    "entropy_coeff": ("entropy_coef", VERL),
    "use_kl_in_reward": ("kl_in_reward", VERL),
    "kl_penalty": ("kl_estimator (with kl_in_reward)", VERL),
}

SAMPLING = {
    "max_completion_length": ("max_new_tokens", TRL),
    "max_response_length": ("max_new_tokens", VERL),
    "response_length": ("max_new_tokens", VERL),
    "max_tokens": ("max_new_tokens", "vLLM"),
}
