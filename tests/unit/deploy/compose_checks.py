"""Checks on docker-compose.yml that need no Docker engine: schema and cross-references.

- :func:`interpolate` fills ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
  ``${VAR:?error}``, ``${VAR?error}`` and ``$$`` the way ``docker compose`` does, from the env
  file a user starts with (``.env.example``). A required variable missing there is an error.
- :func:`schema_errors` validates the interpolated file against the official compose-spec
  JSON schema, vendored in ``schemas/compose-spec.json`` (from check-jsonschema 0.39.0;
  Apache-2.0, ``schemas/LICENSE.compose-spec``); nothing is downloaded.
- :func:`cross_reference_errors` checks what the schema cannot: every ``depends_on`` target,
  named volume, network, env file, bind-mounted file and build target exists; health
  conditions point at services with a healthcheck; every ``MGRPO_*`` variable is a field of
  :class:`mgrpo.config.Settings`; each service has the settings its command needs, and the
  hosts in its URLs are services it shares a network with.

What it does NOT do: build images, start containers, or check that RabbitMQ/Postgres accept
the credentials (only that the same variables feed both sides).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema

SCHEMA_PATH = Path(__file__).parent / "schemas" / "compose-spec.json"
_VAR = re.compile(r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?])?(?P<arg>[^}]*)\})")

# Settings each mgrpo command needs (beyond MGRPO_MODE=distributed), by `mgrpo serve` target.
REQUIRED_SETTINGS: dict[str, set[str]] = {
    "db upgrade": {"MGRPO_DATABASE_URL"},
    "serve planner": {"MGRPO_DATABASE_URL", "MGRPO_BROKER_URL", "MGRPO_API_TOKEN",
                      "MGRPO_CHECKPOINT_URI", "MGRPO_MODELS_DIR"},
    "serve planner-worker": {"MGRPO_DATABASE_URL", "MGRPO_BROKER_URL", "MGRPO_CHECKPOINT_URI",
                             "MGRPO_MODELS_DIR"},
    "serve subagent": {"MGRPO_BROKER_URL", "MGRPO_SANDBOX_URL", "MGRPO_CHECKPOINT_URI",
                       "MGRPO_MODELS_DIR"},
    "serve trainer": {"MGRPO_DATABASE_URL", "MGRPO_BROKER_URL", "MGRPO_CHECKPOINT_URI",
                      "MGRPO_MODELS_DIR"},
    "serve control": {"MGRPO_DATABASE_URL", "MGRPO_BROKER_URL", "MGRPO_CHECKPOINT_URI"},
    "serve sandbox": set(),
}
URL_SETTINGS = ("MGRPO_DATABASE_URL", "MGRPO_BROKER_URL", "MGRPO_SANDBOX_URL")


def read_env_file(path: Path) -> dict[str, str]:
    """Parse a ``KEY=value`` env file (comments and blank lines skipped)."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"{path}: line {line!r} is not KEY=value")
            env[key.strip()] = value.strip()
    return env


