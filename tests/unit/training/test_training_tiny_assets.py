"""The warm-started tiny assets of the benchmarks and the services' parity tests
(``mgrpo.experiments.tiny_assets``): stage 1 SFTs the planner and the searcher only; stage 2's
demonstrations call the coder too, so its model is SFT'd as well."""

from __future__ import annotations

import json

import pytest

from mgrpo.experiments import tiny_assets


def test_stage_two_demonstrations_call_the_coder_and_train_it(tmp_path):
    paths = tiny_assets.prepare(tmp_path, sft_steps=1, stage=2)
    assert paths["coder"] == tmp_path / "coder" != paths["init"]
    assert (tmp_path / "coder" / "config.json").exists()
    summary = json.loads((tmp_path / "demos" / "summary.json").read_text())
    assert summary["stage"] == 2 and summary["records"]["coder"] > 0
    planner = (tmp_path / "demos" / "planner.jsonl").read_text()
    assert "<call>coder|" in planner and "<call>searcher|" in planner


def test_cache_key_and_roles_per_stage():
    assert tiny_assets.sft_roles(1) == ("planner", "searcher")
    assert tiny_assets.sft_roles(2) == ("planner", "searcher", "coder")
    assert tiny_assets.asset_key(5) == tiny_assets.asset_key(5, stage=1)
    assert tiny_assets.asset_key(5, stage=2) != tiny_assets.asset_key(5)
    with pytest.raises(ValueError):
        tiny_assets.sft_roles(3)
