"""The experiments' config files beside the run config: a demo config
(:class:`~mgrpo.experiments.demo.DemoConfig`: ``mgrpo demo`` and ``mgrpo ablate``), a team
ablation config (:class:`~mgrpo.experiments.team_ablate.TeamAblateConfig`, ``kind:
turn_team``: ``mgrpo ablate``), and ``mgrpo config check`` on any of the three kinds.

Reading a run config and telling which kind a file is are :mod:`mgrpo.training.config_files`'
(it knows the kinds here by their top-level keys only, so that it imports no experiment).

What this module does NOT do: define options (the config models do) or run anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ValidationError

from mgrpo.experiments.demo import DemoConfig
from mgrpo.experiments.team_ablate import TeamAblateConfig, load_team_ablate
from mgrpo.training.config import RunConfig
from mgrpo.training.config_files import (  # noqa: F401 - also read from here (cli, tests)
    COMMANDS,
    KIND_KEYS,
    ConfigFileError,
    kind_of,
    read_yaml,
    resolve_paths,
    run_path_fields,
    template_problems,
    wrong_kind,
)
from mgrpo.validation import one_line

KINDS: dict[str, type[BaseModel]] = {"run": RunConfig, "demo": DemoConfig,
                                     "team ablation": TeamAblateConfig}


def load_demo_config(path: str | Path | None, fields: dict) -> DemoConfig:
    """A DemoConfig of ``fields`` (read from ``path``, None when no file was given); a file
    of another kind (a run config) is refused as one."""
    try:
        return DemoConfig.model_validate(fields)
    except ValidationError:
        if path is not None and (error := wrong_kind(path, fields, "demo")) is not None:
            raise error from None
        raise


def path_fields(kind: str, cfg: BaseModel) -> dict[str, str]:
    """The options of a validated config that name files or folders that must exist
    before it runs: {option: path}. Output folders (out_dir) are not among them, nor
    ``bench_dir`` of a workflow that does not read the benchmark (a turn team's world)."""
    out: dict[str, str] = {}
    if kind == "run":
        out.update(run_path_fields(cfg))
    if kind == "team ablation":
        for where, section in [("base", cfg.base),
                               *((f"arms.{arm}", over) for arm, over in cfg.arms.items())]:
            for name, model in (section.get("models") or {}).items():
                if isinstance(model, dict) and isinstance(model.get("path"), str):
                    out[f"{where}.models.{name}.path"] = os.path.normpath(model["path"])
    return out


def check_file(path: str | Path) -> tuple[str, list[str]]:
    """``mgrpo config check``: (the file's kind, its problems): validation errors, then each
    path option whose file or folder does not exist (relative ones from the file's folder)."""
    data = read_yaml(path)
    kind = kind_of(data) or "run"
    if kind == "run":
        resolve_paths(data, path)
    try:
        cfg = (load_team_ablate(path, data) if kind == "team ablation"
               else KINDS[kind].model_validate(data))
    except ValidationError as exc:
        return kind, [one_line(exc)]
    problems = [f"{option}: {value} does not exist"
                for option, value in path_fields(kind, cfg).items()
                if "://" not in value and not Path(value).exists()]
    if kind == "run" and cfg.protocol.format == "chat_template":
        problems += template_problems(cfg)
    return kind, problems
