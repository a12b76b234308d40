"""Imported at start-up by a service process whose PYTHONPATH starts with this folder (the
trainer kill-point test, ``test_services_trainer_kill_points.py``). With
``MGRPO_TEST_KILL_AT`` = ``before_publish`` or ``after_publish`` and ``MGRPO_TEST_KILL_ROUND``
= a round id, the trainer SIGKILLs itself right before, or right after, it publishes that
round's group statistics (``mgrpo.services.trainer.round_training``): after its checkpoint is
recorded, before the round is marked done. Without ``MGRPO_TEST_KILL_AT`` it does nothing."""

import os

KILL_AT = os.environ.get("MGRPO_TEST_KILL_AT", "")

if KILL_AT:
    import signal

    import mgrpo.services.trainer.round_training as trainer_round

    if KILL_AT not in ("before_publish", "after_publish"):
        raise ValueError(f"MGRPO_TEST_KILL_AT={KILL_AT!r}: before_publish or after_publish")
    _publish = trainer_round.publish_stats
    _round = os.environ["MGRPO_TEST_KILL_ROUND"]

    def _publish_and_die(store, round_id, model, stats):
        if round_id == _round and KILL_AT == "before_publish":
            os.kill(os.getpid(), signal.SIGKILL)
        _publish(store, round_id, model, stats)
        if round_id == _round:
            os.kill(os.getpid(), signal.SIGKILL)

    trainer_round.publish_stats = _publish_and_die
