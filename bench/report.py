"""What the reports of ``team_round.py`` and ``round_scaling.py`` share: the load average as
recorded around a round, slopes rounded for the JSON, a row's progress line, and the result's
closing fields (this process's peak resident memory, the machine, the date, the argv) and its
write. ``bench/`` is not a package: the scripts put it on the path and import this."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

from round import machine
from scaling import slope


def load_avg() -> list[float]:
    """``os.getloadavg()`` to 2 decimals."""
    return [round(x, 2) for x in os.getloadavg()]


def fit(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of y on x (:func:`scaling.slope`) to 5 decimals; None with fewer
    than two distinct x."""
    value = slope(points)
    return None if value is None else round(value, 5)


def progress(row: dict, keys: tuple[str, ...]) -> None:
    """One JSON line of ``row``'s ``keys``, flushed: a long run shows each row as it ends."""
    print(json.dumps({key: row[key] for key in keys}), flush=True)


def write_result(result: dict, out: Path, argv: list[str] | None, rss_key: str) -> dict:
    """``result`` with this process's peak resident memory (MB) under ``rss_key``, the
    machine, the date (UTC) and the argv (``sys.argv[1:]`` when ``argv`` is None), written to
    ``out`` as JSON; its ``slopes`` printed. Returns it."""
    result = {**result,
              rss_key: round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "machine": machine(),
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "argv": sys.argv[1:] if argv is None else argv}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["slopes"], indent=1))
    return result
