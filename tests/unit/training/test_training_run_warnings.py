"""The warnings a run logs besides RunWatch's (tests/unit/training/test_training_watch.py):
each on a case where it must fire and on one where it must not."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from mgrpo.envs.verifiers import GuardedVerifier
from mgrpo.training import numerics, rounds


@pytest.mark.parametrize(("counts", "phrase"), [
    ({"no_truth": 1, "ok": 1}, "have no ground truth"),
    ({"parse_failure": 1, "ok": 1}, "answered neither yes nor no"),
    ({"error": 1, "ok": 1}, "raised or returned no number"),
])
def test_judge_warnings(caplog, counts, phrase):
    rounds._warned_no_truth.discard("searcher")
    with caplog.at_level(logging.WARNING, logger="mgrpo.training.rounds"):
        rounds.judge_metrics("searcher", {"ok": 2})
    assert caplog.text == ""
    with caplog.at_level(logging.WARNING, logger="mgrpo.training.rounds"):
        rounds.judge_metrics("searcher", counts)
    assert phrase in caplog.text


def test_verifier_failure_warning(caplog):
    class Exact:
        def score(self, pred, gold, question=None):
            if pred == "boom":
                raise RuntimeError("bad")
            return float(pred == gold)

    verifier = GuardedVerifier(Exact(), "exact")
    with caplog.at_level(logging.WARNING, logger="mgrpo.envs.verifiers"):
        assert verifier.score("a", "a") == 1.0
    assert caplog.text == ""
    with caplog.at_level(logging.WARNING, logger="mgrpo.envs.verifiers"):
        assert verifier.score("boom", "a") == 0.0
    assert "verifier exact: raised RuntimeError: bad" in caplog.text


@pytest.mark.parametrize(("in_use", "warned"), [("AVX2", False), ("AVX512", True)])
def test_cpu_kernels_warning(caplog, monkeypatch, in_use, warned):
    import torch

    monkeypatch.setattr(numerics, "is_x86", lambda: True)
    monkeypatch.setattr(torch.backends, "cpu", SimpleNamespace(
        get_cpu_capability=lambda: in_use))
    for name in numerics.KERNEL_ENV["avx2"]:  # set by fix_numerics; restored after
        monkeypatch.setenv(name, "")
    with caplog.at_level(logging.WARNING, logger="mgrpo.training.numerics"):
        assert numerics.fix_numerics(None, "avx2") == in_use
    assert ("cpu kernels: wanted AVX2, torch uses AVX512" in caplog.text) == warned


def test_retry_warning(caplog):
    import httpx

    from mgrpo.retry import call_with_backoff

    with caplog.at_level(logging.WARNING, logger="mgrpo.retry"):
        assert call_with_backoff(lambda: 1, what="judge", sleep=lambda s: None) == 1
    assert caplog.text == ""
    failures = iter([httpx.ConnectError("refused")])

    def flaky():
        error = next(failures, None)
        if error is not None:
            raise error
        return 2

    with caplog.at_level(logging.WARNING, logger="mgrpo.retry"):
        assert call_with_backoff(flaky, what="judge", sleep=lambda s: None) == 2
    assert "judge failed (ConnectError: refused), attempt 1 of 5" in caplog.text
