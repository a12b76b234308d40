"""How this host can isolate a sandboxed call: probe once, build the launcher command line.

Three modes, the strongest the host allows (``detect_isolation``):

- ``"root"``: we are uid 0 and ``unshare`` works. New mount, network and PID namespaces; the
  file system is hidden except /usr, /etc, /bin, /lib* (tmpfs over /tmp, /root, /home,
  /work, /var, ...) and what stays visible is remounted read-only; the code runs as a
  throw-away unprivileged uid, so RLIMIT_NPROC binds.
- ``"userns"``: not root, but unprivileged user namespaces work (``unshare --user``). New
  network and PID namespaces, fresh /proc; the file system is NOT hidden or frozen (the
  code runs as namespace-root over the host's mounts, with the caller's real permissions).
- ``"none"``: neither. rlimits, a scrubbed environment and a private work dir only. No
  network isolation, no file-system isolation, processes that call setsid() can outlive the
  call. A warning is logged once.

This module does not run code (:mod:`mgrpo.sandbox.local` does) and does not try bubblewrap
or cgroups (see docs/sandbox.md for why).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Literal

IsolationMode = Literal["root", "userns", "none"]

LAUNCHER = Path(__file__).with_name("_launcher.py")
# In "root" mode every other top-level entry (/root, /home, /work, /tmp, /var, /opt, /mnt,
# stray files like /container_info.json ...) is hidden behind an empty tmpfs or /dev/null.
VISIBLE_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev",
                     "proc", "sys")
JAIL_WORK_DIR = "/tmp/work"
_ROOT_FLAGS = ["--mount", "--net", "--pid", "--fork", "--kill-child", "--propagation", "private"]
_USERNS_FLAGS = ["--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child",
                 "--mount", "--mount-proc"]
NO_ISOLATION_MESSAGE = (
    "sandbox: no namespaces on this host (not root, and `unshare --user` failed): code runs "
    "with rlimits, a scrubbed environment and a private work dir only -- it CAN reach the "
    "network and read the files this user can read. Run as root or enable unprivileged user "
    "namespaces (sysctl kernel.unprivileged_userns_clone=1) for isolation; see docs/sandbox.md.")

log = logging.getLogger(__name__)


def python_executable() -> str:
    """The base interpreter (not a venv shim): -I -S means site-packages are never used."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def _probe(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@functools.lru_cache(maxsize=1)
def detect_isolation() -> IsolationMode:
    """The strongest mode this host supports (probed once per process, ~10 ms)."""
    unshare = shutil.which("unshare")
    if unshare and os.geteuid() == 0 and _probe([unshare, *_ROOT_FLAGS, "true"]):
        return "root"
    if unshare and _probe([unshare, *_USERNS_FLAGS, "true"]):
        return "userns"
    log.warning(NO_ISOLATION_MESSAGE)
    return "none"


def interpreter_dirs_to_keep(visible: tuple[str, ...] = VISIBLE_TOP_LEVEL) -> list[str]:
    """Interpreter prefixes outside the visible top-level dirs: re-exposed read-only.

    Example: pyenv's /root/.pyenv/versions/3.11.7 stays visible while the rest of /root is not.
    """
    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    keep = [p for p in sorted(prefixes) if p.split("/")[1] not in visible]
    return [p for i, p in enumerate(keep) if not any(p.startswith(k + "/") for k in keep[:i])]


def launcher_command(mode: IsolationMode, config_json: str) -> list[str]:
    """argv that starts the launcher under `mode`; the code goes to its stdin."""
    python = [python_executable(), "-I", "-S", "-B", str(LAUNCHER), config_json]
    if mode == "none":
        return python
    unshare = shutil.which("unshare") or "unshare"
    return [unshare, *(_ROOT_FLAGS if mode == "root" else _USERNS_FLAGS), *python]
