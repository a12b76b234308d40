"""Checks on docker/Dockerfile and on the ``mgrpo`` commands the deployment files run.

- :func:`parse_stages` reads the multi-stage Dockerfile (continuation lines joined).
- :func:`image_errors`: every target the deployment builds runs as a non-root user, has a
  HEALTHCHECK (except the one-shot ``migrate``), and copies only files the ``.dockerignore``
  allow-list sends to the build; torch is pinned to the Makefile's version.
- :func:`check_cli_invocation`: resolves ``mgrpo serve planner --host ...`` against the real
  Typer/Click command tree and parses its options, without running it.

What it does NOT do: build an image (no Docker engine here), or run the commands.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

GLOBAL = "(global)"


def parse_stages(dockerfile: Path) -> dict[str, dict]:
    """``{stage: {"base": FROM image or stage, "instructions": [(KEYWORD, args), ...]}}``.

    The instructions before the first FROM (global ARGs) are under :data:`GLOBAL`."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    # ARGs before the first FROM are global; they live in a pseudo-stage.
    current: dict = {"base": None, "instructions": []}
    stages: dict[str, dict] = {GLOBAL: current}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--\S+\s+)*(\S+)\s+AS\s+(\S+)", args.strip(), re.I)
            if not match:
                raise ValueError(f"FROM without a stage name: {line!r}; name every stage")
            current = {"base": match[1], "instructions": []}
            stages[match[2]] = current
        else:
            current["instructions"].append((keyword, args.strip()))
    return stages


def stage_chain(stages: dict[str, dict], target: str) -> list[str]:
    """``target`` then its parent stages, nearest first."""
    chain = [target]
    while stages[chain[-1]]["base"] in stages:
        chain.append(stages[chain[-1]]["base"])
    return chain


def _last(stages: dict[str, dict], target: str, keyword: str) -> str | None:
    for stage in stage_chain(stages, target):
        for found, args in reversed(stages[stage]["instructions"]):
            if found == keyword:
                return args
    return None


def dockerignore_allowed(path: Path) -> set[str]:
    """Paths re-included (``!path``) after a leading ``**`` in an allow-list .dockerignore."""
    lines = [line.strip() for line in path.read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    if not lines or lines[0] != "**":
        raise ValueError(f"{path} must start with '**' (an allow-list); it starts {lines[:1]}")
    return {line[1:].rstrip("/") for line in lines if line.startswith("!")}


def image_errors(stages: dict[str, dict], targets: set[str], allowed: set[str],
                 torch_version: str) -> list[str]:
    """Problems of the Dockerfile for the given build ``targets``."""
    errors = []
    for target in sorted(targets):
        if target not in stages:
            errors.append(f"target {target!r} is not a stage of the Dockerfile")
            continue
        user = _last(stages, target, "USER")
        if user is None or user.split(":")[0] in ("0", "root"):
            errors.append(f"target {target}: runs as {user or 'root (no USER)'}; "
                          "add USER 10001:10001")
        if target != "migrate" and _last(stages, target, "HEALTHCHECK") is None:
            errors.append(f"target {target}: no HEALTHCHECK")
    for stage, spec in stages.items():
        for keyword, args in spec["instructions"]:
            if keyword == "COPY" and not args.startswith("--from"):
                for source in shlex.split(args)[:-1]:
                    if source.rstrip("/") not in allowed:
                        errors.append(f"stage {stage}: COPY {source} is excluded by "
                                      f".dockerignore (allowed: {sorted(allowed)})")
            if keyword == "ARG" and args.startswith("TORCH_VERSION="):
                pinned = args.split("=", 1)[1]
                if pinned != torch_version:
                    errors.append(f"TORCH_VERSION={pinned} but the Makefile pins torch=="
                                  f"{torch_version}; keep them equal")
    return errors


class CliUsageError(ValueError):
    """An existing ``mgrpo`` command rejected the options the deployment files pass it."""


def _is_group(command: object) -> bool:
    # Duck-typed: Typer >= 0.20 vendors its own click, whose classes are not click.Group.
    return hasattr(command, "get_command") and hasattr(command, "list_commands")


def _raised(error: BaseException, name: str) -> bool:
    return any(cls.__name__ == name for cls in type(error).__mro__)


def check_cli_invocation(root_command, argv: list[str]) -> str | None:
    """Resolve and parse ``argv`` (without ``mgrpo``) against the CLI; never runs it.

    ``root_command`` is ``typer.main.get_command(app)`` (a click-style command tree).
    Returns ``None`` when every command exists and the options parse, or the name of the
    first missing (sub)command as ``"mgrpo serve planner-worker"``. Raises
    :class:`CliUsageError` for an existing command given options it does not accept.
    """
    command, args, path = root_command, list(argv), ["mgrpo"]
    while _is_group(command) and args and not args[0].startswith("-"):
        name = args.pop(0)
        path.append(name)
        child = command.get_command(command.context_class(command), name)
        if child is None:
            return " ".join(path)
        command = child
    try:
        context = command.make_context(" ".join(path), args, resilient_parsing=False)
    except Exception as error:
        if _raised(error, "Exit"):  # --help and other eager exits: the options parsed
            return None
        if _raised(error, "UsageError"):
            raise CliUsageError(f"`{' '.join(path + args)}`: {error.format_message()}") \
                from error
        raise
    context.close()
    return None
