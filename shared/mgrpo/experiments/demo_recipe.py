"""One warm start per folder: the recipe a demo folder was built with, and the check that
a later `mgrpo demo` or `mgrpo ablate --demo-dir` on it asks for the same one.

A demo folder holds a benchmark, demonstrations and warm-started models, and finished RL
runs point at that benchmark. ``prepare`` reuses models it finds and saves the benchmark
again, so a second call with another recipe (another ``--config``, seed or test split)
would replace the benchmark those runs were evaluated on, and train on models built from
the first recipe without a word. :func:`claim` prevents that: it records the recipe in
``recipe.json`` on first use and refuses a different one later, before anything is written.

The recipe is every :class:`DemoConfig` field except those that only shape the RL rounds,
the evaluation or the CPU settings (``RL_ONLY``): those may change between calls on one
warm start (`mgrpo ablate --rounds`, the demo's `--set`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

RECIPE_FILE = "recipe.json"
RL_ONLY = frozenset({"out_dir", "rounds", "stages", "eval_stage", "queries_per_round", "k",
                     "lr", "eval_questions", "eval_every", "run_set", "threads",
                     "cpu_kernels"})


def recipe(cfg) -> dict:
    """The fields of ``cfg`` (a DemoConfig) that decide the benchmark, demonstrations and
    warm start, as JSON values."""
    return cfg.model_dump(mode="json", exclude=set(RL_ONLY))


def claim(cfg) -> None:
    """Record ``cfg``'s recipe in its folder, or check it against the one recorded there.
    Raises FileExistsError naming each field that differs. Two first calls at once: one
    creates the file (whole, by a hard link), the other then checks against it."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RECIPE_FILE
    mine = recipe(cfg)
    if not path.exists():
        fd, tmp = tempfile.mkstemp(prefix=f".{RECIPE_FILE}.", dir=out)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o644)  # readable by the services' user, as the models
            json.dump(mine, f, indent=2, sort_keys=True)
        try:
            os.link(tmp, path)  # fails if another call created it first
            return
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    theirs = json.loads(path.read_text())
    # Fields added to DemoConfig after the folder was built are not in its file: not checked.
    differ = [k for k in sorted(theirs) if k in mine and theirs[k] != mine[k]]
    if differ:
        what = "; ".join(f"{k}: {theirs[k]!r} there, {mine[k]!r} now" for k in differ)
        raise FileExistsError(
            f"{out} holds the warm start of another recipe ({what}): reusing it would "
            "replace the benchmark its runs were evaluated on. Pick another folder "
            "(--out, --demo-dir), pass the config it was built with, or delete it")
