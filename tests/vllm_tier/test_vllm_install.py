"""`make vllm-venv` is the one install step of vLLM in an embedded run: ``.venv-vllm`` runs
the whole of mgrpo (the store, bus, trainer and CLI from the main venv's packages, after its
own), while vLLM keeps its own pins; the main venv names that step when asked for vllm."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from vllm_process import vllm_env, vllm_venv

pytestmark = pytest.mark.heavy

PROBE = """
import json, sqlalchemy, kombu, celery, transformers, vllm
import mgrpo.cli.main, mgrpo.training.loop, mgrpo.store
from mgrpo.engines.registry import build_engine  # noqa: F401
print(json.dumps({"transformers": transformers.__version__, "vllm": vllm.__version__,
                  "transformers_file": transformers.__file__}))
"""


def test_the_vllm_venv_imports_all_of_mgrpo_with_vllms_own_pins():
    venv = vllm_venv()
    done = subprocess.run([str(venv / "bin" / "python"), "-c", PROBE], capture_output=True,
                          text=True, timeout=300, env=vllm_env())
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["transformers_file"].startswith(str(venv))  # vLLM's pin, not the main venv's
    major, minor = (int(p) for p in found["transformers"].split(".")[:2])
    assert (major, minor) < (5, 20)
    assert (venv / "bin" / "mgrpo").exists()


def test_the_main_venv_names_the_install_step_when_vllm_is_missing(monkeypatch):
    from mgrpo.engines import registry
    from mgrpo.engines.registry import EngineUnavailable, build_engine

    monkeypatch.setattr(registry.importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else object())
    with pytest.raises(EngineUnavailable) as info:
        build_engine("vllm", "unused")
    message = str(info.value)
    assert "\n" not in message and "make vllm-venv" in message
    assert ".venv-vllm/bin/mgrpo train" in message and sys.executable in message
