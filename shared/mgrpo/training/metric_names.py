"""Metric key namespaces. Every per-agent metric key is ``"{name}/{quantity}"`` where
``name`` is either:

- a ROLE (a key of the run config's ``agents:``): what the role's rollouts and rewards were,
  e.g. ``planner/reward_mean``, ``searcher/calls_per_episode``, ``planner/rollout_kl``;
- a MODEL (a key of ``models:``): what the model's update did, e.g. ``qwen/loss``,
  ``qwen/grad_norm``, ``qwen/staleness_max``; one model serving several roles has one
  update, trained on all of their samples.

A run config where the two meet ambiguously is refused (:func:`namespace_clash`): a model
named like a role must be that role's model and serve no other role, so ``x/...`` always
means role x played by model x. Otherwise ``planner/loss`` (a model ``planner`` that plays
the searcher) would sit beside ``planner/reward_mean`` (the planner role, another model's)
with nothing telling them apart. Models named unlike every role (``qwen``) are free.
"""

from __future__ import annotations


def namespace_clash(agents: dict[str, str]) -> str | None:
    """None when role and model metric namespaces cannot be confused; else one line."""
    for model in sorted(set(agents.values()) & set(agents)):
        roles = sorted(role for role, m in agents.items() if m == model)
        if roles != [model]:
            played = (f"plays roles {', '.join(roles)}" if model in roles
                      else f"plays {', '.join(roles)} while role {model} is played by "
                           f"{agents[model]}")
            return (f"agents: model {model!r} is named like the role {model} but {played}: "
                    f"its update metrics ({model}/loss) would share the {model}/ namespace "
                    f"with role {model}'s rollout metrics ({model}/reward_mean); name the "
                    f"model differently (e.g. {model}_model), or give each role its own")
    return None
