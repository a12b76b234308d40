"""A trainer's ingestion (``trainer.<model>``): trajectory messages are taken in batches
(:func:`mgrpo.services.batching.consume_batches`, a prefetch window of :data:`INGEST_BATCH`)
and stored in ONE transaction per batch, a multi-row ``INSERT ... ON CONFLICT DO NOTHING``
keyed by traj_id + attempt (a redelivery adds no row, so no claim is recorded: the handler is
idempotent by itself), then acked. A trajectory of another model, of mismatched token arrays,
or a message of another kind is refused (dead-letter queue, with the reason); the rest of its
batch is stored. Round commands are accepted and only wake the trainer.

What this module does NOT do: decide readiness or train (``readiness``, ``trainer``).
"""

from __future__ import annotations

from collections.abc import Callable

from mgrpo.bus.messages import RoundCommand, TrajectoryMessage
from mgrpo.store.training import check_trajectory

INGEST_BATCH = 256  # prefetch window: trajectories ingested per store transaction at most
INGEST_LINGER_S = 0.02  # a batch is flushed once the queue is quiet this long (or full)


class TrajectoryIngest:
    """``handle_batch`` for ``consume_batches(..., claims=False)``; ``ingested()`` runs
    after every batch (the trainer's wake-up)."""

    def __init__(self, store, model: str, ingested: Callable[[], None] = lambda: None) -> None:
        self.store, self.model_name, self.ingested = store, model, ingested

    def handle_batch(self, messages: list) -> dict[int, str]:
        """Ingest a batch in ONE store transaction, then call ``ingested``. Returns the
        refused ones, {position: reason} (dead-lettered by ``consume_batches``)."""
        refused: dict[int, str] = {}
        trajs = []
        for i, message in enumerate(messages):
            try:
                traj = self._accept(message)
            except (TypeError, ValueError) as error:
                refused[i] = f"{type(error).__name__}: {error}"
                continue
            if traj is not None:
                trajs.append(traj)
        if trajs:
            self.store.ingest_trajectories(trajs)
        self.ingested()
        return refused

    def _accept(self, message):
        """The trajectory to ingest (None for a round command); raises for a poison one."""
        if isinstance(message, RoundCommand):
            return None
        if not isinstance(message, TrajectoryMessage):
            raise TypeError(f"trainer.{self.model_name} takes trajectory and round_command "
                            f"messages, got {message.kind!r}")
        traj = message.trajectory
        if traj.model != self.model_name:
            raise ValueError(f"trajectory {traj.traj_id!r} is of model {traj.model!r}, sent to "
                             f"trainer {self.model_name!r}; send it to trainer.{traj.model}")
        check_trajectory(traj)
        return traj
