"""Hostile code against the sandbox: one adversarial property per test (nanochat style).

Most tests use LocalSandbox directly; the concurrency test and the final health check go
through the real service. The last test must stay last: after everything above, the service
still answers a normal call correctly.
"""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sandbox_testkit import needs_jail, sandbox_uid_processes

from mgrpo.sandbox.client import SandboxClient
from mgrpo.sandbox.types import ExecRequest

SECRET = "mgrpo-fake-secret-7f3a9c"


def run(sandbox, code: str, timeout_s: float = 2.0, memory_mb: int = 256):
    return sandbox.execute(ExecRequest(code=code, timeout_s=timeout_s, memory_mb=memory_mb))


def leftovers(sandbox) -> list[int]:
    """Sandbox-uid processes still alive, after giving the kernel a moment to reap."""
    low = sandbox.limits.uid_base
    for _ in range(50):
        pids = sandbox_uid_processes(low, low + 128 * 10_000)
        if not pids:
            return []
        time.sleep(0.1)
    return pids


def test_infinite_loop_times_out(sandbox):
    result = run(sandbox, "while True:\n    pass", timeout_s=1)
    assert result.status == "timeout"
    assert result.duration_s >= 1.0


def test_sleep_past_the_limit_times_out_and_leaves_nothing(sandbox):
    result = run(sandbox, "import time\ntime.sleep(100)", timeout_s=0.5)
    assert result.status == "timeout"
    assert result.exit_code is None
    assert leftovers(sandbox) == []


@needs_jail
def test_fork_bomb_is_capped_by_process_limit(sandbox):
    code = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
            "            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
            "except OSError as err:\n    print(n, type(err).__name__)\n")
    result = run(sandbox, code, timeout_s=5)
    assert result.status == "ok", result.stderr
    forked, error = result.stdout.split()
    assert int(forked) < sandbox.limits.max_processes
    assert error == "BlockingIOError"
    assert leftovers(sandbox) == []


def test_memory_bomb_reports_memory(sandbox):
    result = run(sandbox, "x = bytearray(2 * 1024**3)\nprint('allocated')", memory_mb=128)
    assert result.status == "memory"
    assert "allocated" not in result.stdout


def test_huge_output_is_cut_at_the_cap(sandbox):
    result = run(sandbox, "while True:\n    print('x' * 10000)", timeout_s=10)
    assert result.status == "output_limit"
    cap = sandbox.limits.output_limit_bytes
    assert cap <= len(result.stdout) + len(result.stderr) <= cap + 2 * 65536


@needs_jail
@pytest.mark.parametrize("path", ["/etc/pwned", "/usr/pwned", "/pwned", "/root/.pyenv/pwned"])
def test_writing_outside_the_work_dir_fails(sandbox, path):
    code = (f"try:\n    open({path!r}, 'w').write('x')\n    print('wrote')\n"
            "except OSError as err:\n    print(type(err).__name__)\n")
    result = run(sandbox, code)
    assert result.stdout.strip() in {"PermissionError", "OSError", "FileNotFoundError"}, result
    assert not os.path.exists(path)


def test_work_dir_is_writable_and_private_per_call(sandbox):
    first = run(sandbox, "open('note.txt', 'w').write('hello')\nprint(open('note.txt').read())")
    second = run(sandbox, "import os\nprint(os.path.exists('note.txt'))")
    assert (first.stdout, second.stdout) == ("hello\n", "False\n")


def test_service_environment_is_not_visible(sandbox, monkeypatch):
    monkeypatch.setenv("MGRPO_FAKE_SECRET", SECRET)
    code = ("import os\nprint(dict(os.environ))\nfor p in ('/proc/1/environ', "
            "'/proc/self/environ', '/proc/2/environ'):\n    try:\n"
            "        print(open(p, 'rb').read())\n    except OSError as err:\n"
            "        print(type(err).__name__)\n")
    result = run(sandbox, code)
    assert result.status == "ok", result.stderr
    assert "HOME" in result.stdout  # it did print its environment
    assert SECRET not in result.stdout + result.stderr


@needs_jail
def test_secret_files_are_hidden(sandbox, tmp_path):
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET)
    secret_file.chmod(0o644)
    targets = [str(secret_file), "/work/main/README.md", "/root/.bash_history",
               "/container_info.json"]
    code = (f"for p in {targets!r}:\n    try:\n        print(p, repr(open(p).read()[:50]))\n"
            "    except OSError as err:\n        print(p, type(err).__name__)\n")
    result = run(sandbox, code)
    assert SECRET not in result.stdout
    assert "mgrpo" not in result.stdout.lower().replace("/work/main", "")
    assert result.stdout.count("FileNotFoundError") >= 3, result.stdout


