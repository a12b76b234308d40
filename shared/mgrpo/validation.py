"""Strict config models: an unknown key is an error that names the nearest valid key.

A misspelt option (``kk: 4``, ``loss: {eps_hgh: 0.3}``) silently falling back to its default
is the worst kind of config bug: the run looks fine and measures the wrong thing. Every config
model of the project (the YAML run config, the demo and ablation configs, the REST API's input
bodies) derives from :class:`StrictModel`, so YAML files, ``--set`` overrides and request
bodies all refuse unknown keys the same way.

:func:`one_line` turns a pydantic ``ValidationError`` into the one line the CLI prints;
:func:`unknown_env_vars` names the ``MGRPO_*`` variables no settings class the caller hands it
reads.

What this module does NOT do: read files or environment variables (``mgrpo.config`` does, and
its ``Settings`` ignore unknown ``MGRPO_*`` variables on purpose: other settings classes and
the test harness share that prefix).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator


def nearest(key: str, valid: list[str]) -> str | None:
    """The valid key closest to ``key`` (difflib ratio >= 0.5), or None."""
    found = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    return found[0] if found else None


def unknown_key_message(key: str, valid: list[str],
                        aliases: dict[str, tuple[str, str]] | None = None) -> str:
    """``unknown key 'K' (...)``: another library's name for an option gets ours by name
    (``aliases``: foreign name -> (our key, whose name it is)), a typo the nearest key."""
    if aliases and key in aliases:
        ours, origin = aliases[key]
        return f"unknown key '{key}' ({origin}'s {key} is '{ours}' here)"
    guess = nearest(key, valid)
    hint = f"did you mean '{guess}'?" if guess else f"valid keys: {', '.join(sorted(valid))}"
    return f"unknown key '{key}' ({hint})"


class StrictModel(BaseModel):
    """A pydantic model that refuses unknown keys with a did-you-mean suggestion.
    ``key_aliases`` (a class attribute): other libraries' names of its options (TRL's
    ``learning_rate`` for ``lr``), named in the error as what they are here."""

    model_config = ConfigDict(extra="forbid")
    key_aliases: ClassVar[dict[str, tuple[str, str]]] = {}

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            valid = list(cls.model_fields)
            unknown = [k for k in data if isinstance(k, str) and k not in cls.model_fields]
            if unknown:
                raise ValueError("; ".join(unknown_key_message(k, valid, cls.key_aliases)
                                           for k in unknown))
        return data


def one_line(exc: ValidationError) -> str:
    """``loc: message`` of every error, joined on one line (pydantic's own text is several
    lines per error, with URLs)."""
    parts = []
    for error in exc.errors():
        loc = ".".join(str(p) for p in error["loc"])
        msg = error["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return f"invalid {exc.title}: " + "; ".join(parts)


# MGRPO_* variables that are not settings fields but are read on purpose.
OTHER_ENV_VARS = ("MGRPO_DEBUG", "MGRPO_PROGRESS", "MGRPO_QUIET", "MGRPO_SECRETS_DIR",
                  "MGRPO_REQUIRE_SERVICES")


def env_names(*settings: type[BaseModel]) -> set[str]:
    """The environment variables the settings classes ``settings`` read: each field's name
    after its class's ``env_prefix``, upper case."""
    return {f"{cls.model_config.get('env_prefix', '')}{name}".upper()
            for cls in settings for name in cls.model_fields}


def unknown_env_vars(environ: dict[str, str], known: Iterable[str]) -> list[str]:
    """One message per ``MGRPO_*`` variable of ``environ`` that is neither in ``known`` (the
    caller's settings classes' names, :func:`env_names`) nor in :data:`OTHER_ENV_VARS` (a
    typo such as ``MGRPO_DATBASE_URL`` would otherwise leave the default in force, silently).
    Services log these as warnings at start; they are not errors, since the settings classes
    share the prefix and the test harness adds its own (``MGRPO_TEST_*``)."""
    known = set(known) | set(OTHER_ENV_VARS)
    out = []
    for name in sorted(environ):
        if name.startswith("MGRPO_") and name not in known and not name.startswith(
                "MGRPO_TEST_"):
            guess = nearest(name, sorted(known))
            hint = f" (did you mean {guess}?)" if guess else ""
            out.append(f"environment variable {name} is not a setting and is ignored{hint}")
    return out
