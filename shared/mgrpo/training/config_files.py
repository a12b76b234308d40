"""Run config files as a user meets them: reading (a YAML error names the file), ``--set``
values (YAML), ``--rounds`` and ``--steps``, and which command a file belongs to.

Three kinds of YAML file configure a run: a run config
(:class:`~mgrpo.training.config.RunConfig`: ``mgrpo train``, ``eval``, ``up`` and the
services), and the experiments' demo config (``DemoConfig``: ``mgrpo demo`` and ``mgrpo
ablate``) and team ablation config (``TeamAblateConfig``, ``kind: turn_team``: ``mgrpo
ablate``), both read by :mod:`mgrpo.experiments.config_files`. Given to the wrong command, a
file would be answered with one ``unknown key`` per option; :func:`wrong_kind` says which
command it is for instead. It knows the experiments' kinds by their top-level keys
(:data:`KIND_KEYS`), not their models, so that reading a run config imports no experiment
(tests/unit/cli/test_cli_config_ergonomics.py checks the keys are the models' fields).

It sits above the run config model; none of the training loop imports it.

What this module does NOT do: define options (``mgrpo.training.config``), validate a demo or
team ablation config, ``mgrpo config check`` (:mod:`mgrpo.experiments.config_files`), or run
anything.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from mgrpo.training.config import RunConfig
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
from mgrpo.training.overrides import apply_overrides

COMMANDS = {"run": "`mgrpo train --config FILE`, also eval, up and the services' "
                   "MGRPO_RUN_CONFIG",
            "demo": "`mgrpo demo --config FILE` or `mgrpo ablate --config FILE`",
            "team ablation": "`mgrpo ablate --config FILE`"}


# kind -> (its model's name, its top-level keys); the experiments' kinds as plain data, so
# this module imports none of them (mgrpo.experiments.config_files holds their models)
KIND_KEYS: dict[str, tuple[str, frozenset[str]]] = {
    "run": ("RunConfig", frozenset(RunConfig.model_fields)),
    "demo": ("DemoConfig", frozenset({
        "out_dir", "seed", "stage", "demos_per_agent", "n_train", "planner_errors",
        "searcher_errors", "coder_errors", "tools", "sft_steps", "train_entities",
        "held_out_entities", "vocab_size", "n_test", "sft_batch", "rounds", "stages",
        "eval_stage", "queries_per_round", "k", "lr", "eval_questions", "eval_every",
        "threads", "cpu_kernels", "run_set"})),
    "team ablation": ("TeamAblateConfig", frozenset({
        "kind", "out_dir", "seeds", "test_tasks", "base", "arms", "baseline", "warm_start",
        "swap", "results_md"})),
}


def _unknown_keys(kind: str, data: dict) -> int:
    keys = KIND_KEYS[kind][1]
    return sum(1 for k in data if k not in keys)


def kind_of(data: dict) -> str | None:
    """``run``, ``demo`` or ``team ablation``: the config kind whose top-level keys the file
    uses (the one with the fewest unknown keys; ``kind: turn_team`` is a team ablation's, as
    ``mgrpo ablate`` reads it); None on a tie (e.g. only keys two kinds have)."""
    if data.get("kind") == "turn_team":
        return "team ablation"
    unknown = {kind: _unknown_keys(kind, data) for kind in KIND_KEYS}
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
                           f"are {KIND_KEYS[kind][0]}'s)", f"use it with {use}")


def run_path_fields(cfg: RunConfig) -> dict[str, str]:
    """The options of a validated run config that name files or folders that must exist
    before it runs: {option: path}. Output folders (out_dir) are not among them, nor
    ``bench_dir`` of a workflow that does not read the benchmark (a turn team's world)."""
    out: dict[str, str] = {}
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
    return out


def template_problems(cfg: RunConfig) -> list[str]:
    """Each local model whose tokenizer cannot play ``protocol.format: chat_template``
    (no template, one that drops ``tools=``, one that is not append-only): its turn format
    is built as a run builds it."""
    # on use: tokenizers load only for a chat_template config
    from mgrpo.envs.turn_formats import build_turn_format
    from mgrpo.models.loading import ModelLoadError, load_tokenizer

    problems = []
    for name, model in cfg.models.items():
        if "://" in model.path or not (Path(model.path) / "config.json").is_file():
            continue
        try:
            build_turn_format("chat_template", load_tokenizer(model.path),
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
