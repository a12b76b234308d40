"""One logging set-up for every service: same format (uvicorn's loggers included), and
alembic / bm25s chatter quieted. Before, each service start logged seven alembic lines, a
bm25s DEBUG line at INFO, and the planner API printed uvicorn's own format."""

from __future__ import annotations

import subprocess
import sys

SNIPPET = """
import logging
from mgrpo.logs import setup_logging
setup_logging("planner", "INFO")
logging.getLogger("bm25s").setLevel(logging.DEBUG)   # what bm25s does to itself, later
logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
logging.getLogger("bm25s").debug("Building index from IDs objects")
logging.getLogger("bm25s").info("bm25s info")
logging.getLogger("uvicorn.error").info("Application startup complete.")
logging.getLogger("mgrpo.services.trainer.service").info("trained round 0")
logging.getLogger("alembic").warning("a real problem")
"""


def test_services_share_one_format_and_quiet_the_libraries():
    done = subprocess.run([sys.executable, "-c", SNIPPET], capture_output=True, text=True,
                          timeout=60, check=True)
    lines = [line.split(" ", 2)[2] for line in done.stderr.splitlines()]  # drop the time
    assert lines == ["planner INFO uvicorn.error: Application startup complete.",
                     "planner INFO mgrpo.services.trainer.service: trained round 0",
                     "planner WARNING alembic: a real problem"]
