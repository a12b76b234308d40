"""The scripts of ``bench/`` that need the real RabbitMQ and PostgreSQL, each at a tiny size
as its own process (the rest: ``tests/unit/bench/test_bench_smoke.py``). A distributed round
starts every service as a process of its own: these take tens of seconds, not seconds."""

from __future__ import annotations

from bench_smoke import read_json, run_bench

SFT = ("--sft-steps", "1")  # the cached warm start of round.py's harness, one SFT step


def _urls(postgres_url: str, rabbitmq_url: str) -> tuple[str, ...]:
    return ("--postgres-url", postgres_url, "--broker-url", rabbitmq_url)


def test_round_both_modes(tmp_path, postgres_url, rabbitmq_url):
    run_bench("round.py", "--sizes", "1x2", "--repeats", "1", *SFT,
              *_urls(postgres_url, rabbitmq_url), "--out", str(tmp_path / "r.json"))
    [row] = read_json(tmp_path / "r.json")["rounds"]
    assert (row["B"], row["K"]) == (1, 2) and set(row["median_s"]) == {"embedded", "distributed"}


def test_async_round_distributed(tmp_path, postgres_url, rabbitmq_url):
    run_bench("async_round.py", "--distributed", "--b", "1", "--k", "2", "--rounds", "2",
              "--repeats", "1", *SFT, *_urls(postgres_url, rabbitmq_url),
              "--out", str(tmp_path / "r.json"))
    result = read_json(tmp_path / "r.json")
    assert result["where"] == "distributed" and result["failed"] == []
    assert {row["mode"] for row in result["rows"]} == {"sync", "async"}


def test_ingest(tmp_path, postgres_url, rabbitmq_url):
    run_bench("ingest.py", "--messages", "10", "--tokens", "8", "--compare",
              "--compare-messages", "5", "--out", str(tmp_path / "r.json"),
              env={"MGRPO_DATABASE_URL": postgres_url, "MGRPO_BROKER_URL": rabbitmq_url})
    assert read_json(tmp_path / "r.json")


def test_publish(tmp_path, rabbitmq_url):
    run_bench("publish.py", "--sizes", "2", "--repeats", "2", "--tokens", "8",
              "--broker-url", rabbitmq_url, "--out", str(tmp_path / "r.json"))
    assert read_json(tmp_path / "r.json")


def test_round_scaling(tmp_path, postgres_url, rabbitmq_url):
    """At stage 2: the warm start whose demonstrations call both sub-agent types (round.py's
    test covers the stage-1 one)."""
    run_bench("round_scaling.py", "--sizes", "1x2", "--stage", "2", *SFT,
              *_urls(postgres_url, rabbitmq_url), "--out", str(tmp_path / "r.json"))
    result = read_json(tmp_path / "r.json")
    [row] = result["rows"]
    assert result["stage"] == 2 and set(row["delegations"]) == {"searcher", "coder"}
    assert row["episodes"] == 2 and "planner-worker" in row["processes"]
    assert all(p["peak_rss_mb"] > 0 for p in row["processes"].values())
    assert result["slopes"]["wall_s_per_episode"] is None  # one size: no slope


def test_fault_probe_hostile_scenarios(tmp_path, postgres_url, rabbitmq_url):
    """The probe's two hostile-input scenarios (the sweep's takes 85 s, the broker restart
    is its own test): exit 0, every hostile message a dead letter, trained as expected."""
    run_bench("fault_probe.py", "--skip", "concurrent_starts", "unpublished_round",
              "broker_restart", *SFT, *_urls(postgres_url, rabbitmq_url),
              "--out", str(tmp_path / "r.json"))
    result = read_json(tmp_path / "r.json")
    rows = result["scenarios"]
    assert set(rows) == {"poison", "hostile_trajectory"} and result["failures"] == []
    for row in rows.values():
        assert row["status"] == "done" and row["trained"] == row["expected"], row
        assert sum(row["hostile_dead_lettered"].values()) == row["hostile_sent"] == 3, row
