"""Config values as a user writes them, before any config model reads them: a YAML file
(a syntax error names the file, line and column), the options that name files or folders
(relative to the file's folder), ``--set`` values (YAML), ``--rounds`` and ``--steps``.

Both config kinds use these (the run config, :mod:`mgrpo.training.config`, and the demo's,
:mod:`mgrpo.experiments.demo`), so they sit below both.

What this module does NOT do: know which options exist (the config models do) or which
command a file is for (:mod:`mgrpo.training.config_files`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml


class ConfigFileError(ValueError):
    """A config file that cannot be used as given: ``str()`` says what, ``hint`` the fix."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


def read_yaml(path: str | Path) -> dict:
    """The mapping of options in YAML file ``path`` (an empty file: {}). A syntax error
    names the file, line and column; a file that is not a mapping is refused."""
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigFileError(f"{path}{where}: YAML syntax error: {problem}",
                              "fix the YAML at that place (indentation, a ':' after each "
                              "key, quotes around text with ': ' or '#')") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a YAML mapping of options, got "
                              f"{type(data).__name__}", "write one `key: value` per line")
    return data


# The run config's options that name files or folders: (section path, key); "*" is every
# entry of a mapping. A relative value in a file is relative to the file's folder.
PATH_OPTIONS = ((("models", "*"), "path"), (("models", "*"), "ref_path"), ((), "bench_dir"),
                ((), "out_dir"), (("judges", "*"), "prompt"), (("verifier_llm",), "prompt"),
                (("init_from",), "out_dir"), (("protocol",), "chat_template_path"))


def _is_relative(value: Any) -> bool:
    return (isinstance(value, str) and bool(value) and "://" not in value
            and not value.startswith("~") and not Path(value).is_absolute())


def map_paths(data: dict, fn) -> dict:
    """``data`` (a run config's raw fields, changed in place and returned) with ``fn``
    applied to every relative path option (:data:`PATH_OPTIONS`)."""
    for section, key in PATH_OPTIONS:
        nodes = [data]
        for part in section:
            children = [c for n in nodes for c in (n.values() if part == "*" else [n.get(part)])]
            nodes = [c for c in children if isinstance(c, dict)]
        for node in nodes:
            if _is_relative(node.get(key)):
                node[key] = fn(node[key])
    return data


def resolve_paths(data: dict, config_file: str | Path) -> dict:
    """Relative path options of a config file made relative to the file's folder (still
    relative when the file's own path is: ``examples/run.yaml`` with ``../runs/bench`` gives
    ``runs/bench``)."""
    folder = os.path.dirname(str(config_file))
    return map_paths(data, lambda value: os.path.normpath(os.path.join(folder, value)))


def parse_set_value(text: str) -> Any:
    """A ``--set KEY=VALUE`` value, read as YAML: ``4`` an int, ``[1, 2]`` a list,
    ``{stage: 1, rounds: 2}`` a mapping, ``null`` None, anything else text. ``1e-3`` (text
    to YAML 1.1) is a number, as a user means it."""
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise ValueError(f"not a YAML value ({problem}); quote text that holds YAML "
                         "syntax, e.g. --set 'name=\"a: b\"'") from None
    if isinstance(value, str) and value == text.strip():
        try:
            number = json.loads(text)
        except json.JSONDecodeError:
            return value
        return number if isinstance(number, int | float) else value
    return value


def with_rounds(stages: list[dict], rounds: int) -> list[dict]:
    """The curriculum ``stages`` cut or stretched to ``rounds`` rounds in all (``--rounds``):
    stages in order until the total is reached (the stage it falls in is shortened, later
    ones dropped); more rounds than planned go to the last stage."""
    if rounds < 1:
        raise ValueError(f"--rounds {rounds}: give at least 1")
    out, left = [], rounds
    for stage in stages:
        if left == 0:
            break
        take = min(int(stage.get("rounds", 10)), left)
        out.append({**stage, "rounds": take})
        left -= take
    if left:
        out[-1]["rounds"] += left
    return out


def rounds_for_steps(per_round: dict[str, int], steps: int) -> int:
    """``--steps N``: the rounds that make N optimizer steps per trained model, given each
    model's steps per round (``mini_batches`` x ``ppo_epochs``). Refused (one line) when the
    models make different numbers of steps per round or N is not a multiple of them."""
    if steps < 1:
        raise ValueError(f"--steps {steps}: give at least 1")
    if not per_round:
        raise ValueError("--steps: no model is trained (every model has trainable: false)")
    if len(set(per_round.values())) > 1:
        each = ", ".join(f"{m} {n}" for m, n in sorted(per_round.items()))
        raise ValueError(f"--steps {steps}: the trained models make different numbers of "
                         f"optimizer steps per round ({each}: mini_batches x ppo_epochs); "
                         "give the run's length in rounds with --rounds")
    each = next(iter(per_round.values()))
    if steps % each:
        low, high = steps - steps % each, steps - steps % each + each
        nearest = f"--steps {low} or {high}" if low else f"--steps {high}"
        raise ValueError(f"--steps {steps} is not a multiple of the {each} optimizer steps a "
                         f"round makes per model (mini_batches x ppo_epochs); use {nearest}")
    return steps // each
