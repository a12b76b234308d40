"""``mgrpo compare`` (issue 17.6): arms' generated tokens per round, read from metrics.csv
(the metric, or tokens/s x rollout seconds for older runs), their accuracy after RL, and the
first arm minus the others paired on the same questions."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mgrpo.experiments.compare import compare_markdown, generated_tokens


def _run(tmp_path, name: str, greedy: dict[str, float], metrics: list[tuple]) -> str:
    out = tmp_path / name
    out.mkdir()
    (out / "eval_after_questions.json").write_text(json.dumps(
        {"greedy": greedy, "sampled": greedy}))
    rows = ["round,key,value"] + [f"{r},{k},{v}" for r, k, v in metrics]
    (out / "metrics.csv").write_text("\n".join(rows) + "\n")
    return str(out)


def test_generated_tokens_from_the_metric_or_rate_times_seconds(tmp_path):
    new = _run(tmp_path, "new", {}, [(0, "rollout/generated_tokens", 3000),
                                     (1, "rollout/generated_tokens", 5000)])
    old = _run(tmp_path, "old", {}, [(0, "throughput/tokens_per_s", 4000),
                                     (0, "time/rollout_s", 0.5),
                                     (1, "throughput/tokens_per_s", 2000),
                                     (1, "time/rollout_s", 2.0)])
    assert generated_tokens(new) == [3000, 5000]
    assert generated_tokens(old) == [2000, 4000]


def test_compare_table_and_paired_row(tmp_path):
    """The numbers of tests/unit/cli/test_cli_ablate_report.py: one question in 20 better,
    +0.05 with the interval [0, 0.15]."""
    easy = {f"q{i}": 1.0 for i in range(10)}
    base = {**easy, **{f"q{i}": 0.0 for i in range(10, 20)}}
    better = {**base, "q19": 1.0}
    tok = [(0, "rollout/generated_tokens", 1000), (1, "rollout/generated_tokens", 3000)]
    a = [_run(tmp_path, f"a{s}", better, tok) for s in range(2)]
    b = [_run(tmp_path, f"b{s}", base, [(0, "rollout/generated_tokens", 2100)])
         for s in range(2)]
    md = compare_markdown({"at-grpo": a, "m-grpo": b})
    assert "| at-grpo | 2 | 2000 (2000, 2000) | 0.550 | 0.550 |" in md
    assert "| m-grpo | 2 | 2100 (2100, 2100) | 0.500 | 0.500 |" in md
    assert "| at-grpo - m-grpo | greedy | +0.050 | [+0.000, +0.150] | no |" in md

    from mgrpo.cli.main import app

    out = tmp_path / "cmp.md"
    res = CliRunner().invoke(app, ["compare", "--arm", "at-grpo=" + ",".join(a),
                                   "--arm", "m-grpo=" + ",".join(b), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text() == md
    assert CliRunner().invoke(app, ["compare", "--arm", "x=" + a[0]]).exit_code != 0
