"""Runs inside the sandbox: set up the jail, then run the model's code. Standard library only.

Started by :mod:`mgrpo.sandbox.local` as ``python -I -S -B _launcher.py CONFIG_JSON`` with the
code on stdin, usually under ``bwrap ... --as-pid-1`` or ``unshare --mount --ipc --net --pid
--fork`` so this process is PID 1 of a fresh PID namespace. As PID 1 it (1) hides and freezes
the file system and replaces /dev (mode "root"; bwrap has done that already), (2) forks one
child that drops to an unprivileged uid, applies the rlimits and a seccomp filter and executes
the code in-process (saves a second interpreter start-up, ~8 ms), (3) reaps every process
until that child exits, then exits itself, and the kernel kills whatever else is left in the
namespace. Exit status: the child's, or 128 + N when signal N killed it (shell convention).

The seccomp filter (x86_64, aarch64; elsewhere none) answers EPERM to the kernel keyring
calls (add_key, request_key, keyctl: keys would outlive the call and be readable by the next
call under the same uid), to namespace creation (unshare, setns, clone with a CLONE_NEW*
flag; clone3 gets ENOSYS so libc falls back to clone), and to mount, ptrace, bpf,
perf_event_open, userfaultfd and io_uring (attack surface the code never needs).

It does NOT import anything from ``mgrpo`` (it runs without site-packages) and does not
enforce the wall clock or the output cap: the host side does.
"""

import contextlib
import json
import os
import platform
import resource
import stat
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
_MEM_MINOR = {"null": 3, "zero": 5, "full": 7, "random": 8, "urandom": 9}  # char major 1
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


# machine -> (AUDIT_ARCH_*, clone, clone3, numbers of the refused syscalls)
_SECCOMP_TABLE = {
    # ptrace mount umount2 pivot_root chroot add_key request_key keyctl unshare setns
    # perf_event_open bpf userfaultfd io_uring_setup io_uring_enter io_uring_register
    "x86_64": (0xC000003E, 56, 435, (101, 165, 166, 155, 161, 248, 249, 250, 272, 308,
                                     298, 321, 323, 425, 426, 427)),
    "aarch64": (0xC00000B7, 220, 435, (117, 40, 39, 41, 51, 217, 218, 219, 97, 268,
                                       241, 280, 282, 425, 426, 427)),
}
_CLONE_NEW_FLAGS = 0x7E020000  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
_EPERM, _ENOSYS = 1, 38


def seccomp_program(machine):
    """The BPF filter as (code, jt, jf, k) tuples, or None for an architecture we do not know."""
    if machine not in _SECCOMP_TABLE:
        return None
    arch, clone, clone3, refused = _SECCOMP_TABLE[machine]
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, deny = (ret, 0, 0, 0x7FFF0000), (ret, 0, 0, 0x00050000 | _EPERM)
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, arch), deny,  # another ABI (int 0x80): refused
            (ld_abs, 0, 0, 0)]
    if machine == "x86_64":
        prog += [(jge, 0, 1, 0x40000000), deny]  # the x32 ABI
    prog += [(jeq, 0, 1, clone3), (ret, 0, 0, 0x00050000 | _ENOSYS),
             (jeq, 0, 4, clone), (ld_abs, 0, 0, 16), (jset, 0, 1, _CLONE_NEW_FLAGS), deny,
             allow]
    prog += [(jeq, len(refused) - i, 0, nr) for i, nr in enumerate(refused)]
    return prog + [allow, deny]


def _install_seccomp(libc):
    import ctypes

    prog = seccomp_program(platform.machine())
    if prog is None:
        return

    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8),
                    ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Insn))]

    insns = (Insn * len(prog))(*[Insn(*i) for i in prog])
    fprog = Prog(len(prog), insns)
    # PR_SET_SECCOMP (22), SECCOMP_MODE_FILTER (2); needs PR_SET_NO_NEW_PRIVS first.
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


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
    _replace_dev(cfg, mount)
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _replace_dev(cfg, mount):
    """A read-only /dev with only the harmless devices: no ptys, no disks, no host /dev/shm."""
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name in cfg["devices"]:
        os.mknod(f"/dev/{name}", stat.S_IFCHR | 0o666, os.makedev(1, _MEM_MINOR[name]))
        os.chmod(f"/dev/{name}", 0o666)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"/dev/{name}")
    os.symlink("/proc/self/fd", "/dev/fd")
    os.mkdir("/dev/shm")
    mount(None, "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=1m,mode=755")


def _drop_privileges(cfg, libc):
    limits = {resource.RLIMIT_CORE: 0, resource.RLIMIT_AS: cfg["mem_bytes"],
              resource.RLIMIT_FSIZE: cfg["fsize_bytes"], resource.RLIMIT_NOFILE: 64}
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    # Soft limit raises SIGXCPU (-> status "timeout"); the hard limit one second later kills.
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
    if cfg["setuid"]:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
    # RLIMIT_NPROC counts the real uid's processes; it binds only after leaving uid 0.
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid binaries regain root
    _install_seccomp(libc)


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
    libc, mount = _libc()
    if cfg["mode"] == "root":
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
