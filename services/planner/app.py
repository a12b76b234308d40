"""Entry point of ``mgrpo serve planner``: the REST API (uvicorn). Thin: the app is
``mgrpo.services.api.app``."""

from __future__ import annotations

import logging

from mgrpo.config import Settings


def main(settings: Settings, host: str, port: int) -> None:
    import uvicorn

    from mgrpo.services.api.app import create_app
    from mgrpo.services.api.routes.health import embedded_problem
    from mgrpo.services.process import setup_logging

    setup_logging(settings, "planner")
    if (problem := embedded_problem(settings)) is not None:
        logging.getLogger("mgrpo.planner").warning(problem)
    uvicorn.run(create_app(settings=settings), host=host, port=port,
                log_level=settings.log_level.lower(), log_config=None)  # our format
