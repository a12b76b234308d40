"""The planner service's REST API (FastAPI): queries, rounds, evaluations, agents,
checkpoints, health. Build it with :func:`mgrpo.services.api.app.create_app`."""
