"""docker-compose.yml: compose-spec schema, cross-references, and that broken copies fail."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

import pytest
import yaml
from compose_checks import (
    cross_reference_errors,
    interpolate,
    read_env_file,
    schema_errors,
    service_env,
)
from image_checks import parse_stages

from mgrpo.config import Settings

ROOT = Path(__file__).resolve().parents[3]
SETTINGS_FIELDS = {f"MGRPO_{name.upper()}" for name in Settings.model_fields}
MODELS = ("planner", "searcher", "coder")


@lru_cache(maxsize=1)
def _compose() -> dict:
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return interpolate(raw, read_env_file(ROOT / ".env.example"))


def compose() -> dict:
    return copy.deepcopy(_compose())


def xref(doc: dict) -> list[str]:
    stages = set(parse_stages(ROOT / "docker" / "Dockerfile"))
    return cross_reference_errors(doc, ROOT, SETTINGS_FIELDS, stages)


def test_compose_file_matches_the_compose_spec_schema():
    assert schema_errors(compose()) == []


def test_compose_cross_references_resolve():
    assert xref(compose()) == []


def test_every_model_has_a_gpu_trainer_and_a_cpu_trainer():
    services = compose()["services"]
    for model in MODELS:
        gpu, cpu = services[f"trainer-{model}"], services[f"trainer-{model}-cpu"]
        assert gpu["profiles"] == ["gpu"] and cpu["profiles"] == ["cpu"]
        assert gpu["command"] == cpu["command"] == ["mgrpo", "serve", "trainer", "--model", model]
        devices = gpu["deploy"]["resources"]["reservations"]["devices"]
        assert devices == [{"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}]
        assert gpu["build"]["target"] == "trainer-cuda"
        assert "deploy" not in cpu and cpu["build"]["target"] == "trainer"
        assert gpu["environment"]["MGRPO_TRAINER_NPROC"] == "1"  # issue 13: torchrun ranks
        assert gpu["environment"]["MGRPO_MODE"] == "distributed"  # the shared env is kept
        assert "MGRPO_TRAINER_NPROC" not in cpu["environment"]
    profiled = {name for name, s in services.items() if "profiles" in s}
    assert profiled == {f"trainer-{m}{suffix}" for m in MODELS
                        for suffix in ("", "-cpu")} | {"prometheus", "grafana", "vllm-searcher"}


def test_startup_order_waits_for_healthy_store_and_finished_migration():
    services = compose()["services"]
    planner = services["planner"]["depends_on"]
    assert planner["migrate"] == {"condition": "service_completed_successfully"}
    assert planner["postgres"] == planner["rabbitmq"] == {"condition": "service_healthy"}
    assert services["migrate"]["command"] == ["mgrpo", "db", "upgrade"]
    assert services["subagent-coder"]["depends_on"]["sandbox"] == {"condition": "service_healthy"}


def test_rabbitmq_consumer_timeout_is_raised_and_mounted():
    conf = read_env_file(ROOT / "docker" / "rabbitmq" / "rabbitmq.conf")
    assert int(conf["consumer_timeout"]) == 4 * 3600 * 1000  # default is 30 min
    rabbit = compose()["services"]["rabbitmq"]
    assert rabbit["image"].endswith("-management")
    assert ("./docker/rabbitmq/rabbitmq.conf:/etc/rabbitmq/conf.d/20-mgrpo.conf:ro"
            in rabbit["volumes"])


def test_sandbox_gets_no_secrets_and_no_route_out():
    doc = compose()
    sandbox = doc["services"]["sandbox"]
    assert "env_file" not in sandbox
    assert service_env(sandbox, ROOT) == {"MGRPO_MODE": "distributed"}
    assert sandbox["networks"] == ["sandbox"] and doc["networks"]["sandbox"]["internal"] is True
    assert sandbox["read_only"] is True and sandbox["cap_drop"] == ["ALL"]


# Services that read the benchmark folder (bench_dir, default runs/bench under /work).
BENCH_READERS = ("planner", "planner-worker", "control", "subagent-searcher", "subagent-coder",
                 *(f"trainer-{m}{suffix}" for m in MODELS for suffix in ("", "-cpu")))


def test_every_service_that_reads_the_benchmark_mounts_it():
    """Without it the searcher crash-loops: 'runs/bench' is not a benchmark folder."""
    services = compose()["services"]
    for name in BENCH_READERS:
        assert "./runs/bench:/work/runs/bench:ro" in services[name]["volumes"], name
        assert services[name].get("working_dir", "/work") == "/work"
    assert "${DEPLOY_BENCH_DIR:-./runs/bench}" in (ROOT / "docker-compose.yml").read_text()
    assert "DEPLOY_BENCH_DIR=./runs/bench" in (ROOT / ".env.example").read_text()
    sandbox = services["sandbox"]
    assert not any("bench" in v for v in sandbox.get("volumes", [])), "the sandbox gets none"


def test_only_the_sandbox_gets_the_user_namespace_seccomp_profile():
    """bwrap's jail needs user namespaces, which Docker's default seccomp profile refuses
    without CAP_SYS_ADMIN: the sandbox (only) gets docker/sandbox-seccomp.json, and keeps
    every other hardening."""
    services = compose()["services"]
    sandbox = services["sandbox"]
    assert sandbox["security_opt"] == ["no-new-privileges:true",
                                       "seccomp=./docker/sandbox-seccomp.json",
                                       "systempaths=unconfined"]
    assert sandbox["cap_drop"] == ["ALL"] and "cap_add" not in sandbox
    assert sandbox["read_only"] is True and "privileged" not in sandbox
    assert int(sandbox["pids_limit"]) == 256
    for name, service in services.items():
        if name != "sandbox":
            assert not any(o.startswith(("seccomp", "systempaths"))
                           for o in service.get("security_opt", [])), name
    profile = json.loads((ROOT / "docker" / "sandbox-seccomp.json").read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    denied = {n for rule in profile["syscalls"] for n in rule["names"]
              if rule["action"] == "SCMP_ACT_ERRNO"}
    allowed_for_bwrap = {"unshare", "clone", "clone3", "setns", "mount", "umount2",
                         "pivot_root", "sethostname"}
    assert not denied & allowed_for_bwrap
    assert {"bpf", "keyctl", "ptrace", "userfaultfd", "perf_event_open", "io_uring_setup",
            "kexec_load", "init_module", "open_by_handle_at"} <= denied
    assert all(rule.get("errnoRet") == 1 for rule in profile["syscalls"])


def test_a_missing_secret_stops_compose_with_the_variable_named():
    env = read_env_file(ROOT / ".env.example")
    del env["POSTGRES_PASSWORD"]
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):
        interpolate(raw, env)


@pytest.mark.parametrize(("text", "env", "expected"), [
    ("${A}", {"A": "1"}, "1"),
    ("${A:-x}", {"A": ""}, "x"),
    ("${A-x}", {"A": ""}, ""),
    ("${A:-x}", {}, "x"),
    ("a$${B}c", {}, "a${B}c"),
    ("${A:?need A}", {"A": "ok"}, "ok"),
])
def test_interpolation_follows_compose_rules(text, env, expected):
    assert interpolate(text, env) == expected


# --- broken copies must be rejected ---------------------------------------------------------

def _set(doc: dict, path: str, value) -> dict:
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node[part]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return doc


@pytest.mark.parametrize(("path", "value", "expected"), [
    ("services.postgres.healthcheck.test", 5, "services/postgres/healthcheck/test"),
    ("services.planner.environment", 5, "services/planner/environment"),
    ("services.planner.dependson", ["postgres"], "dependson"),
    ("services.planner.ports", "8000:8000", "services/planner/ports"),
    ("volumes.checkpoints", "yes", "volumes/checkpoints"),
])
def test_schema_rejects_a_broken_copy(path, value, expected):
    errors = schema_errors(_set(compose(), path, value))
    assert errors and any(expected in error for error in errors), errors


@pytest.mark.parametrize(("path", "value", "expected"), [
    ("services.planner.depends_on.rabbit", {"condition": "service_healthy"},
     "depends_on 'rabbit', which is not a service"),
    ("services.sandbox.healthcheck", None, "sandbox has no healthcheck"),
    ("services.migrate.restart", "on-failure", "waits for migrate to complete"),
    ("services.planner.volumes", ["ckpts:/checkpoints"], "named volume 'ckpts'"),
    ("services.planner.networks", ["frontend"], "network 'frontend'"),
    ("services.planner.env_file", [], "needs MGRPO_API_TOKEN"),
    ("services.trainer-coder.environment.MGRPO_DATBASE_URL", "x", "MGRPO_DATBASE_URL is not"),
    ("services.trainer-coder.build.target", "trainer-cude", "build target 'trainer-cude'"),
    ("services.subagent-coder.networks", ["backend"], "MGRPO_SANDBOX_URL points at sandbox"),
    ("services.rabbitmq.volumes", ["./docker/rabbitmq/missing.conf:/etc/x.conf:ro"],
     "missing.conf does not exist"),
    ("services.planner.depends_on.trainer-coder", {"condition": "service_healthy"},
     "only runs in profiles"),
    ("services.sandbox.security_opt", ["seccomp=./docker/missing.json"],
     "seccomp profile ./docker/missing.json does not exist"),
])
def test_cross_reference_check_rejects_a_broken_copy(path, value, expected):
    errors = xref(_set(compose(), path, value))
    assert any(expected in error for error in errors), errors


def test_workers_have_replicas_and_trainers_stay_one_per_model():
    """Issue 13: planner and sub-agent workers scale by ``deploy.replicas`` (.env.example
    sets 1; ``--scale`` or the DEPLOY_*_WORKERS variables raise it); no trainer has replicas
    (one per model; a second one would only wait on the store lease)."""
    services = compose()["services"]
    for name in ("planner-worker", "subagent-searcher", "subagent-coder"):
        assert int(services[name]["deploy"]["replicas"]) == 1, name
    raw = (ROOT / "docker-compose.yml").read_text()
    for var in ("DEPLOY_PLANNER_WORKERS", "DEPLOY_SEARCHER_WORKERS", "DEPLOY_CODER_WORKERS"):
        assert f"${{{var}:-1}}" in raw and f"{var}=1" in (ROOT / ".env.example").read_text()
    for name, service in services.items():
        if name.startswith("trainer-"):
            assert "replicas" not in service.get("deploy", {}), name
            assert "container_name" not in service


def gpu_rank_errors(doc: dict) -> list[str]:
    """A gpu trainer whose torchrun ranks (MGRPO_TRAINER_NPROC) differ from its GPUs."""
    errors = []
    for name, service in doc["services"].items():
        nproc = (service.get("environment") or {}).get("MGRPO_TRAINER_NPROC")
        if nproc is None:
            continue
        devices = service["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        if int(nproc) != len(devices):
            errors.append(f"{name}: {nproc} ranks on {len(devices)} GPUs {devices}")
    return errors


def test_multi_gpu_trainer_ranks_match_its_gpus():
    """Issue 13: DEPLOY_TRAINER_NPROC_PLANNER=2 without a second GPU in device_ids is caught;
    with two listed it passes."""
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    env = {**read_env_file(ROOT / ".env.example"), "DEPLOY_TRAINER_NPROC_PLANNER": "2"}
    assert gpu_rank_errors(compose()) == []
    doc = interpolate(copy.deepcopy(raw), env)
    assert gpu_rank_errors(doc) == ["trainer-planner: 2 ranks on 1 GPUs ['0']"]
    doc["services"]["trainer-planner"]["deploy"]["resources"]["reservations"]["devices"][0][
        "device_ids"] = ["0", "1"]
    assert gpu_rank_errors(doc) == [] and schema_errors(doc) == []


def test_the_no_docker_hub_override_only_swaps_images_and_adds_the_relay():
    """docker/test/compose.live.yml (docs/deploy.md, "A machine without Docker Hub"): valid
    compose, PostgreSQL and RabbitMQ from the local stand-ins (never pulled, their Dockerfiles
    shipped), probes of existing services, and one extra service: the sandbox relay."""
    raw = yaml.safe_load((ROOT / "docker" / "test" / "compose.live.yml").read_text())
    override = interpolate(raw, read_env_file(ROOT / ".env.example"))
    assert schema_errors(override) == []
    services = override["services"]
    assert set(services) - set(compose()["services"]) == {"sandbox-relay"}
    for name in ("postgres", "rabbitmq"):
        assert services[name]["image"] == f"local/{name}:bookworm"
        assert services[name]["pull_policy"] == "never"
        assert (ROOT / "docker" / "test" / name / "Dockerfile").is_file()
    relay = services["sandbox-relay"]
    assert relay["networks"] == ["sandbox", "relay"]
    assert all(p.startswith("127.0.0.1:") for p in relay["ports"])
    # the sandbox keeps its networks and hardening: only its probe interval changes
    assert set(services["sandbox"]) == {"healthcheck"}


def test_each_celery_queue_of_the_control_plane_has_a_worker():
    """mgrpo.control: the `control` service (`mgrpo serve control`); mgrpo.evaluations: the
    planner API's own worker, on with MGRPO_EVALUATION_QUEUE where it has a broker."""
    services = compose()["services"]
    serving = {name: service.get("command", [])[:3] for name, service in services.items()}
    assert [n for n, c in serving.items() if c == ["mgrpo", "serve", "control"]] == ["control"]
    assert [n for n, c in serving.items() if c == ["mgrpo", "serve", "planner"]] == ["planner"]
    env = service_env(services["planner"], ROOT)
    assert Settings(evaluation_queue=env["MGRPO_EVALUATION_QUEUE"]).evaluation_queue is True
    assert env["MGRPO_BROKER_URL"].startswith("amqp://")
    assert "MGRPO_EVALUATION_QUEUE" not in service_env(services["planner-worker"], ROOT)
