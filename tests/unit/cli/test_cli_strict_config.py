"""Config typos are refused everywhere (YAML, ``--set``, the REST API), naming the nearest
valid key; before, ``kk: 4`` and ``loss: {eps_hgh: 0.3}`` ran with the defaults and exit 0."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from mgrpo.cli.main import app
from mgrpo.experiments.demo import DemoConfig
from mgrpo.services.api.schemas import RoundIn
from mgrpo.training.config_files import load_run_config
from mgrpo.validation import one_line

MODELS = {m: {"path": "/nowhere"} for m in ("planner", "searcher", "coder")}


def _config(tmp_path, **extra):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"models": MODELS, "out_dir": str(tmp_path / "out"),
                                    **extra}))
    return path


@pytest.mark.parametrize(("extra", "overrides", "where", "key", "guess"), [
    ({"kk": 4}, {}, "", "kk", "k"),
    ({"loss": {"eps_hgh": 0.3}}, {}, "loss: ", "eps_hgh", "eps_high"),
    ({}, {"loss.aggr": "x"}, "loss: ", "aggr", "agg"),
    ({}, {"models.planner.lrr": 1e-3}, "models.planner: ", "lrr", "lr"),
    ({"sampling": {"temprature": 0.5}}, {}, "sampling: ", "temprature", "temperature"),
])
def test_unknown_keys_are_refused_with_the_nearest_valid_key(tmp_path, extra, overrides,
                                                              where, key, guess):
    with pytest.raises(ValidationError) as caught:
        load_run_config(_config(tmp_path, **extra), overrides)
    line = one_line(caught.value)
    assert "\n" not in line
    assert line == f"invalid RunConfig: {where}unknown key '{key}' (did you mean '{guess}'?)"


def test_a_valid_config_still_loads(tmp_path):
    cfg = load_run_config(_config(tmp_path, k=4, loss={"eps_high": 0.3}), {"loss.agg":
                                                                           "seq-mean-token-mean"})
    assert (cfg.k, cfg.loss.eps_high, cfg.loss.agg) == (4, 0.3, "seq-mean-token-mean")


def test_set_into_a_scalar_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"--set k.x: 'k' is not a section"):
        load_run_config(_config(tmp_path, k=4), {"k.x": 1})


def test_cli_train_refuses_a_typo_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["train", "--config", str(_config(tmp_path)),
                                      "--set", "loss.aggr=x"])
    assert result.exit_code == 1
    assert "error: invalid RunConfig: loss: unknown key 'aggr' (did you mean 'agg'?)" \
        in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_other_config_models_are_strict_too():
    with pytest.raises(ValidationError, match=r"unknown key 'round' \(did you mean 'rounds'"):
        DemoConfig.model_validate({"round": 3})


def test_api_bodies_name_the_nearest_field():
    with pytest.raises(ValidationError, match=r"unknown key 'kk' \(did you mean 'k'\?\)"):
        RoundIn.model_validate({"kk": 4})


def test_misspelt_env_vars_are_named_with_the_nearest_setting():
    from mgrpo.services.process import SETTINGS_ENV
    from mgrpo.validation import unknown_env_vars

    environ = {"MGRPO_DATBASE_URL": "x", "MGRPO_DATABASE_URL": "y", "MGRPO_DEBUG": "1",
               "MGRPO_SANDBOX_MAX_QUEUE": "3", "MGRPO_TEST_BROKER_URL": "z", "PATH": "/bin"}
    assert unknown_env_vars(environ, SETTINGS_ENV) == [
        "environment variable MGRPO_DATBASE_URL is not a setting and is ignored (did you "
        "mean MGRPO_DATABASE_URL?)"]