def interpolate(node: Any, env: dict[str, str]) -> Any:
    """Return ``node`` with every ``${...}`` filled from ``env``; raises on a missing ``:?``."""
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, env) for value in node]
    if not isinstance(node, str):
        return node

    def fill(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match["name"], match["op"], match["arg"]
        value = env.get(name)
        unset_or_empty = value is None or (value == "" and op and op.startswith(":"))
        if op in (":-", "-"):
            return arg if unset_or_empty else value
        if op in (":?", "?"):
            if unset_or_empty:
                raise KeyError(f"required variable {name} is not set ({arg})")
            return value
        if op is None and not arg:
            return value or ""
        raise ValueError(f"unsupported interpolation {match.group(0)!r}")

    return _VAR.sub(fill, node)


def schema_errors(compose: dict) -> list[str]:
    """Messages of every compose-spec violation in the (interpolated) file; empty if valid."""
    schema = json.loads(SCHEMA_PATH.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{'/'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}"
            for error in validator.iter_errors(compose)]


def service_env(service: dict, root: Path) -> dict[str, str]:
    """The environment a container gets: env files (``X`` read from ``X.example`` if absent
    from the repository, as a fresh clone has it), then ``environment`` on top."""
    env: dict[str, str] = {}
    for path in _env_files(service):
        env.update(read_env_file(_existing_env_file(root, path)))
    environment = service.get("environment", {}) or {}
    if isinstance(environment, list):
        environment = dict(item.partition("=")[::2] for item in environment)
    env.update({key: str(value) for key, value in environment.items()})
    return env


def mgrpo_command(service: dict) -> str | None:
    """``'serve planner'``, ``'db upgrade'``... for a service whose command is ``mgrpo ...``."""
    command = service.get("command")
    if isinstance(command, list) and command and command[0] == "mgrpo":
        return " ".join(command[1:3])
    return None


def cross_reference_errors(compose: dict, root: Path, settings_fields: set[str],
                           dockerfile_stages: set[str]) -> list[str]:
    """Every dangling reference or missing setting in ``compose``, as readable messages."""
    services = compose.get("services", {})
    errors: list[str] = []
    for name, service in services.items():
        errors += _dependency_errors(name, service, services)
        errors += _volume_and_network_errors(name, service, compose, root)
        errors += _build_errors(name, service, root, dockerfile_stages)
        errors += _env_errors(name, service, services, root, settings_fields)
    return errors


def _env_files(service: dict) -> list[str]:
    files = service.get("env_file", [])
    files = [files] if isinstance(files, str) else files
    return [item if isinstance(item, str) else item["path"] for item in files]


def _existing_env_file(root: Path, path: str) -> Path:
    candidate = root / path
    return candidate if candidate.exists() else root / f"{path}.example"


def _dependency_errors(name: str, service: dict, services: dict) -> list[str]:
    errors = []
    depends = service.get("depends_on", {}) or {}
    depends = {dep: {"condition": "service_started"} for dep in depends} \
        if isinstance(depends, list) else depends
    for dep, spec in depends.items():
        if dep not in services:
            errors.append(f"{name}: depends_on {dep!r}, which is not a service")
            continue
        condition = spec.get("condition", "service_started")
        if condition == "service_healthy" and "healthcheck" not in services[dep]:
            errors.append(f"{name}: waits for {dep} to be healthy but {dep} has no healthcheck")
        if condition == "service_completed_successfully" and \
                services[dep].get("restart", "no") != "no":
            errors.append(f"{name}: waits for {dep} to complete but {dep} restarts "
                          f"({services[dep].get('restart')}); set restart: 'no' on it")
        if set(services[dep].get("profiles", [])) - set(service.get("profiles", [])):
            errors.append(f"{name}: depends on {dep}, which only runs in profiles "
                          f"{services[dep]['profiles']}")
    return errors


# Bind mounts whose host folder the user provides: the models and the benchmark.
USER_MOUNTS = ("/models", "/work/runs/bench")


def _volume_and_network_errors(name: str, service: dict, compose: dict,
                               root: Path) -> list[str]:
    errors = []
    for mount in service.get("volumes", []):
        source, _, rest = mount.partition(":") if isinstance(mount, str) else (
            mount.get("source", ""), "", mount.get("target", ""))
        target = rest.split(":")[0]
        if source.startswith((".", "/")):
            # The models and benchmark folders are the user's to provide (docs/deploy.md);
            # other binds ship.
            if target not in USER_MOUNTS and not (root / source).exists():
                errors.append(f"{name}: bind mount source {source} does not exist")
        elif source not in (compose.get("volumes") or {}):
            errors.append(f"{name}: named volume {source!r} is not declared under volumes:")
    for option in service.get("security_opt", []):
        kind, _, value = option.replace(":", "=", 1).partition("=")
        if kind == "seccomp" and value != "unconfined" and not (root / value).is_file():
            errors.append(f"{name}: seccomp profile {value} does not exist")
    for network in service.get("networks", []):
        if network not in (compose.get("networks") or {}):
            errors.append(f"{name}: network {network!r} is not declared under networks:")
    for path in _env_files(service):
        if not _existing_env_file(root, path).exists():
            errors.append(f"{name}: env_file {path} (or {path}.example) does not exist")
    return errors


def _build_errors(name: str, service: dict, root: Path, stages: set[str]) -> list[str]:
    build = service.get("build")
    if not build:
        return []
    errors = []
    dockerfile = root / build.get("context", ".") / build.get("dockerfile", "Dockerfile")
    if not dockerfile.exists():
        errors.append(f"{name}: dockerfile {dockerfile} does not exist")
    if build.get("target") and build["target"] not in stages:
        errors.append(f"{name}: build target {build['target']!r} is not a stage of "
                      f"{dockerfile.name} ({sorted(stages)})")
    return errors


def _env_errors(name: str, service: dict, services: dict, root: Path,
                settings_fields: set[str]) -> list[str]:
    command = mgrpo_command(service)
    if command is None:
        return []
    env = service_env(service, root)
    errors = [f"{name}: {key} is not a setting of mgrpo.config.Settings (typo?); valid: "
              f"{sorted(settings_fields)}"
              for key in env if key.startswith("MGRPO_") and key not in settings_fields]
    if env.get("MGRPO_MODE") != "distributed":
        errors.append(f"{name}: MGRPO_MODE is {env.get('MGRPO_MODE')!r}; must be distributed")
    if command not in REQUIRED_SETTINGS:
        return errors + [f"{name}: unknown mgrpo command {command!r}"]
    errors += [f"{name}: `mgrpo {command}` needs {key}, which neither its env_file nor its "
               "environment sets" for key in sorted(REQUIRED_SETTINGS[command] - set(env))]
    own_networks = set(service.get("networks", ["default"]))
    for key in URL_SETTINGS:
        if key in REQUIRED_SETTINGS[command] and key in env:
            host = urlparse(env[key]).hostname
            peer = services.get(host)
            if peer is None:
                errors.append(f"{name}: {key} points at host {host!r}, not a service")
            elif not own_networks & set(peer.get("networks", ["default"])):
                errors.append(f"{name}: {key} points at {host}, which shares no network with it")
    return errors
