"""checkov on the rendered k8s manifests and hadolint on docker/Dockerfile: 0 findings.

Both tools live in their own venv (``make tools`` -> ``.venv-tools``: checkov's pins clash with
the main venv). Checks skipped for the whole repo are in ``.checkov.yaml``, checks skipped for
one object are ``checkov.io/skip*`` annotations, and each one is justified in docs/deploy.md;
the last test keeps that list and the docs in step. Without the tools the tests skip, except
in CI (``CI=true``), where a missing tool is a failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from kustomize_lite import render

ROOT = Path(__file__).resolve().parents[3]
TOOLS = ROOT / ".venv-tools" / "bin"
DOCS = ROOT / "docs" / "deploy.md"


def tool(name: str) -> Path:
    path = TOOLS / name
    if not path.exists():
        message = f"{path} missing: run `make tools` (creates .venv-tools with checkov, hadolint)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def skipped_checks() -> set[str]:
    """Every check id skipped repo-wide (.checkov.yaml) or per object (annotations)."""
    config = yaml.safe_load((ROOT / ".checkov.yaml").read_text())
    skipped = set(config.get("skip-check", []))
    for path in (ROOT / "k8s").rglob("*.yaml"):
        skipped |= set(re.findall(r"checkov\.io/skip\d+:\s*(CKV\w+)", path.read_text()))
    return skipped


def test_hadolint_finds_nothing_in_the_dockerfile():
    proc = subprocess.run([tool("hadolint"), "--no-color", ROOT / "docker" / "Dockerfile"],
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout + proc.stderr) == (0, "")


def test_checkov_finds_nothing_in_the_rendered_manifests(tmp_path):
    files = []
    for overlay in ("cpu", "gpu", "vllm-cpu"):
        files += ["-f", str(tmp_path / f"{overlay}.yaml")]
        with open(files[-1], "w") as f:
            yaml.safe_dump_all(render(ROOT / "k8s" / "overlays" / overlay), f)
    proc = subprocess.run(
        [tool("checkov"), "--config-file", ROOT / ".checkov.yaml", *files, "--quiet",
         "--compact", "--skip-download", "-o", "json"],
        capture_output=True, text=True, timeout=600, env=os.environ | {"LOG_LEVEL": "ERROR"})
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [f"{check['check_id']} {check['resource']}: {check['check_name']}"
              for report in reports for check in report["results"]["failed_checks"]]
    assert failed == []
    assert sum(report["summary"]["passed"] for report in reports) > 1000  # it did run


def test_every_skipped_check_is_justified_in_docs():
    docs = DOCS.read_text()
    assert sorted(c for c in skipped_checks() if c not in docs) == []
