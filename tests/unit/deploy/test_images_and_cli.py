"""docker/Dockerfile targets, and every `mgrpo` command the deployment files run exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
import yaml
from image_checks import (
    CliUsageError,
    check_cli_invocation,
    dockerignore_allowed,
    image_errors,
    parse_stages,
)
from kustomize_lite import render

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def torch_pin() -> str:
    return re.search(r"^TORCH\s*:=\s*torch==(\S+)", (ROOT / "Makefile").read_text(), re.M)[1]


def compose_services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def rendered_containers() -> list[dict]:
    containers = []
    for overlay in ("cpu", "gpu"):
        for obj in render(ROOT / "k8s" / "overlays" / overlay):
            if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
                containers += obj["spec"]["template"]["spec"]["containers"]
    return containers


def deployed_targets() -> set[str]:
    """Dockerfile targets that compose builds or that k8s runs (image mgrpo/<target>)."""
    targets = {s["build"]["target"] for s in compose_services().values() if "build" in s}
    for container in rendered_containers():
        name = container["image"].split(":")[0]
        if name.startswith("mgrpo/"):
            targets.add(name.removeprefix("mgrpo/"))
    return targets


def test_deployed_images_are_non_root_healthchecked_and_pinned():
    stages = parse_stages(DOCKERFILE)
    allowed = dockerignore_allowed(ROOT / ".dockerignore")
    assert deployed_targets() >= {"planner", "planner-worker", "subagent", "trainer",
                                  "trainer-cuda", "sandbox", "migrate", "control"}
    assert image_errors(stages, deployed_targets() | {"planner-cuda", "subagent-cuda",
                                                      "planner-worker-cuda"},
                        allowed, torch_pin()) == []
    for path in allowed:
        assert (ROOT / path).exists(), f".dockerignore re-includes {path}, which is missing"


def test_cuda_and_cpu_runtimes_take_torch_from_their_own_index():
    stages = parse_stages(DOCKERFILE)
    cpu = " ".join(args for _, args in stages["deps-cpu"]["instructions"])
    cuda = " ".join(args for _, args in stages["deps-cuda"]["instructions"])
    assert '--index-url "${TORCH_CPU_INDEX_URL}" "torch==${TORCH_VERSION}"' in cpu
    assert '--index-url "${TORCH_CUDA_INDEX_URL}" "torch==${TORCH_VERSION}"' in cuda
    assert "pip install --no-deps" in cpu and "pip install --no-deps" in cuda


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda text: text.replace("USER 10001:10001\n", ""), "runs as root"),
    (lambda text: text.replace("COPY shared /src/shared", "COPY tests /src/tests"),
     "COPY tests is excluded"),
    (lambda text: text.replace("ARG TORCH_VERSION=2.13.0", "ARG TORCH_VERSION=2.12.0"),
     "keep them equal"),
    (lambda text: re.sub(r"(FROM runtime-cpu AS sandbox\nEXPOSE 8080\n)HEALTHCHECK[^\n]*\n"
                         r"[^\n]*\n", r"\1", text), "target sandbox: no HEALTHCHECK"),
])
def test_image_check_rejects_a_broken_dockerfile(tmp_path, edit, expected):
    broken = tmp_path / "Dockerfile"
    broken.write_text(edit(DOCKERFILE.read_text()))
    errors = image_errors(parse_stages(broken), deployed_targets(),
                          dockerignore_allowed(ROOT / ".dockerignore"), torch_pin())
    assert any(expected in error for error in errors), errors


def mgrpo_invocations() -> list[tuple[str, ...]]:
    """Every distinct `mgrpo ...` argv in docker-compose.yml, k8s/ and the Dockerfile."""
    found = {tuple(s["command"]) for s in compose_services().values()
             if s.get("command", [None])[0] == "mgrpo"}
    found |= {tuple(c["command"]) for c in rendered_containers()
              if c.get("command", [None])[0] == "mgrpo"}
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith('CMD ["mgrpo"'):  # not the vllm target's python -m ...
            found.add(tuple(yaml.safe_load(line[4:])))
    return sorted(found)


def test_the_files_run_every_service_of_the_contract():
    heads = {argv[1:3] for argv in mgrpo_invocations()}
    assert heads >= {("db", "upgrade"), ("serve", "planner"), ("serve", "planner-worker"),
                     ("serve", "subagent"), ("serve", "trainer"), ("serve", "sandbox"),
                     ("serve", "control")}


@pytest.mark.parametrize("argv", mgrpo_invocations(), ids=" ".join)
def test_every_invoked_mgrpo_command_exists_and_parses(argv):
    from mgrpo.cli.main import app

    root = typer.main.get_command(app)
    try:
        missing = check_cli_invocation(root, list(argv[1:]))
    except CliUsageError as error:
        pytest.fail(f"{error} (fix the deployment files or the CLI)")
    if missing:
        # The service commands are being written in parallel (issue 7 contract); this turns
        # into a pass by itself once they land. A wrong name in our files stays visible here.
        pytest.xfail(f"`{missing}` is not in the CLI yet (contract command; see docs/deploy.md)")


def test_cli_check_finds_missing_commands_and_bad_options():
    app = typer.Typer()
    serve = typer.Typer()
    app.add_typer(serve, name="serve")

    @serve.command("sandbox")
    def sandbox(port: int = typer.Option(8090)) -> None:
        """A stand-in."""

    @app.command()
    def version() -> None:
        """A second command, so `serve` stays a group."""

    root = typer.main.get_command(app)
    assert check_cli_invocation(root, ["serve", "sandbox", "--port", "8080"]) is None
    assert check_cli_invocation(root, ["serve", "trainer"]) == "mgrpo serve trainer"
    with pytest.raises(CliUsageError, match="--prot"):
        check_cli_invocation(root, ["serve", "sandbox", "--prot", "8080"])
    with pytest.raises(CliUsageError, match="port"):
        check_cli_invocation(root, ["serve", "sandbox", "--port", "eighty"])
