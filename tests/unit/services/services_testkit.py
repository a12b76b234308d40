"""Helpers for the services tests (a plain module: conftest files are not importable).

``scripted_engine`` is an ``MGRPO_ENGINE`` factory: a deterministic protocol-following policy
in place of a random tiny model, so plumbing tests see real delegations (to two sub-agent
types, with d_k varying by rollout) without an SFT warm start. Trainers still load and update
the real tiny model from the same folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

from mgrpo.engines.base import Completion, GenerationRequest

SMALL = {"train": {"city": 12, "person": 16, "company": 8},
         "dev": {"city": 6, "person": 8, "company": 4},
         "test": {"city": 6, "person": 8, "company": 4}}


class ScriptedPolicy:
    """Planner: searcher first; then coder or searcher again (by the turn's seed); then an
    answer. Searcher: search the task, return the first words. Coder: print(2 + 3)."""

    def __init__(self, tokenizer, version: int = 0) -> None:
        self.tokenizer, self.version = tokenizer, version

    def load_weights(self, source, version: int) -> None:
        self.version = version

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        # MGRPO_TEST_GENERATE_DELAY_S: slow rounds down, so a restart test lands mid-round
        time.sleep(float(os.environ.get("MGRPO_TEST_GENERATE_DELAY_S", "0")))
        out = []
        for req in requests:
            text = self.tokenizer.decode(req.prompt_ids, skip_special_tokens=False)
            turn = self.turn(text, req.params.seed or 0)
            ids = self.tokenizer.encode(turn, add_special_tokens=False)
            out.append(Completion(prompt_ids=list(req.prompt_ids), completion_ids=ids,
                                  logprobs=[-0.5] * len(ids), text=turn, finish_reason="stop"))
        return out

    @staticmethod
    def turn(text: str, seed: int) -> str:
        if "<|planner|>" in text:
            rets = re.findall(r"<ret>(.*?)</ret>", text, re.S)
            question = text.split("<|question|>", 1)[1].split("<|planner|>", 1)[0]
            if question.startswith("garble"):  # a malformed turn, for the trace tests
                return "the answer is probably 42"
            if not rets and question.startswith("add"):  # arithmetic: straight to the coder
                return f"<call>coder|{question}</call>"
            if not rets:
                return f"<call>searcher|{question[:40]}</call>"
            if question.startswith("add"):
                return f"<answer>{rets[0][:20]}</answer>"
            if len(rets) == 1:
                return ("<call>coder|add 2 and 3</call>" if seed % 2 == 0
                        else f"<call>searcher|{question[:30]}</call>")
            return f"<answer>{rets[0][:20]}</answer>"
        obs = [o.replace("\n", " ") for o in re.findall(r"<obs>(.*?)</obs>", text, re.S)]
        if "<|coder|>" in text:
            return "<return>" + obs[0][:20] + "</return>" if obs else "<tool>print(2 + 3)</tool>"
        task = text.split("<|task|>", 1)[1].split("<|", 1)[0]
        return "<return>" + obs[0][:20] + "</return>" if obs else f"<tool>{task[:40]}</tool>"


def scripted_engine(path: str, device: str):
    """``MGRPO_ENGINE=services_testkit:scripted_engine``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return None, tokenizer, ScriptedPolicy(tokenizer)


PLANNER_GATE = threading.Event()  # cleared: the planner's turns wait (a slow model)
PLANNER_GATE.set()
PLANNER_BATCHES: list[int] = []  # rows of each planner generate call


class GatedPolicy(ScriptedPolicy):
    """The scripted policy, but the planner's turns wait for ``PLANNER_GATE`` (at most 300 s):
    a model slow enough that queries pile up, for backpressure tests."""

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        first = self.tokenizer.decode(requests[0].prompt_ids, skip_special_tokens=False)
        if "<|planner|>" in first:
            PLANNER_BATCHES.append(len(requests))
            PLANNER_GATE.wait(timeout=300)
        return super().generate(requests)


def gated_engine(path: str, device: str):
    """``MGRPO_ENGINE=services_testkit:gated_engine``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return None, tokenizer, GatedPolicy(tokenizer)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(app) -> Iterator[str]:
    """Serve ``app`` with a real uvicorn on a free port (in a thread); yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(400):
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def raw_http(url: str, head: str, body_chunks=(), timeout: float = 10.0) -> tuple[int, int]:
    """Send a hand-written request head (and optional body chunks) on a raw socket and read
    the status line. Returns (status, body bytes actually sent): a server that answers
    before reading the body lets us stop sending early."""
    host, port = url.removeprefix("http://").split(":")
    sent = 0
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode("latin-1"))
        for chunk in body_chunks:
            if select.select([sock], [], [], 0.01)[0]:  # the server answered: stop sending
                break
            try:
                sock.sendall(chunk)
            except OSError:  # the server closed the connection
                break
            sent += len(chunk)
        reply = b""
        while b"\r\n" not in reply:
            data = sock.recv(4096)
            if not data:
                break
            reply += data
    return int(reply.split(b" ", 2)[1]), sent


def make_tiny(folder: Path) -> Path:
    from mgrpo.models import TinyModelConfig, init_tiny

    config = TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, intermediate_size=64, vocab_size=400)
    return init_tiny(folder, config)


def make_bench(folder: Path) -> Path:
    from mgrpo.envs import BenchmarkConfig, build_benchmark

    build_benchmark(BenchmarkConfig(seed=0, n_train=60, n_dev=20, n_test=20,
                                    entities=SMALL)).save(folder)
    return folder


def write_run_config(path: Path, tiny: Path, bench: Path, *, name: str = "svc", k: int = 2,
                     queries: int = 3, frozen: tuple[str, ...] = ()) -> Path:
    """Three models from the same tiny folder; the planner's calls vary d_k per rollout."""
    models = {m: {"path": str(tiny), "lr": 1e-3, "trainable": m not in frozen}
              for m in ("planner", "searcher", "coder")}
    config = {"name": name, "seed": 0, "k": k, "queries_per_round": queries, "d": 2,
              "models": models, "bench_dir": str(bench), "out_dir": str(path.parent / "out"),
              "sampling": {"planner_max_turns": 4, "subagent_max_turns": 2,
                           "max_new_tokens": 16}}
    path.write_text(yaml.safe_dump(config))
    return path
