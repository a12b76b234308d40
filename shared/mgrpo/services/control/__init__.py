"""The control plane as Celery tasks: checkpoint pruning (``mgrpo.services.checkpoints``),
dead-letter replays and round commands, run by ``mgrpo serve control`` (a Celery worker on
the ``mgrpo.control`` queue).

- :mod:`.tasks`: the control plane's tasks (typed payloads from
  ``mgrpo.bus.control``, late acks, retries with back-off for transient errors only, refused
  payloads dead-lettered with the reason). Tasks are sent with
  :func:`mgrpo.bus.app.send_control`.

The worker process (health server + Celery worker, solo pool) is
:func:`mgrpo.services.entrypoints.serve_control`.

What this room does NOT do: carry trajectories (the batching kombu consumers do:
``mgrpo.services.batching``) or train.
"""