@needs_jail
def test_host_processes_are_invisible(sandbox):
    result = run(sandbox, "import os\nprint(sorted(int(p) for p in os.listdir('/proc') "
                          "if p.isdigit()))")
    assert result.stdout.strip() == "[1, 2]"


def test_socket_to_local_postgres_is_refused(sandbox):
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=2).close()
    except OSError:
        pytest.skip("nothing listens on 127.0.0.1:5432 here: the test would prove nothing")
    code = ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', 5432), "
            "timeout=1)\n    print('connected')\nexcept OSError as err:\n"
            "    print(type(err).__name__)\n")
    result = run(sandbox, code)
    assert result.status == "ok" and "connected" not in result.stdout, result


def test_socket_to_an_outside_address_fails(sandbox):
    code = ("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 443), timeout=1)\n"
            "    print('connected')\nexcept OSError as err:\n    print(type(err).__name__)\n")
    result = run(sandbox, code)
    assert result.status == "ok" and "connected" not in result.stdout, result


@needs_jail
def test_spawned_shell_runs_unprivileged_in_the_same_jail(sandbox):
    code = ("import subprocess\nprint(subprocess.run(['sh', '-c', 'id -u; touch /etc/pwned "
            "2>/dev/null || echo denied'], capture_output=True, text=True).stdout)")
    result = run(sandbox, code)
    uid, verdict = result.stdout.split()[:2]
    if getattr(sandbox, "per_call_uid", True):
        assert int(uid) >= sandbox.limits.uid_base
    else:  # a non-root service (the container's uid 10001): the call keeps that uid
        assert int(uid) != 0
    assert verdict == "denied"


def test_killing_the_parent_does_not_touch_the_host(sandbox):
    code = (f"import os, signal\nfor pid in (os.getppid(), 1, {os.getpid()}):\n    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n    except OSError as err:\n"
            "        print(type(err).__name__)\nprint('done')\n")
    result = run(sandbox, code)
    assert result.status in {"ok", "error"}  # the call itself finished and was classified
    assert os.getpid() > 0 and run(sandbox, "print(7)").stdout == "7\n"


@needs_jail
def test_daemonized_child_does_not_outlive_the_call(sandbox):
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            "        time.sleep(60)\n    os._exit(0)\nprint('parent done')\n")
    result = run(sandbox, code)
    assert result.stdout == "parent done\n"
    assert leftovers(sandbox) == []


def test_ctypes_segfault_is_an_error_not_a_crash(sandbox):
    result = run(sandbox, "import ctypes\nctypes.string_at(0)")
    assert result.status == "error"
    assert result.exit_code == -11  # SIGSEGV


def test_nul_bytes_in_code_are_a_clean_error(sandbox):
    result = run(sandbox, "print('a')\x00print('b')")
    assert result.status == "error"
    assert "null" in result.stderr.lower()


def test_odd_unicode_round_trips(sandbox):
    text = "ünï\u200bcødé ⟨∑⟩ \u202eevil\u202c 𝔘 👩‍🚀 \ufeff"
    result = run(sandbox, f"print({text!r})")
    assert result.status == "ok"
    assert result.stdout == text + "\n"


def test_lone_surrogate_in_code_is_a_422_with_a_message(service_url):
    body = b'{"code": "s = \'\\ud800\'", "timeout_s": 1}'
    resp = httpx.post(f"{service_url}/v1/execute", content=body,
                      headers={"content-type": "application/json"})
    assert resp.status_code == 422
    assert "unicode" in resp.json()["detail"][0]["msg"]


def test_ten_megabytes_of_code_runs_through_the_service(service_url):
    code = "#" * (10_000_000 - 40) + "\nprint('big ok')"
    with SandboxClient(service_url, timeout=30) as client:
        result = client.execute(ExecRequest(code=code, timeout_s=20))
    assert (result.status, result.stdout) == ("ok", "big ok\n")


def test_fifty_concurrent_calls_through_the_service(service_url):
    with SandboxClient(service_url, timeout=60) as client, ThreadPoolExecutor(50) as pool:
        results = list(pool.map(
            lambda i: client.execute(ExecRequest(code=f"print({i} * {i})", timeout_s=30)),
            range(50)))
    assert [r.status for r in results] == ["ok"] * 50
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(50)]


def test_zz_service_still_answers_a_normal_call(service_url):
    with SandboxClient(service_url) as client:
        result = client.execute(ExecRequest(code="print(1+1)"))
    assert (result.status, result.stdout, result.exit_code) == ("ok", "2\n", 0)
