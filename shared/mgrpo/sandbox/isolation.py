"""How this host can isolate a sandboxed call: probe once, build the launcher command line.

Four modes, the strongest the host allows (``detect_isolation``, in this order):

- ``"bwrap"``: Debian's bubblewrap (``bwrap``) is installed and works. It builds the jail: new
  IPC, PID, network, UTS and cgroup namespaces, a fresh empty root with only /usr (and the
  /bin, /lib* links into it) and the interpreter bound read-only, a fresh /proc, a /dev with
  only null, zero, full, random and urandom (no ptys), a private size-capped tmpfs work dir.
  Run as root, bwrap keeps only CAP_SETUID/CAP_SETGID so the launcher can drop to the call's
  throw-away uid (RLIMIT_NPROC binds); run as another user it adds a user namespace with
  ``--disable-userns``.
- ``"root"``: we are uid 0 and ``unshare`` works. New mount, IPC, network and PID namespaces; the
  file system is hidden except /usr, /etc, /bin, /lib* (tmpfs over /tmp, /root, /home,
  /work, /var, ...) and what stays visible is remounted read-only; the code runs as a
  throw-away unprivileged uid, so RLIMIT_NPROC binds. /dev holds only the five harmless
  devices (no /dev/ptmx, no /dev/pts).
- ``"userns"``: not root, but unprivileged user namespaces work (``unshare --user``). New
  IPC, network and PID namespaces, fresh /proc; the file system is NOT hidden or frozen (the
  code runs as namespace-root over the host's mounts, with the caller's real permissions).
- ``"none"``: neither. rlimits, a scrubbed environment and a private work dir only. No
  network isolation, no file-system isolation, processes that call setsid() can outlive the
  call. A warning is logged once.

In every mode the launcher installs a seccomp filter (x86_64 and aarch64) that refuses the
kernel keyring calls and namespace creation (see :mod:`mgrpo.sandbox._launcher`). This module
does not run code (:mod:`mgrpo.sandbox.local` does) and does not use cgroups (see
docs/sandbox.md).
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

IsolationMode = Literal["bwrap", "root", "userns", "none"]
JAIL_MODES: tuple[IsolationMode, ...] = ("bwrap", "root")  # hide and freeze the file system

LAUNCHER = Path(__file__).with_name("_launcher.py")
# In "root" mode every other top-level entry (/root, /home, /work, /tmp, /var, /opt, /mnt,
# stray files like /container_info.json ...) is hidden behind an empty tmpfs or /dev/null.
VISIBLE_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev",
                     "proc", "sys")
JAIL_WORK_DIR = "/tmp/work"
JAIL_LAUNCHER = "/.mgrpo-launcher.py"  # where bwrap binds the launcher inside its empty root
# The only devices a call gets (no /dev/ptmx or /dev/pts: no pseudo-terminals).
JAIL_DEVICES = ("null", "zero", "full", "random", "urandom")
_BWRAP_FLAGS = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--as-pid-1"]
_ROOT_FLAGS = ["--mount", "--ipc", "--net", "--pid", "--fork", "--kill-child",
               "--propagation", "private"]
_USERNS_FLAGS = ["--user", "--map-root-user", "--ipc", "--net", "--pid", "--fork",
                 "--kill-child", "--mount", "--mount-proc"]
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
    """The strongest mode this host supports (probed once per process, ~10-40 ms)."""
    if mode_works("bwrap"):
        return "bwrap"
    unshare = shutil.which("unshare")
    if unshare and os.geteuid() == 0 and _probe([unshare, *_ROOT_FLAGS, "true"]):
        return "root"
    if unshare and _probe([unshare, *_USERNS_FLAGS, "true"]):
        return "userns"
    log.warning(NO_ISOLATION_MESSAGE)
    return "none"


@functools.cache
def mode_works(mode: IsolationMode) -> bool:
    """Whether `mode` can start an interpreter here (one probe per mode and process)."""
    if mode == "none":
        return True
    if mode == "bwrap":
        return bool(shutil.which("bwrap")) and _probe(
            _bwrap_prefix(JAIL_WORK_DIR, 1) + [python_executable(), "-I", "-S", "-c", "pass"])
    unshare = shutil.which("unshare")
    if not unshare or (mode == "root" and os.geteuid() != 0):
        return False
    return _probe([unshare, *(_ROOT_FLAGS if mode == "root" else _USERNS_FLAGS), "true"])


def interpreter_dirs_to_keep(visible: tuple[str, ...] = VISIBLE_TOP_LEVEL) -> list[str]:
    """Interpreter prefixes outside the visible top-level dirs: re-exposed read-only.

    Example: pyenv's /root/.pyenv/versions/3.11.7 stays visible while the rest of /root is not.
    """
    prefixes = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    keep = [p for p in sorted(prefixes) if p.split("/")[1] not in visible]
    return [p for i, p in enumerate(keep) if not any(p.startswith(k + "/") for k in keep[:i])]


def _bwrap_prefix(work_dir: str, work_mb: int) -> list[str]:
    """bwrap's argv up to the command: an empty root with /usr, the interpreter, /proc, /dev."""
    argv = [shutil.which("bwrap") or "bwrap", *_BWRAP_FLAGS]
    if os.geteuid() == 0:  # privileged bwrap: no user namespace; keep just what setuid needs
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for keep in interpreter_dirs_to_keep():
        argv += ["--ro-bind", keep, keep]
        parent = os.path.dirname(keep)
        while parent != "/":  # bwrap makes the parents 0700: the call's uid must pass
            argv += ["--chmod", "0755", parent]
            parent = os.path.dirname(parent)
    argv += ["--ro-bind", str(LAUNCHER), JAIL_LAUNCHER, "--proc", "/proc", "--tmpfs", "/dev"]
    for dev in JAIL_DEVICES:
        argv += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
    for i, fd in enumerate(("stdin", "stdout", "stderr")):
        argv += ["--symlink", f"/proc/self/fd/{i}", f"/dev/{fd}"]
    argv += ["--symlink", "/proc/self/fd", "/dev/fd",
             "--size", str(2**20), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
             "--size", str(work_mb * 2**20), "--perms", "1777", "--tmpfs", work_dir,
             "--remount-ro", "/", "--chdir", work_dir, "--"]
    return argv


def launcher_command(mode: IsolationMode, config_json: str, work_dir: str = JAIL_WORK_DIR,
                     work_mb: int = 64) -> list[str]:
    """argv that starts the launcher under `mode`; the code goes to its stdin."""
    python = [python_executable(), "-I", "-S", "-B", str(LAUNCHER), config_json]
    if mode == "none":
        return python
    if mode == "bwrap":
        return [*_bwrap_prefix(work_dir, work_mb), *python[:4], JAIL_LAUNCHER, config_json]
    unshare = shutil.which("unshare") or "unshare"
    return [unshare, *(_ROOT_FLAGS if mode == "root" else _USERNS_FLAGS), *python]
