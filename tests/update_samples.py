"""Policy-update samples of random tokens, for the ``torchrun`` jobs of the rank tests
(``tests/unit/services/ranks_job.py``, ``tests/unit/training/ref_shard_job.py``) and the
tests that compare with them in one process. Importable from every test (``tests/`` is on
sys.path through the root conftest); the jobs put ``tests/`` on their path themselves."""

from __future__ import annotations

import random


def random_samples(n: int, seed: int = 0) -> list:
    """``n`` planner samples: rollouts 0 and 1 of queries ``q0``, ``q1``, ...; 8-16 tokens
    from 5-399, the first half prompt, the rest response with old log-probs -6; advantages
    uniform in [-1.5, 1.5]. The same ``seed`` gives the same samples (a smaller ``n``: the
    first of them)."""
    from mgrpo.training.scoring import Sample
    from mgrpo.types import Trajectory

    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(8, 16)
        prompt = length // 2
        out.append(Sample(Trajectory(
            traj_id=f"t{i}", round_id="r", query_id=f"q{i // 2}", rollout=i % 2,
            agent="planner", model="planner",
            input_ids=[rng.randint(5, 399) for _ in range(length)],
            response_mask=[0] * prompt + [1] * (length - prompt),
            old_logprobs=[0.0] * prompt + [-6.0] * (length - prompt)),
            rng.uniform(-1.5, 1.5), 0.0))
    return out
