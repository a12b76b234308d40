"""Admission control of the asynchronous mode: bounded staleness per model.

Rounds are trained in order, one update per trained model per round, so model ``m``'s
trainer trains round ``r`` at version ``v0_m + (r - r0)`` (``r0``: the pipeline's first
round, ``v0_m``: the model's version then). A sample of round ``r`` made by weights version
``v`` has staleness ``trainer version - v``. With a bound ``N_m`` the weights that sample
round ``r`` must be at least

    min_version(m, r) = v0_m + max(r - r0 - N_m, 0)

so round ``r`` may start sampling (is *admitted*) only once every trained model has
published that version; until then the sampler waits (it is paced; nothing it completed is
ever dropped). Rounds are admitted whole and in order, so no episode is favoured for being
fast. ``N = 0`` admits round ``r`` only after round ``r - 1`` is trained: the synchronous
round.

Two ways to pick the version a round samples with, both within the bound:
``"oldest"``: exactly ``min_version`` (deterministic: the same run samples the same weights
whatever the timing; embedded mode uses it); ``"latest"``: the newest published version
(what a worker that reloads every new checkpoint sees).

Pure: no threads, no clock, no I/O; the embedded pipeline (``mgrpo.training.pipeline``)
drives it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

VersionChoice = Literal["oldest", "latest"]


class StalenessExceeded(RuntimeError):
    """A sample older than its model's bound reached the trainer (a scheduling bug)."""


def staleness(trainer_version: int, sample_version: int) -> int:
    """How many updates the trainer is ahead of the weights that made a sample."""
    return trainer_version - sample_version


def worst_staleness(model: str, trainer_version: int, sample_versions: list[int],
                    bound: int) -> int:
    """The largest staleness of ``sample_versions`` for a trainer at ``trainer_version``
    (0 without samples); raises :class:`StalenessExceeded` above ``bound`` or for a sample
    of a version the trainer has not reached."""
    if not sample_versions:
        return 0
    worst = staleness(trainer_version, min(sample_versions))
    if worst > bound or staleness(trainer_version, max(sample_versions)) < 0:
        raise StalenessExceeded(
            f"{model}: samples of versions {sorted(set(sample_versions))} reached its trainer "
            f"at version {trainer_version}; staleness bound {bound}")
    return worst


@dataclass
class Admission:
    """Admission control for the trained models ``max_staleness`` (model -> N >= 0).

    ``first_round``: the first round of the pipeline; ``first_version``: each model's
    version when that round is trained (default 0)."""

    max_staleness: dict[str, int]
    first_round: int = 0
    first_version: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        bad = {m: n for m, n in self.max_staleness.items() if n < 0}
        if bad:
            raise ValueError(f"max_staleness {bad}: must be >= 0 (0 = synchronous rounds)")

    def train_version(self, model: str, round_index: int) -> int:
        """The version model ``model``'s trainer is at when it trains ``round_index``."""
        if round_index < self.first_round:
            raise ValueError(f"round {round_index} is before the pipeline's first round "
                             f"{self.first_round}")
        return self.first_version.get(model, 0) + round_index - self.first_round

    def min_version(self, model: str, round_index: int) -> int:
        """The oldest weights version that may sample ``round_index`` for ``model``."""
        n = self.max_staleness[model]
        return self.first_version.get(model, 0) + max(round_index - self.first_round - n, 0)

    def admitted(self, round_index: int, published: dict[str, int]) -> bool:
        """May ``round_index`` start sampling, given each model's newest published version?"""
        return all(published.get(m, -1) >= self.min_version(m, round_index)
                   for m in self.max_staleness)

    def sample_versions(self, round_index: int, published: dict[str, int],
                        choice: VersionChoice = "oldest") -> dict[str, int] | None:
        """The version each model samples ``round_index`` with, or None if not admitted."""
        if not self.admitted(round_index, published):
            return None
        if choice == "latest":
            return {m: published[m] for m in self.max_staleness}
        if choice != "oldest":
            raise ValueError(f"choice={choice!r}; valid: oldest, latest")
        return {m: self.min_version(m, round_index) for m in self.max_staleness}

    def check(self, model: str, round_index: int, sample_versions: list[int]) -> int:
        """The largest staleness of ``sample_versions`` when ``model`` trains
        ``round_index``; raises :class:`StalenessExceeded` above the bound (or for a sample
        from a version the trainer has not reached)."""
        return worst_staleness(f"{model} round {round_index}",
                               self.train_version(model, round_index), sample_versions,
                               self.max_staleness[model])

    def keep_from(self, model: str, next_round: int) -> int:
        """Versions of ``model`` older than this can no longer sample any round from
        ``next_round`` on (their weights may be freed)."""
        return self.min_version(model, next_round)
