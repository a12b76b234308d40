"""Every script of ``bench/`` that needs no RabbitMQ or PostgreSQL runs at a tiny size and
writes its result (the ones that do: ``tests/integration/bench``). Each is its own process,
as a person runs it; a test takes seconds on a quiet machine."""

from __future__ import annotations

import json
import py_compile

import pytest
import yaml
from bench_smoke import (
    HELPERS,
    ROOT,
    SERVICE_SCRIPTS,
    TESTED_ELSEWHERE,
    UNIT_SCRIPTS,
    bench_files,
    read_json,
    run_bench,
)

RANKS = ("--samples", "4", "--length", "8", "--micro-batch-size", "2", "--repeats", "1")
SFT = ("--sft-steps", "1")  # the cached warm start of round.py's harness, one SFT step


def test_every_bench_file_is_smoke_tested_or_a_helper():
    covered = set(UNIT_SCRIPTS) | set(SERVICE_SCRIPTS) | set(HELPERS) | set(TESTED_ELSEWHERE)
    assert bench_files() - covered == set(), "add the new bench script to tests/bench_smoke.py"
    assert covered <= bench_files()


@pytest.mark.parametrize("name", sorted(HELPERS))
def test_helpers_compile(name):
    py_compile.compile(str(ROOT / "bench" / name), doraise=True)


def test_kl_cost(tmp_path):
    out = run_bench("kl_cost.py", "--batch", "2", "--prompt", "4", "--generated", "4",
                    "--repeats", "1").stdout
    result = json.loads(out)
    assert result["update_s_with_kl"] > 0 and result["reference_weights_mb"] > 0


def test_shared_base_memory(tmp_path):
    run_bench("shared_base_memory.py", "--tiny", "--out", str(tmp_path / "r.json"))
    untied, tied = read_json(tmp_path / "r.json")["cases"]
    assert tied["tensor_storages"] < untied["tensor_storages"]


def test_weight_sync(tmp_path):
    run_bench("weight_sync.py", "--smoke", "--out", str(tmp_path / "r.json"))
    (row,) = read_json(tmp_path / "r.json")["sizes"]
    assert set(row["paths"]) == {"checkpoint_sha256", "checkpoint_crc32", "in_process"}
    assert all(r["max_abs_logprob_diff"] == 0.0 for r in row["paths"].values())


def test_engine(tmp_path):
    run_bench("engine.py", "--batch-sizes", "1", "--new-tokens", "2", "--repeats", "1",
              "--sampler-vocabs", "64", "--out", str(tmp_path / "r.json"))
    result = read_json(tmp_path / "r.json")
    assert [row["batch"] for row in result["results"]] == [1]
    assert [row["vocab"] for row in result["sampler"]] == [64]


def test_grpo_step_without_trl(tmp_path):
    run_bench("grpo_step.py", "--steps", "1", "-G", "2", "-P", "2", "-L", "4",
              "--trl-python", str(tmp_path / "no-trl"), "--out", str(tmp_path / "r.json"))
    result = read_json(tmp_path / "r.json")
    assert result["steps"] == 1 and result["trl"].startswith("not timed")


def test_cpu_kernels(tmp_path):
    run_bench("cpu_kernels.py", "--steps", "1", "-G", "2", "-P", "2", "-L", "4",
              "--out", str(tmp_path / "r.json"))
    assert read_json(tmp_path / "r.json")


def test_sandbox(tmp_path):
    run_bench("sandbox.py", "--calls", "2", "--threads", "1", "--out", str(tmp_path / "r.json"))
    result = read_json(tmp_path / "r.json")
    assert result["local_sequential"] and result["http_sequential"]


def test_trainer_ranks_fsdp(tmp_path):
    run_bench("trainer_ranks.py", *RANKS, "--setups", "2-fsdp",
              "--out", str(tmp_path / "r.json"))
    assert list(read_json(tmp_path / "r.json")["median_update_s"]) == ["2-fsdp"]


def test_scaling(tmp_path):
    run_bench("scaling.py", "--repeats", "1", "--base-b", "1", "--base-k", "2", "--ks", "2",
              "--bs", "1", *SFT, "--out", str(tmp_path / "r.json"))
    result = read_json(tmp_path / "r.json")
    assert {p["sub_agent_types"] for p in result["points"]} == {1, 2}


def test_team_round(tmp_path):
    run_bench("team_round.py", "--ks", "2", "--turns", "1", "--agents", "solo", "team",
              "--b", "1", "--max-new-tokens", "4", "--warmup", "0",
              "--out", str(tmp_path / "r.json"))
    result = read_json(tmp_path / "r.json")
    solo, team = result["rows"]
    # B x K x turns x roles candidates; the team does twice the solo agent's work
    assert (solo["candidates"], team["candidates"]) == (2, 4)
    assert (solo["ratio"]["work"], team["ratio"]["work"]) == (1.0, 2.0)
    assert solo["team_turns"] == team["team_turns"] == 1.0
    assert all(v > 0 for v in team["phases"].values()) and team["cpu_s"] > 0
    assert result["peak_rss_mb"] > 0


def test_async_round_embedded(tmp_path):
    run_bench("async_round.py", "--b", "1", "--k", "2", "--rounds", "1", "--repeats", "1",
              *SFT, "--out", str(tmp_path / "r.json"))
    result = read_json(tmp_path / "r.json")
    assert result["where"] == "embedded" and not result["failed"]
    assert {row["mode"] for row in result["rows"]} == {"sync", "async"}


def test_api_load(tmp_path):
    run_bench("api_load.py", "--clients", "1", "--seconds", "1", "--batch", "1",
              "--evaluation", "off", "--out", str(tmp_path / "r.json"))
    assert read_json(tmp_path / "r.json")


def test_update_mfu_tiny_shape(tmp_path):
    run_bench("update_mfu.py", "--smoke", "--out", str(tmp_path / "r.json"))
    result = read_json(tmp_path / "r.json")
    rows = result["rows"]
    assert result["shape"] == "tiny" and [(r["dtype"], r["variant"]) for r in rows] == [
        (d, v) for d in ("fp32", "bf16") for v in ("plain", "response", "chunked", "fast")]
    for row in rows:
        assert row["model_flops_per_cpu_s"] > 0 and row["matmul_peak_after"]["n"] == 128
        assert row["fraction_of_peak_cpu_needed"] < row["fraction_of_peak_cpu"]
        assert row["memory"]["peak_gb"] > 0 and row["speedup_over_plain"] > 0
    assert {"default", "foreach", "fused"} <= set(result["adam_step"])
    for row in (rows[3], rows[7]):  # the last variant of each dtype is profiled
        assert sum(row["profile"]["share_by_kind"].values()) == pytest.approx(1, abs=1e-3)


def test_demo_async_two_tiny_demos(tmp_path):
    tiny = {"demos_per_agent": 16, "n_train": 120, "n_test": 20, "vocab_size": 300,
            "sft_batch": 4, "sft_steps": {"planner": 2, "searcher": 2, "coder": 2},
            "train_entities": {"city": 8, "person": 10, "company": 6}, "rounds": 1,
            "queries_per_round": 2, "k": 2, "eval_questions": 4}
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(tiny))
    run_bench("demo_async.py", "--demo-config", str(tmp_path / "demo.yaml"),
              "--out", str(tmp_path / "runs"), "--result", str(tmp_path / "r.json"))
    result = read_json(tmp_path / "r.json")
    assert result["same_warm_start"] and set(result["arms"]) == {"sync", "async"}
