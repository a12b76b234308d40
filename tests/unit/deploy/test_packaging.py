"""Installing like a Python package: `make setup` is the README's first step, pyproject takes
a torch range (the exact pin stays in the Makefile and the lock), and the optional parts are
extras. Before, pyproject pinned torch==2.13.0, so `pip install -e .` into a CUDA environment
replaced its torch, and the README offered only `make test` (every tier) or `make demo`."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]


def test_pyproject_takes_a_torch_range_and_has_the_extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch = next(Requirement(d) for d in project["dependencies"]
                 if Requirement(d).name == "torch")
    assert not any(spec.operator == "==" for spec in torch.specifier)
    assert "2.13.0" in torch.specifier and "2.6.0" in torch.specifier  # tested, oldest
    makefile_torch = re.search(r"^TORCH\s*:=\s*torch==(\S+)", (ROOT / "Makefile").read_text(),
                               re.M)[1]
    assert makefile_torch in torch.specifier
    assert {"dev", "vllm", "wandb"} <= set(project["optional-dependencies"])


def test_make_setup_is_the_first_step():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^setup: venv$", makefile, re.M)
    # the venv installs torch pinned first, then the lock
    recipe = makefile[makefile.index("$(STAMP): pyproject.toml"):]
    assert recipe.index("$(TORCH)") < recipe.index("-r requirements.lock")
    readme = (ROOT / "README.md").read_text()
    first_block = readme[readme.index("```bash"):]
    assert first_block.splitlines()[1].startswith("make setup")
    two = readme[readme.index("## Two commands"):]
    assert re.search(r"^make test ", two, re.M) and re.search(r"^make demo ", two, re.M)
