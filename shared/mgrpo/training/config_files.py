"""Config files as a user meets them: reading (a YAML error names the file), ``--set``
values (YAML), ``--rounds`` and ``--steps``, which command a file belongs to, and
``mgrpo config check``.

Three kinds of YAML file configure a run: a run config
(:class:`~mgrpo.training.config.RunConfig`: ``mgrpo train``, ``eval``, ``up`` and the
services), a demo config (:class:`~mgrpo.training.demo.DemoConfig`: ``mgrpo demo`` and
``mgrpo ablate``) and a team ablation config
(:class:`~mgrpo.training.team_ablate.TeamAblateConfig`, ``kind: turn_team``: ``mgrpo
ablate``). Given to the wrong command, a file would be answered with one ``unknown key`` per
option; :func:`wrong_kind` says which command it is for instead.

It sits above the config models; none imports it.

What this module does NOT do: define options (``mgrpo.training.config``) or run anything.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ValidationError

from mgrpo.training.config import RunConfig, apply_overrides
from mgrpo.training.config_yaml import (  # noqa: F401 - also read from here (cli, tests)
    PATH_OPTIONS,
    ConfigFileError,
    map_paths,
    parse_set_value,
    read_yaml,
    resolve_paths,
    rounds_for_steps,
    with_rounds,
)
from mgrpo.training.demo import DemoConfig
from mgrpo.training.team_ablate import TeamAblateConfig, load_team_ablate
from mgrpo.validation import one_line

COMMANDS = {"run": "`mgrpo train --config FILE`, also eval, up and the services' "
                   "MGRPO_RUN_CONFIG",
            "demo": "`mgrpo demo --config FILE` or `mgrpo ablate --config FILE`",
            "team ablation": "`mgrpo ablate --config FILE`"}


KINDS: dict[str, type[BaseModel]] = {"run": RunConfig, "demo": DemoConfig,
                                     "team ablation": TeamAblateConfig}


def _unknown_keys(model: type[BaseModel], data: dict) -> int:
    return sum(1 for k in data if k not in model.model_fields)


def kind_of(data: dict) -> str | None:
    """``run``, ``demo`` or ``team ablation``: the config kind whose top-level keys the file
    uses (the one with the fewest unknown keys; ``kind: turn_team`` is a team ablation's, as
    ``mgrpo ablate`` reads it); None on a tie (e.g. only keys two kinds have)."""
    if data.get("kind") == "turn_team":
        return "team ablation"
    unknown = {kind: _unknown_keys(model, data) for kind, model in KINDS.items()}
    best = min(unknown, key=unknown.get)
    if list(unknown.values()).count(unknown[best]) > 1:
        return None
    return best


def wrong_kind(path: str | Path, data: dict, expected: str) -> ConfigFileError | None:
    """The error for a file of another kind than ``expected``: it has fewer unknown keys as
    that other kind; None when it is ``expected``'s."""
    kind = kind_of(data)
    if kind is None or kind == expected:
        return None
    use = COMMANDS[kind].replace("FILE", str(path))
    return ConfigFileError(f"{path} is a {kind} config, not a {expected} config (its keys "
                           f"are {KINDS[kind].__name__}'s)", f"use it with {use}")


def path_fields(kind: str, cfg: BaseModel) -> dict[str, str]:
    """The options of a validated config that name files or folders that must exist
    before it runs: {option: path}. Output folders (out_dir) are not among them, nor
    ``bench_dir`` of a workflow that does not read the benchmark (a turn team's world)."""
    out: dict[str, str] = {}
    if kind == "run":
        for name, model in cfg.models.items():
            out[f"models.{name}.path"] = model.path
            if model.ref_path:
                out[f"models.{name}.ref_path"] = model.ref_path
        if cfg.flow.reads_bench:
            out["bench_dir"] = cfg.bench_dir
        for role, judge in cfg.judges.items():
            if judge.prompt:
                out[f"judges.{role}.prompt"] = judge.prompt
        llm = getattr(cfg, "verifier_llm", None)
        if llm is not None and getattr(llm, "prompt", None):
            out["verifier_llm.prompt"] = llm.prompt
        if cfg.init_from is not None and cfg.init_from.out_dir:
            out["init_from.out_dir"] = cfg.init_from.out_dir
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


def template_problems(cfg: RunConfig) -> list[str]:
    """Each local model whose tokenizer cannot play ``protocol.format: chat_template``
    (no template, one that drops ``tools=``, one that is not append-only): its turn format
    is built as a run builds it."""
    # on use: tokenizers load only for a chat_template config
    from mgrpo.envs.turn_formats import make_turn_format
    from mgrpo.models.loading import ModelLoadError, load_tokenizer

    problems = []
    for name, model in cfg.models.items():
        if "://" in model.path or not (Path(model.path) / "config.json").is_file():
            continue
        try:
            make_turn_format("chat_template", load_tokenizer(model.path),
                             cfg.protocol.tool_call_format, cfg.protocol.template_text())
        except (ValueError, ModelLoadError) as exc:
            problems.append(f"models.{name}.path: {exc}")
    return problems


def load_run_config(path: str | Path, overrides: dict | None = None) -> RunConfig:
    """Read a YAML run config; ``overrides`` (dotted keys) win over the file. Relative paths
    in the file are relative to its folder (those in ``overrides`` to the current one). A
    syntax error names the file; a demo config is refused as one (``mgrpo demo`` takes it)."""
    data = read_yaml(path)
    if wrong_kind(path, data, "run") is None:
        resolve_paths(data, path)
    try:
        return RunConfig.model_validate(apply_overrides(data, overrides or {}))
    except ValidationError:
        if (error := wrong_kind(path, data, "run")) is not None:
            raise error from None
        raise
