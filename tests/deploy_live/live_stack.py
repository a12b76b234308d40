"""The live deployment tier's plumbing: the engine, the images, a project folder, compose.

A plain module (conftest files are not importable). The tier builds everything with
``docker/test/engine.sh`` and ``docker/test/build-images.sh``, the commands docs/deploy.md
gives for a machine without Docker Hub, so the documented path is the tested one.

Project folder: a copy of docker-compose.yml and the files it mounts, with its own ``.env``
(generated secrets, free ports), tiny models, a small benchmark and a run config, under the
engine's cache folder (never in the checkout: a developer's ``.env`` stays untouched).
The acting services (planner, workers, sub-agents) run the tests' scripted policy
(``services_testkit:scripted_engine``, mounted with the models), so a query delegates to
each sub-agent deterministically; the trainers train the real tiny models.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "tests" / "unit" / "services"
CACHE = Path(os.environ.get("MGRPO_DEPLOY_CACHE", "/var/cache/mgrpo-deploy"))
PROJECT_NAME = "mgrpo-live"
MODELS = ("planner", "searcher", "coder")
CPU_PROFILE_SERVICES = ("postgres", "rabbitmq", "planner", "planner-worker",
                        "subagent-searcher", "subagent-coder", "sandbox", "sandbox-relay",
                        *(f"trainer-{m}-cpu" for m in MODELS))


# pytest's capture manager (set by conftest.py): log() suspends it to reach the terminal.
CAPTURE = None


def log(message: str) -> None:
    """Straight to the terminal, past pytest's capture: the tier's phases and times."""
    suspended = CAPTURE.global_and_fixture_disabled() if CAPTURE else contextlib.nullcontext()
    with suspended:
        print(f"\ndeploy-live: {message}", file=sys.stderr, flush=True)


@dataclass
class Phases:
    times: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def __call__(self, name: str):
        log(f"{name} ...")
        start = time.monotonic()
        try:
            yield
        finally:
            self.times[name] = time.monotonic() - start
            log(f"{name}: {self.times[name]:.1f} s")


def why_no_engine() -> str | None:
    """Why this machine cannot run the tier, or None."""
    if os.environ.get("MGRPO_DEPLOY_LIVE") == "0":
        return "MGRPO_DEPLOY_LIVE=0"
    if sys.platform != "linux":
        return f"not Linux ({sys.platform})"
    if os.geteuid() != 0:
        return "not root: the tier installs and starts its own Docker engine"
    if not (shutil.which("dockerd") or shutil.which("apt-get")):
        return "no dockerd and no apt-get to install Debian's docker.io"
    if not Path("/proc/self/ns/user").exists() or not Path("/sys/fs/cgroup").is_dir():
        return "no namespaces or cgroups in this kernel"
    return None


def run(argv: list[str], env: dict | None = None, timeout: float = 1200,
        check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


class Engine:
    """docker/test/engine.sh: start (remembering whether this run started dockerd), stop."""

    script = ROOT / "docker" / "test" / "engine.sh"

    def __init__(self) -> None:
        self.env = os.environ | {"MGRPO_DEPLOY_CACHE": str(CACHE)}
        self.started = False

    def start(self) -> dict:
        self.started = run([self.script, "status"], env=self.env, check=False).returncode != 0
        exports = run([self.script, "start"], env=self.env, timeout=900).stdout
        env = dict(self.env)
        for line in exports.splitlines():
            for item in line.removeprefix("export ").split():
                key, _, value = item.partition("=")
                env[key] = value.replace("$PATH", os.environ["PATH"])
        self.env = env
        return env

    def stop(self) -> None:
        if self.started:
            run([self.script, "stop"], env=self.env, check=False, timeout=120)


def free_port() -> int:
    from mgrpo.services.launcher import free_port as pick

    return pick()


def write_project(folder: Path) -> dict[str, str]:
    """The compose project: files, .env, tiny models, benchmark, run config. Returns .env."""
    sys.path.insert(0, str(KIT))
    from services_testkit import make_bench, make_tiny

    if folder.exists():
        shutil.rmtree(folder)
    (folder / "docker" / "test").mkdir(parents=True)
    shutil.copy(ROOT / "docker-compose.yml", folder)
    shutil.copytree(ROOT / "docker" / "rabbitmq", folder / "docker" / "rabbitmq")
    shutil.copy(ROOT / "docker" / "sandbox-seccomp.json", folder / "docker")
    for name in ("compose.live.yml", "tcp_relay.py"):
        shutil.copy(ROOT / "docker" / "test" / name, folder / "docker" / "test")
    models = folder / "runs" / "models"
    tiny = make_tiny(folder / "tiny")
    for model in MODELS:
        shutil.copytree(tiny, models / model)
    make_bench(folder / "runs" / "bench")
    (models / "testkit").mkdir()
    shutil.copy(KIT / "services_testkit.py", models / "testkit")
    run_config = {"name": "live", "seed": 0, "k": 2, "queries_per_round": 3, "d": 2,
                  "models": {m: {"path": f"/models/{m}", "lr": 1e-3} for m in MODELS},
                  "bench_dir": "/work/runs/bench", "out_dir": "/tmp/out",
                  "sampling": {"planner_max_turns": 4, "subagent_max_turns": 2,
                               "max_new_tokens": 16}}
    (models / "run.yaml").write_text(yaml.safe_dump(run_config))
    for path in folder.rglob("*"):  # the services run as uid 10001 and read these
        path.chmod(0o755 if path.is_dir() else 0o644)
    env = {"COMPOSE_PROFILES": "cpu",
           "POSTGRES_PASSWORD": secrets.token_hex(12),
           "RABBITMQ_PASSWORD": secrets.token_hex(12),
           "MGRPO_API_TOKEN": secrets.token_hex(12),
           "DEPLOY_IMAGE_PREFIX": "mgrpo", "DEPLOY_IMAGE_TAG": "0.1.0",
           "DEPLOY_API_PORT": str(free_port()),
           "DEPLOY_RABBITMQ_UI_PORT": str(free_port()),
           "DEPLOY_TEST_PG_PORT": str(free_port()),
           "DEPLOY_TEST_SANDBOX_PORT": str(free_port()),
           "DEPLOY_MODELS_DIR": "./runs/models", "DEPLOY_BENCH_DIR": "./runs/bench",
           "MGRPO_RUN_CONFIG": "/models/run.yaml",
           "MGRPO_ENGINE": "services_testkit:scripted_engine",
           "DEPLOY_SEARCHER_ENGINE": "services_testkit:scripted_engine",
           "PYTHONPATH": "/models/testkit",
           "MGRPO_TRAINER_LEASE_S": "5",
           # the kill test starts a round while the searcher's trainer is stopped, on
           # purpose (its trajectories wait in its queue): POST /v1/rounds must create it
           "MGRPO_ROUND_NEEDS_WORKERS": "false",
           "MGRPO_LOG_LEVEL": "INFO"}
    (folder / ".env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return env


class Compose:
    """``docker compose`` on the project folder with the live override."""

    def __init__(self, folder: Path, engine_env: dict) -> None:
        self.folder, self.env = folder, engine_env | {"COMPOSE_PROFILES": "cpu"}

    def __call__(self, *args: str, timeout: float = 900, check: bool = True):
        if not (self.folder / "docker-compose.yml").exists():
            if check:
                raise RuntimeError(f"no compose project in {self.folder}")
            return subprocess.CompletedProcess(args, 0, "", "")
        return run(["docker", "compose", "-p", PROJECT_NAME, "-f", "docker-compose.yml",
                    "-f", "docker/test/compose.live.yml", *args],
                   env=self.env, cwd=self.folder, timeout=timeout, check=check)

    def up(self) -> None:
        proc = self("up", "-d", "--no-build", "--wait", check=False)
        if proc.returncode:
            raise RuntimeError(f"compose up --wait exited {proc.returncode}:\n"
                               f"{proc.stderr[-2000:]}\n{self.ps()}\n{self.logs()}")

    def ps(self) -> str:
        return self("ps", "-a", "--format", "table {{.Service}}\t{{.State}}\t{{.Status}}",
                    check=False).stdout

    def logs(self, *services: str, tail: int = 40) -> str:
        return self("logs", "--no-color", "--tail", str(tail), *services, check=False).stdout

    def container(self, service: str) -> str:
        return self("ps", "-q", service).stdout.split()[0]

    def docker(self, *args: str, check: bool = True):
        return run(["docker", *args], env=self.env, timeout=300, check=check)

    def memory_mib(self) -> dict[str, float]:
        """Resident memory per running container (docker stats), MiB."""
        out = self.docker("stats", "--no-stream", "--format", "{{.Name}}\t{{.MemUsage}}").stdout
        usage = {}
        for line in out.splitlines():
            name, mem = line.split("\t")
            if name.startswith(PROJECT_NAME):
                value = mem.split("/")[0].strip()
                number, unit = float(value.rstrip("KMGiB")), value.lstrip("0123456789.")
                usage[name] = number * {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}.get(unit, 0)
        return usage
