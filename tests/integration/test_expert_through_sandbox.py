"""The error-free expert scores 100% on every split through the REAL sandbox SERVICE.

Starts ``mgrpo serve sandbox --port <free>`` as a subprocess, talks to it with
``SandboxClient``, and runs the expert on a small seeded benchmark (all three splits).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from benchmark_sizes import SMALL

from mgrpo.envs import BenchmarkConfig, build_benchmark
from mgrpo.envs.experts import ExpertErrors, run_expert_episode
from mgrpo.services.launcher import free_port
from mgrpo.tools import build_tool


@pytest.fixture(scope="module")
def sandbox_url():
    port = free_port()
    mgrpo = Path(sys.executable).with_name("mgrpo")
    proc = subprocess.Popen([str(mgrpo), "serve", "sandbox", "--host", "127.0.0.1",
                             "--port", str(port)], env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):  # up to ~60 s on a loaded 2-core machine
            if proc.poll() is not None:
                pytest.fail(f"sandbox service exited {proc.returncode}: "
                            f"{proc.stdout.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            pytest.fail("sandbox service did not answer /healthz within 60 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_expert_scores_100_percent_through_sandbox_service(sandbox_url):
    from mgrpo.sandbox.client import SandboxClient

    bench = build_benchmark(BenchmarkConfig(seed=11, n_train=90, n_dev=45, n_test=45,
                                            entities=SMALL))
    tools = {"searcher": build_tool("search", corpus=bench.corpus),
             "coder": build_tool("python", executor=SandboxClient(sandbox_url))}
    rng = random.Random(0)
    coder_calls = 0
    for split in ("train", "dev", "test"):
        questions = bench.questions(split)
        episodes = [run_expert_episode(q, tools, ExpertErrors(), rng) for q in questions]
        coder_calls += sum(s.agent == "coder" for ep in episodes for s in ep.subagents)
        assert sum(ep.correct for ep in episodes) == len(questions), split
    assert coder_calls >= 40
