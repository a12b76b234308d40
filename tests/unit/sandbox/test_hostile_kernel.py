"""Hostile code against kernel state a call must not share: IPC, keyrings, ptys, namespaces.

Each test is one adversarial property (issue 16, item 5), run in every jail mode the host
has (the ``sandbox`` fixture is parametrized over them). Two calls in a row stand for two
different rollouts: whatever the first leaves behind, the second must not see it, and the
host must not keep it.
"""

from __future__ import annotations

import ctypes
import os

import httpx
import pytest
from sandbox_testkit import needs_jail

from mgrpo.sandbox.types import ExecRequest

SHM_KEY = 0x4D475250  # "MGRP"
MQ_NAME = b"/mgrpo-hostile"
KEY_DESC = b"mgrpo-hostile"
SECRET = "mgrpo-key-secret-41c9"
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


def run(sandbox, code: str, memory_mb: int = 256):
    result = sandbox.execute(ExecRequest(code=code, timeout_s=5, memory_mb=memory_mb))
    assert result.status in {"ok", "error"}, result
    return result


def host_shm_keys() -> set[int]:
    with open("/proc/sysvipc/shm") as f:
        return {int(line.split()[0]) for line in list(f)[1:]}


@pytest.fixture
def host_ipc_cleanup():
    """Remove, on the host, whatever a leaking call left: the host must not keep 64 MB."""
    yield
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(SHM_KEY, 0, 0)
    if shmid >= 0:
        libc.shmctl(shmid, 0, None)  # IPC_RMID
    libc.mq_unlink(MQ_NAME)


@needs_jail
def test_sysv_shared_memory_does_not_survive_the_call(sandbox, host_ipc_cleanup):
    create = LIBC + (f"shmid = libc.shmget({SHM_KEY}, 64 * 2**20, 0o1666)\n"
                     "print('created' if shmid >= 0 else 'refused', ctypes.get_errno())\n")
    look = LIBC + f"print(libc.shmget({SHM_KEY}, 0, 0) >= 0)\n"
    first = run(sandbox, create)
    assert first.stdout.startswith("created"), first  # the call may use its own IPC
    assert SHM_KEY not in host_shm_keys()
    assert run(sandbox, look).stdout == "False\n"


@needs_jail
def test_posix_message_queue_does_not_survive_the_call(sandbox, host_ipc_cleanup):
    create = LIBC + (f"fd = libc.mq_open({MQ_NAME!r}, os.O_CREAT | os.O_RDWR, 0o666, None)\n"
                     "print('created' if fd >= 0 else 'refused', ctypes.get_errno())\n")
    look = LIBC + f"print(libc.mq_open({MQ_NAME!r}, os.O_RDWR) >= 0)\n"
    run(sandbox, create)
    assert run(sandbox, look).stdout == "False\n"
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.mq_open(MQ_NAME, os.O_RDWR)
    assert fd < 0, "the call left a POSIX message queue on the host"


def test_a_key_stored_by_one_call_is_not_readable_by_the_next(sandbox):
    # add_key(2) into the user keyring (-4), then request_key(2) + keyctl(KEYCTL_READ=11).
    store = LIBC + (f"kid = libc.syscall(248, b'user', {KEY_DESC!r}, {SECRET.encode()!r}, "
                    f"{len(SECRET)}, -4)\nprint('stored' if kid > 0 else 'refused')\n")
    read = LIBC + (f"kid = libc.syscall(249, b'user', {KEY_DESC!r}, None, 0)\n"
                   "buf = ctypes.create_string_buffer(256)\n"
                   "n = libc.syscall(250, 11, kid, buf, 256) if kid > 0 else -1\n"
                   "print(buf.raw[:n].decode() if n > 0 else 'not found')\n")
    first = run(sandbox, store)
    second = run(sandbox, read)
    assert SECRET not in second.stdout + second.stderr, (first, second)
    assert second.stdout == "not found\n"


def test_pseudo_terminals_cannot_be_opened(sandbox):
    code = ("import os\nopened = 0\nfor path in ('/dev/ptmx', '/dev/pts/ptmx'):\n"
            "    try:\n        os.open(path, os.O_RDWR | os.O_NOCTTY)\n        opened += 1\n"
            "    except OSError:\n        pass\ntry:\n    os.openpty()\n    opened += 1\n"
            "except OSError:\n    pass\nprint(opened)\n")
    assert run(sandbox, code).stdout == "0\n"


def test_user_namespaces_cannot_be_created(sandbox):
    # unshare(CLONE_NEWUSER), and clone(CLONE_NEWUSER | SIGCHLD) like fork (the child exits).
    code = LIBC + ("made = 0\nif libc.unshare(0x10000000) == 0:\n    made += 1\n"
                   "pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\nif pid == 0:\n"
                   "    os._exit(0)\nif pid > 0:\n    os.waitpid(pid, 0)\n    made += 1\n"
                   "print(made)\n")
    assert run(sandbox, code).stdout == "0\n"


def test_unshare_binary_inside_the_jail_fails(sandbox):
    code = ("import subprocess\ntry:\n    r = subprocess.run(['unshare', '--user', "
            "'--map-root-user', 'id', '-u'], capture_output=True, text=True)\n"
            "    print(r.returncode != 0)\nexcept OSError:\n    print(True)\n")
    assert run(sandbox, code).stdout == "True\n"


def test_memory_above_the_service_limit_is_refused_with_a_message(service_url):
    resp = httpx.post(f"{service_url}/v1/execute",
                      json={"code": "print(1)", "memory_mb": 8192})
    assert resp.status_code == 422
    assert "max_memory_mb" in resp.json()["detail"]
    ok = httpx.post(f"{service_url}/v1/execute", json={"code": "print(1)"})
    assert ok.json()["stdout"] == "1\n"
