"""Runs inside the sandbox: set up the jail, then run the model's code. Standard library only.

Started by :mod:`mgrpo.sandbox.local` as ``python -I -S -B _launcher.py CONFIG_JSON`` with the
code on stdin, usually under ``unshare --mount --net --pid --fork`` so this process is PID 1
of a fresh PID namespace. As PID 1 it (1) hides and freezes the file system (mode "root"),
(2) forks one child that drops to an unprivileged uid, applies the rlimits and executes the
code in-process (saves a second interpreter start-up, ~8 ms), (3) reaps every process until
that child exits, then exits itself, and the kernel kills whatever else is left in the
namespace. Exit status: the child's, or 128 + N when signal N killed it (shell convention).

It does NOT import anything from ``mgrpo`` (it runs without site-packages) and does not
enforce the wall clock or the output cap: the host side does.
"""

import contextlib
import json
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
_FLAG_OF_OPTION = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def mount(source, target, fstype, flags, data=None):
        rc = libc.mount(source and source.encode(), target.encode(),
                        fstype and fstype.encode(), ctypes.c_ulong(flags),
                        data and data.encode())
        if rc != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"mount {source} -> {target}: {os.strerror(errno)}")

    return libc, mount


def _mount_points():
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            points.append((fields[4].replace("\\040", " "), fields[5].split(",")))
    return points


def _jail_file_system(cfg, mount):
    """Hide all of / but `cfg["visible"]`, re-expose `cfg["keep"]` (the interpreter), freeze."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    staging = []
    for i, keep in enumerate(cfg["keep"]):
        # Park what must stay visible (the interpreter) before its parent is hidden.
        staging.append((keep, f"/tmp/.keep{i}"))
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for keep, target in staging:
        os.makedirs(target)
        mount(keep, target, None, MS_BIND | MS_REC)
    for name in os.listdir("/"):
        path = "/" + name
        if name in cfg["visible"] or path == "/tmp" or os.path.islink(path):
            continue
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
        else:
            mount("/dev/null", path, None, MS_BIND)
    for keep, target in staging:
        os.makedirs(keep, exist_ok=True)
        mount(target, keep, None, MS_MOVE)
    os.makedirs(cfg["workdir"], exist_ok=True)
    for point, options in _mount_points():
        if point in ("/proc", "/dev/shm") or point.startswith(("/proc/", "/sys/")):
            continue
        extra = sum(_FLAG_OF_OPTION.get(o, 0) for o in options)
        # A mount shadowed by a hiding tmpfs may refuse: it is unreachable anyway.
        with contextlib.suppress(OSError):
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | extra)
    # The work dir last, so the read-only pass does not freeze it; /proc shows only our pids.
    mount("tmpfs", cfg["workdir"], "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={cfg['work_mb']}m,mode=700,uid={cfg['uid']},gid={cfg['uid']}")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1m,mode=755")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _drop_privileges(cfg, libc):
    limits = {resource.RLIMIT_CORE: 0, resource.RLIMIT_AS: cfg["mem_bytes"],
              resource.RLIMIT_FSIZE: cfg["fsize_bytes"], resource.RLIMIT_NOFILE: 64}
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    # Soft limit raises SIGXCPU (-> status "timeout"); the hard limit one second later kills.
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
    if cfg["mode"] == "root":
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
    # RLIMIT_NPROC counts the real uid's processes; it binds only after leaving uid 0.
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
    if libc is not None:
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid binaries regain root


def _run_user_code(source: str) -> int:
    import builtins
    import traceback
    import types

    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    sys.argv = ["<sandbox>"]
    builtins.exit = builtins.quit = sys.exit  # -S drops the site helpers models often call
    try:
        exec(compile(source, "<sandbox>", "exec"), main.__dict__)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException as err:  # noqa: BLE001 -- the model's error, shown as python would
        # Skip this launcher's own frame so the traceback starts at the model's code.
        traceback.print_exception(type(err), err, err.__traceback__.tb_next)
        return 1
    return 0


def _child(cfg, source, libc) -> None:
    code = 1
    try:
        _drop_privileges(cfg, libc)
        os.chdir(cfg["workdir"])
        os.environ.clear()
        os.environ.update(cfg["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        code = _run_user_code(source)
    except BaseException as err:  # noqa: BLE001
        print(f"sandbox: set-up failed: {err!r}", file=sys.stderr)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    source = sys.stdin.buffer.read().decode("utf-8", "surrogatepass")
    libc = None
    if cfg["mode"] == "root":
        libc, mount = _libc()
        _jail_file_system(cfg, mount)
    else:
        os.makedirs(cfg["workdir"], exist_ok=True)
    pid = os.fork()
    if pid == 0:
        _child(cfg, source, libc)
    while True:
        reaped, status = os.wait()
        if reaped == pid:
            break
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
