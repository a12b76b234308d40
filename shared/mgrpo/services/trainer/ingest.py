"""A trainer's ingestion (``trainer.<model>``): trajectory messages are taken in batches
(:func:`mgrpo.services.batching.consume_batches`, a prefetch window of :data:`INGEST_BATCH`)
and stored in ONE transaction per batch, a multi-row ``INSERT ... ON CONFLICT DO NOTHING``
keyed by traj_id + attempt (a redelivery adds no row, so no claim is recorded: the handler is
idempotent by itself), then acked. A trajectory of another model, of mismatched token arrays,
or a message of another kind is refused (dead-letter queue, with the reason); so is a
trajectory with a token id outside the model's vocabulary (``vocab_size``: its embedding rows,
known once the model is loaded), one longer than ``max_tokens``
(``models.<m>.max_trajectory_tokens``), and a DIFFERENT trajectory under an (id, attempt)
already stored (the stored one stays; a redelivery of the same one is only acked), and a
sub-agent trajectory of a completed rollout's completing attempt under a call number the
planner did not record as answered. The rest of its batch is stored. Round commands are
accepted and only wake the trainer.

What this module does NOT do: decide readiness or train (``readiness``, ``trainer``).
"""

from __future__ import annotations

from collections.abc import Callable

from mgrpo.bus.messages import RoundCommand, TrajectoryMessage
from mgrpo.services.trainer.readiness import unrecorded
from mgrpo.store.training import check_trajectory

INGEST_BATCH = 256  # prefetch window: trajectories ingested per store transaction at most
INGEST_LINGER_S = 0.02  # a batch is flushed once the queue is quiet this long (or full)


class TrajectoryIngest:
    """``handle_batch`` for ``consume_batches(..., claims=False)``; ``ingested()`` runs
    after every batch (the trainer's wake-up)."""

    def __init__(self, store, model: str, ingested: Callable[[], None] = lambda: None, *,
                 vocab_size: int | None = None, max_tokens: int | None = None) -> None:
        self.store, self.model_name, self.ingested = store, model, ingested
        self.vocab_size, self.max_tokens = vocab_size, max_tokens

    def handle_batch(self, messages: list) -> dict[int, str]:
        """Ingest a batch in ONE store transaction, then call ``ingested``. Returns the
        refused ones, {position: reason} (dead-lettered by ``consume_batches``)."""
        refused: dict[int, str] = {}
        trajs, positions = [], []
        for i, message in enumerate(messages):
            try:
                traj = self._accept(message)
            except (TypeError, ValueError) as error:
                refused[i] = f"{type(error).__name__}: {error}"
                continue
            if traj is not None:
                trajs.append(traj)
                positions.append(i)
        for j, reason in self._unrecorded(trajs).items():
            refused[positions[j]] = reason
        kept = [j for j in range(len(trajs)) if positions[j] not in refused]
        trajs, positions = [trajs[j] for j in kept], [positions[j] for j in kept]
        for j in self.store.ingest_trajectories_checked(trajs) if trajs else ():
            refused[positions[j]] = (
                f"ConflictingTrajectory: another trajectory is stored as "
                f"({trajs[j].traj_id!r}, attempt {trajs[j].attempt}); it is kept, this "
                "different one is refused")
        self.ingested()
        return refused

    def _unrecorded(self, trajs: list) -> dict[int, str]:
        """{index: reason} of the sub-agent trajectories of an attempt that completed its
        rollout under a call number the planner did not record as answered: they would never
        be trained (the trainer trains the recorded calls). One that arrives before its
        rollout completes is stored, and left out at training time with the same reason."""
        refused: dict[int, str] = {}
        by_agent: dict[str, list[int]] = {}
        for j, t in enumerate(trajs):
            if t.agent != "planner":
                by_agent.setdefault(t.agent, []).append(j)
        for agent, indices in by_agent.items():
            recorded = self.store.recorded_invocations(agent, [
                (trajs[j].round_id, trajs[j].query_id, trajs[j].rollout, trajs[j].attempt)
                for j in indices])
            for j in indices:
                t = trajs[j]
                answered = recorded.get((t.round_id, t.query_id, t.rollout, t.attempt))
                if answered is not None and t.invocation not in answered:
                    refused[j] = unrecorded(t, answered)
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
        if self.max_tokens is not None and len(traj.input_ids) > self.max_tokens:
            raise ValueError(f"trajectory {traj.traj_id!r} has {len(traj.input_ids)} tokens, "
                             f"over models.{self.model_name}.max_trajectory_tokens "
                             f"({self.max_tokens})")
        if traj.input_ids and self.vocab_size is not None:
            low, high = min(traj.input_ids), max(traj.input_ids)
            if low < 0 or high >= self.vocab_size:
                raise ValueError(f"trajectory {traj.traj_id!r} has token id "
                                 f"{low if low < 0 else high}, outside the vocabulary of "
                                 f"{self.model_name} (0..{self.vocab_size - 1})")
        return traj
