"""A trainer pass that a database outage interrupts is retried, so it is a WARNING without a
traceback and never says a round failed; any other failure of a pass is an ERROR with its
traceback."""

from __future__ import annotations

import logging

import sqlalchemy.exc

import mgrpo.store  # noqa: F401 - registers the database's errors as transient
from mgrpo.services.trainer.service import log_failed_pass


def _outage() -> Exception:
    return sqlalchemy.exc.OperationalError("SELECT 1", {}, ConnectionRefusedError(111))


def test_a_transient_failure_is_a_warning_and_no_round_failed(caplog):
    with caplog.at_level(logging.INFO, logger="mgrpo.services.trainer.service"):
        log_failed_pass("planner", _outage())
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    assert "no round failed" in record.getMessage()
    assert "round failed" not in record.getMessage().replace("no round failed", "")


def test_any_other_failure_is_an_error_with_its_traceback(caplog):
    with caplog.at_level(logging.INFO, logger="mgrpo.services.trainer.service"):
        log_failed_pass("planner", KeyError("group"))
    [record] = caplog.records
    assert record.levelno == logging.ERROR and record.exc_info is not None
