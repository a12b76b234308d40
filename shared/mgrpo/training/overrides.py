"""Overrides of a run config: ``--set key=value`` on the command line, a round's overrides at
``POST /v1/rounds`` and the control plane's start command, all by one rule.

Dotted keys reach into sections (``loss.rollout_is``), an integer into a list
(``stages.0.rounds``; the list's length appends an entry), and the result is validated again
as a whole (:func:`overridden`), so an override the run config refuses is refused.

What this module does NOT do: read config files (:mod:`mgrpo.training.config_files`).
"""

from __future__ import annotations

from mgrpo.training.config import RunConfig


def overridden(cfg: RunConfig, overrides: dict) -> RunConfig:
    """A new run config: ``cfg`` with ``overrides`` set (keys as :func:`apply_overrides`
    takes them), validated again as a whole, so an override the run config refuses raises
    pydantic's ``ValidationError`` (``model_copy(update=...)`` would keep it unchecked).
    ``cfg`` goes through its stored form (JSON), as a round's config does."""
    return RunConfig.model_validate(apply_overrides(cfg.model_dump(mode="json"), overrides))


def apply_overrides(data: dict, overrides: dict) -> dict:
    """``data`` (a run config's fields, changed in place and returned) with ``overrides``
    set: dotted keys (``loss.rollout_is``) reach into sections, as ``--set`` does, and an
    integer reaches into a list (``stages.0.rounds``; the list's length appends an entry).
    A list the data does not hold yet starts as the run config's default."""
    for dotted, value in overrides.items():
        node: dict | list = data
        *parents, leaf = dotted.split(".")
        for depth, key in enumerate(parents):
            missing = _missing_default(parents[:depth + 1])
            if isinstance(node, list):
                index = _list_index(dotted, key, node, allow_append=True)
                if index == len(node):
                    node.append({})
                node = node[index]
            else:
                if key not in node:
                    node[key] = missing
                node = node[key]
            if not isinstance(node, dict | list):
                raise ValueError(f"--set {dotted}: {key!r} is not a section (it is {node!r})")
        if isinstance(node, list):
            index = _list_index(dotted, leaf, node, allow_append=True)
            node[index:index + 1] = [value]
        else:
            node[leaf] = value
    return data


def _list_index(dotted: str, key: str, items: list, allow_append: bool) -> int:
    if not key.isdigit():
        raise ValueError(f"--set {dotted}: {key!r} is not an index of a list of "
                         f"{len(items)} (use 0..{len(items) - 1}, e.g. stages.0.rounds)")
    index = int(key)
    if index > len(items) or (index == len(items) and not allow_append):
        raise ValueError(f"--set {dotted}: index {index} is past the end of a list of "
                         f"{len(items)} (use 0..{len(items)}, {len(items)} appends)")
    return index


def _missing_default(parents: list[str]) -> dict | list:
    """What a section named by ``parents`` starts as when the data lacks it: the run
    config's default for a list field (``stages``), else an empty mapping."""
    if len(parents) == 1 and parents[0] in RunConfig.model_fields:
        default = RunConfig.model_fields[parents[0]].get_default(call_default_factory=True)
        if isinstance(default, list):
            return [item.model_dump() if hasattr(item, "model_dump") else item
                    for item in default]
    return {}
