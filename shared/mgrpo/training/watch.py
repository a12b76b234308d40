"""Warnings that save a run: signs, in a round's metrics, that the run is learning nothing.

A run can spend hours learning nothing while every number it logs looks normal: each group's
rewards are equal (no advantage), the gradient is 0, the policy has stopped producing the
answer format, or the planner never delegates to a sub-agent (which then gets no samples).
:class:`RunWatch` reads each round's metrics and returns one line per such sign, with the
number that shows it and what to try. Each sign is reported once when it starts (after
``patience`` rounds in a row, where one round can be chance) and again only after it went
away and came back.

What this module does NOT do: print, stop a run or change its config; the caller
(:class:`mgrpo.training.metrics.MetricsLogger`) writes the lines to stderr.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mgrpo.progress import format_value

ZERO = 1e-12


@dataclass
class RunWatch:
    """``agents``: role -> model (the run config's); ``trained``: the models that update."""

    agents: dict[str, str]
    trained: list[str]
    patience: int = 3
    _streaks: dict[str, int] = field(default_factory=dict)
    _best_format: tuple[float, int] | None = None

    def check(self, round_index: int, metrics: dict[str, float]) -> list[str]:
        """The warnings of round ``round_index`` (0-based) given its metrics."""
        out: list[str] = []
        constant_roles = set()
        for role, model in self.agents.items():
            frac = metrics.get(f"{role}/frac_reward_zero_std")
            if model not in self.trained or frac is None:
                continue
            if frac >= 1 - ZERO:
                constant_roles.add(role)
            if self._streak(f"zero_std:{role}", frac >= 1 - ZERO):
                out.append(
                    f"warning: {role}: every group had the same reward for {self.patience} "
                    f"rounds ({role}/frac_reward_zero_std=1, {role}/reward_mean="
                    f"{format_value(metrics.get(f'{role}/reward_mean', float('nan')))}): no "
                    "advantage, nothing is learnt. Try a larger k, a higher "
                    "sampling.temperature, questions the model solves sometimes (a better "
                    "warm start, stages[].stage or max_success), or reward weights that "
                    "separate its answers (rewards.*)")
        for model in self.trained:
            norm = metrics.get(f"{model}/grad_norm")
            if norm is None:
                continue
            roles = [r for r, m in self.agents.items() if m == model]
            # a role without samples this round (no groups: no frac_reward_zero_std) has no
            # variance either; only a role whose groups had variance makes grad_norm=0 news
            varied = [r for r in roles if r not in constant_roles
                      and metrics.get(f"{r}/frac_reward_zero_std") is not None]
            explained = bool(roles) and not varied
            if self._streak(f"grad:{model}", norm <= ZERO and not explained):
                out.append(
                    f"warning: model {model}: {model}/grad_norm=0 for {self.patience} rounds: "
                    "its updates change no weight although some groups have reward variance. "
                    "Check that its roles' samples have response tokens "
                    f"({model}/num_tokens), that loss.dynamic_sampling did not drop every "
                    "group, and that the model is not frozen by its own config")
        out += self._format_collapse(round_index, metrics)
        for role, model in self.agents.items():
            calls = metrics.get(f"{role}/calls_per_episode")
            if role == "planner" or model not in self.trained or calls is None:
                continue
            if self._streak(f"calls:{role}", calls <= ZERO):
                out.append(
                    f"warning: {role} was not called in {self.patience} rounds "
                    f"({role}/calls_per_episode=0): it gets no samples and learns nothing. "
                    "Try a warm start of the planner on demonstrations that delegate to it "
                    "(mgrpo data demos, mgrpo sft), a higher sampling.temperature, or check "
                    f"that the planner's prompt offers the tool of {role}")
        return out

    def _streak(self, name: str, bad: bool) -> bool:
        """Count ``bad`` rounds in a row under ``name``; True the round the count reaches
        ``patience`` (once per streak)."""
        count = self._streaks.get(name, 0) + 1 if bad else 0
        self._streaks[name] = count
        return count == self.patience

    def _format_collapse(self, round_index: int, metrics: dict[str, float]) -> list[str]:
        """``planner/format_valid`` below half of the best round's (that best >= 0.2): warned
        once, and again after it recovered to three quarters of the best."""
        value = metrics.get("planner/format_valid")
        if value is None:
            return []
        best = self._best_format
        if best is None or value > best[0]:
            self._best_format = best = (value, round_index)
        collapsed = best[0] >= 0.2 and value < 0.5 * best[0]
        was = self._streaks.get("format", 0) > 0
        if collapsed and not was:
            self._streaks["format"] = 1
            return [f"warning: planner/format_valid={format_value(value)} in round "
                    f"{round_index + 1}, down from {format_value(best[0])} in round "
                    f"{best[1] + 1}: the planner is losing the answer format, so its reward "
                    "falls to 0. Try a lower models.<planner>.lr, loss.kl_coef > 0 (a KL to "
                    "the warm start), or a larger format weight (rewards.planner)"]
        if was and value >= 0.75 * best[0]:
            self._streaks["format"] = 0
        return []
