"""One round, typed: the run config a round was started with plus what it trains and scores.

``start_round`` (services) and ``open_round`` (embedded) store a round's config as one JSON
object with the round: the run config's keys plus ``trained_models`` and ``scored_models``.
:meth:`RoundSpec.from_stored` parses it back where it leaves the store, and the parsed
:class:`RoundSpec` is passed on from there (``spec.run`` wherever a run config goes).

What this module does NOT do: read the store (callers hand it the stored dict) or decide
which models a round trains (``mgrpo.services.rounds.start_round`` does).
"""

from __future__ import annotations

from pydantic import Field

from mgrpo.training.config import RunConfig
from mgrpo.validation import StrictModel

ROUND_KEYS = ("trained_models", "scored_models")  # in a round's config, not a RunConfig's


class RoundSpec(StrictModel):
    run: RunConfig = Field(description="The run config the round was started with.")
    trained_models: list[str] = Field(
        default_factory=list, description="Models this round updates.")
    scored_models: list[str] = Field(
        default_factory=list, description="Models whose trajectories this round stores and "
        "scores: the trained ones and the frozen ones an agent plays (rewards, group "
        "statistics and metrics, no update).")

    @classmethod
    def of(cls, run: RunConfig, trained: list[str] | None = None,
           scored: list[str] | None = None) -> RoundSpec:
        """A round of ``run`` that trains ``trained`` and scores ``scored`` (default: the
        trained ones)."""
        trained = list(trained or [])
        return cls(run=run, trained_models=trained,
                   scored_models=list(scored) if scored is not None else trained)

    @classmethod
    def from_stored(cls, config: dict, default: RunConfig | None = None) -> RoundSpec | None:
        """Parse a round's (or a run's) stored config. One stored without a run config (no
        ``models``) takes ``default``'s, with its own trained/scored models; None when there
        is neither. A round stored without ``scored_models`` scores its trained models."""
        round_keys = {k: config[k] for k in ROUND_KEYS if k in config}
        if "models" in config:
            run = RunConfig.model_validate({k: v for k, v in config.items()
                                            if k not in ROUND_KEYS})
        elif default is not None:
            run = default
        else:
            return None
        return cls.of(run, round_keys.get("trained_models"), round_keys.get("scored_models"))

    def stored(self) -> dict:
        """The JSON object the store keeps with the round (what :meth:`from_stored` reads)."""
        return {**self.run.model_dump(mode="json"), "trained_models": self.trained_models,
                "scored_models": self.scored_models}

    def round_play(self, index: int) -> str:
        """How round ``index`` is played: the algorithm's ``play`` for a training round
        (index >= 0; ``tree``: AT-GRPO), ``episodes`` for a curriculum filter round
        (index < 0). The services' per-play tables are keyed by it."""
        return self.run.algo.play if index >= 0 else "episodes"

    def tasks_per_query(self, index: int, k: int) -> int:
        """Round ``index``'s tasks per query: the algorithm's for a training round (a tree
        round: one tree whose K candidate slots are the rollouts), k episodes for a
        curriculum filter round (index < 0)."""
        return self.run.algo.tasks_per_query(k) if index >= 0 else k


def run_config_of(run) -> RunConfig | None:
    """The run config a stored run (a ``RunRecord``, or None) was created with; None for no
    run or a run stored without one. A stored config this library cannot read raises
    pydantic's ``ValidationError``."""
    spec = RoundSpec.from_stored(run.config) if run is not None else None
    return spec.run if spec is not None else None
