"""A user's turn-based team from outside the library: ``acme_task.team`` registers a world
(``acme_spell``) and a workflow (``acme_pair``); team.yaml alone trains one round of it (what
``mgrpo train --config`` runs), and a mistake in it is refused in one line."""

from __future__ import annotations

import csv
from pathlib import Path
from string import Template

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    from mgrpo.models import TinyModelConfig, init_tiny

    root = tmp_path_factory.mktemp("acme-team")
    tiny = init_tiny(root / "tiny", TinyModelConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, vocab_size=400))
    text = Template((HERE / "team.yaml").read_text()).substitute(tiny=tiny, out=root / "out")
    (root / "team.yaml").write_text(text)
    return root


def test_a_user_workflow_and_world_train_from_yaml(team):
    from mgrpo.training.config_files import load_run_config
    from mgrpo.training.loop import run_training

    # what `mgrpo train --config team.yaml` runs (tests/user_task/test_user_task.py runs the
    # command itself), in this process: no interpreter start-up
    result = run_training(load_run_config(team / "team.yaml"), progress=False)
    assert result.rounds == 1 and "eval/greedy/accuracy" in result.after
    with open(team / "out" / "metrics.csv") as f:
        metrics = {(int(r["round"]), r["key"]): float(r["value"]) for r in csv.DictReader(f)}
    # both roles' candidates trained the one shared model (K=4 per (task, role, turn))
    assert metrics[(0, "writer/samples")] >= 8 and metrics[(0, "reviewer/samples")] >= 8
    assert metrics[(0, "acme/grad_norm")] > 0  # the writer's graded reward differs across K
    assert (team / "out" / "checkpoints").is_dir()


@pytest.mark.parametrize("change,message", [
    (("alpha:", "alfa:"), "workflow: unknown key 'alfa' (did you mean 'alpha'?)"),
    (("acme_pair", "acme_pairs"), "unknown workflow 'acme_pairs'; valid: acme_pair, "),
    (("reviewer: acme", "critic: acme"), "workflow.roles ['critic', 'writer'] must name "
     "exactly the roles of world 'acme_spell': ['writer', 'reviewer']"),
])
def test_a_mistake_in_the_team_yaml_is_refused_in_one_line(team, change, message):
    from mgrpo.training.config_files import load_run_config
    from mgrpo.validation import one_line

    bad = team / "bad.yaml"
    bad.write_text((team / "team.yaml").read_text().replace(*change))
    with pytest.raises(ValueError) as raised:
        load_run_config(bad)
    line = one_line(raised.value)
    assert message in line and "\n" not in line
