"""``verifier: exact | llm | "pkg.mod:function"`` and judges by import path: one registry for
every process; a verifier that raises or returns no number in [0, 1] scores 0 and is counted,
never a crashed round; a bad spec is refused in one line when the config is validated."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
from pydantic import ValidationError

from mgrpo.envs.judges import FunctionExpertJudge, Verdict
from mgrpo.envs.verifiers import FunctionVerifier, GuardedVerifier, register_verifier
from mgrpo.training.config import RunConfig
from mgrpo.training.judging import build_expert_judges, verifier_for_run
from mgrpo.training.rounds import judge_metrics
from mgrpo.training.scoring import score_episode
from mgrpo.validation import one_line

MODULE = '''
def contains(question, answer, gold):
    return float(gold.lower() in answer.lower())


def two_args(answer, gold):
    return 1.0


def expert(role, task, result):
    if result == "boom":
        raise KeyError(result)
    return 1.0 if result == task.upper() else 0.0
'''


@pytest.fixture
def acme(tmp_path, monkeypatch):
    (tmp_path / "acme_verify.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "acme_verify"
    sys.modules.pop("acme_verify", None)


def _cfg(tmp_path, **kw) -> RunConfig:
    models = {m: {"path": str(tmp_path / m)} for m in ("planner", "searcher", "coder")}
    return RunConfig.model_validate({"models": models, **kw})


def test_function_verifier_by_import_path_scores_with_the_question(acme, tmp_path):
    verifier = verifier_for_run(_cfg(tmp_path, verifier=f"{acme}:contains"))
    assert score_episode("It is Paris.", True, "paris", verifier, (0.1, 0.9),
                         question="capital?") == (1.0, pytest.approx(1.0))
    assert score_episode("Rome", True, "paris", verifier, (0.1, 0.9))[0] == 0.0
    assert verifier.errors == 0


def test_exact_is_the_default(tmp_path):
    verifier = verifier_for_run(_cfg(tmp_path))
    assert verifier.score("48,213.0", "48213") == 1.0 and verifier.score("x", "y") == 0.0


def test_a_raising_or_non_number_verifier_scores_zero_and_is_counted():
    answers = iter([RuntimeError("api down"), "yes", float("nan"), 1.5, np.float32(0.25), True])

    def flaky(question, answer, gold):
        value = next(answers)
        if isinstance(value, Exception):
            raise value
        return value

    verifier = GuardedVerifier(FunctionVerifier(flaky), "flaky")
    scores = [verifier.score("a", "g", "q") for _ in range(6)]
    assert scores == [0.0, 0.0, 0.0, 0.0, 0.25, 1.0]
    assert verifier.errors == 4
    assert sorted(verifier.reasons) == ["raised RuntimeError: api down", "returned 1.5, "
                                        "outside [0, 1]", "returned nan, outside [0, 1]",
                                        "returned str, not a number"]


@pytest.mark.parametrize("spec, found", [
    ("acme_verify:contain", "has no attribute 'contain'"),
    ("acme_nothere:contains", "no module named 'acme_nothere'"),
    ("acme_verify:two_args", "cannot take 3 positional arguments"),
    ("exactt", "not a verifier; use one of ['exact', 'llm']"),
])
def test_a_bad_verifier_spec_is_refused_in_one_line(acme, tmp_path, spec, found):
    with pytest.raises(ValidationError) as info:
        _cfg(tmp_path, verifier=spec)
    message = one_line(info.value)
    assert "\n" not in message and "verifier" in message and found in message


def test_llm_verifier_needs_its_model(tmp_path):
    with pytest.raises(ValidationError, match="verifier: llm needs `verifier_llm"):
        _cfg(tmp_path, verifier="llm")


def test_registered_verifier_by_name(tmp_path):
    @register_verifier("acme_exact_lower")
    def lower(question, answer, gold):
        return float(answer.lower() == gold.lower())

    verifier = verifier_for_run(_cfg(tmp_path, verifier="acme_exact_lower"))
    assert verifier.score("PARIS", "paris") == 1.0


def test_judge_by_import_path_counts_its_errors(acme, tmp_path, bench):
    cfg = _cfg(tmp_path, judges={"coder": {"kind": f"{acme}:expert"}})
    judges = build_expert_judges(cfg, bench)
    assert isinstance(judges.for_role("coder"), FunctionExpertJudge)
    verdicts = judges.verdicts("coder", [("abc", "ABC"), ("abc", "x"), ("abc", "boom")])
    assert verdicts == [Verdict(1.0), Verdict(0.0), Verdict(0.0, "error")]
    counts = {"ok": 2, "error": 1}
    assert judge_metrics("coder", counts)["coder/judge_errors"] == 1.0
    with pytest.raises(ValidationError, match="judges.coder.kind: 'acme_verify:contain'"):
        _cfg(tmp_path, judges={"coder": {"kind": f"{acme}:contain"}})


class _YesToOstra:
    """An engine that grades like a judge: yes when the prompt's prediction says Ostra."""

    def __init__(self, tokenizer):
        self.tokenizer, self.prompts = tokenizer, []

    def generate(self, requests):
        from mgrpo.engines.base import Completion

        out = []
        for req in requests:
            prompt = self.tokenizer.decode(req.prompt_ids)
            self.prompts.append(prompt)
            text = "yes" if "Ostra" in prompt.rsplit("Predicted answer", 1)[-1] else "no"
            out.append(Completion(prompt_ids=list(req.prompt_ids), completion_ids=[1],
                                  logprobs=[0.0], text=text, finish_reason="stop"))
        return out


def test_llm_verifier_uses_the_named_model_engine(tmp_path):
    class Tok:
        def encode(self, text):
            return [ord(c) for c in text]

        def decode(self, ids):
            return "".join(chr(i) for i in ids)

    engine = _YesToOstra(Tok())
    cfg = _cfg(tmp_path, verifier="llm", verifier_llm={"model": "planner"})
    verifier = verifier_for_run(cfg, {"planner": (engine, Tok())})
    assert verifier.score("It is Ostra, I think", "ostra", "capital of Kelvar?") == 1.0
    assert verifier.score("Holm", "Ostra", "capital of Kelvar?") == 0.0
    assert "capital of Kelvar?" in engine.prompts[0] and verifier.errors == 0
