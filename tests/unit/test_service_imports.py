"""The services and a run config's reader load no experiment: importing their entry modules
in a fresh interpreter leaves no ``mgrpo.experiments`` module in ``sys.modules`` (the
experiments sit above the training loop: docs/architecture.md). The source-level check is
tests/unit/test_import_contracts.py; this one also sees imports through third parties,
plugins and ``importlib``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENTRY_MODULES = (
    "mgrpo.training.config_files",
    "mgrpo.services.context",
    "mgrpo.services.entrypoints",
    "mgrpo.services.planner.worker",
    "mgrpo.services.subagent.worker",
    "mgrpo.services.trainer.service",
    "mgrpo.services.control.tasks",
    "mgrpo.services.api.app",
)
PROBE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    importlib.import_module(name)
    out[name] = sorted(m for m in sys.modules
                       if m == "mgrpo.experiments" or m.startswith("mgrpo.experiments."))
print(json.dumps(out))
"""


def loaded_experiments(*modules: str) -> dict[str, list[str]]:
    """Module -> the experiment modules in ``sys.modules`` once it (and those before it)
    was imported, in a fresh interpreter."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "shared"), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", PROBE, *modules], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_service_entry_modules_import_no_experiment():
    loaded = loaded_experiments(*ENTRY_MODULES)
    assert list(loaded) == list(ENTRY_MODULES)
    first = next((name for name, found in loaded.items() if found), None)
    assert first is None, f"importing {first} loads {loaded[first]} (the services and the " \
        "run config's reader must not import mgrpo.experiments)"


def test_the_probe_sees_an_experiment_import():
    loaded = loaded_experiments("mgrpo.training.config", "mgrpo.experiments.demo_spread")
    assert loaded == {"mgrpo.training.config": [],
                      "mgrpo.experiments.demo_spread": ["mgrpo.experiments",
                                                        "mgrpo.experiments.demo_spread"]}
