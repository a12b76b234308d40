"""Helpers for the services tests (a plain module: conftest files are not importable).

``in_process_services`` starts the distributed round's services in one process (in-memory
bus, SQLite store). ``scripted_engine`` is an ``MGRPO_ENGINE`` factory: a deterministic
protocol-following policy in place of a random tiny model, so plumbing tests see real
delegations (to two sub-agent types, with d_k varying by rollout) without an SFT warm start.
Trainers still load and update the real tiny model from the same folder."""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
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


class VariedPolicy(ScriptedPolicy):
    """The scripted policy, but the planner's final answer is malformed when its turn's seed
    is odd: a query's rollouts then differ in format reward, so a trained planner moves (with
    :class:`ScriptedPolicy` its rollouts of a query always score alike: advantages 0)."""

    @staticmethod
    def turn(text: str, seed: int) -> str:
        out = ScriptedPolicy.turn(text, seed)
        if "<|planner|>" in text and out.startswith("<answer>") and seed % 2:
            return "the answer is probably 42"
        return out


def varied_engine(path: str, device: str):
    """``MGRPO_ENGINE=services_testkit:varied_engine``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return None, tokenizer, VariedPolicy(tokenizer)


class VariedTeamPolicy(VariedPolicy):
    """:class:`VariedPolicy`, and a sub-agent's last turn is malformed (no ``<return>``) when
    its seed is odd: that invocation fails its format (R_S = 0) while its group's others score
    b1 or more, so trained sub-agents move too (with the rule judge alone the scripted
    sub-agents' invocations of a query score alike: advantages 0)."""

    @staticmethod
    def turn(text: str, seed: int) -> str:
        out = VariedPolicy.turn(text, seed)
        if "<|planner|>" not in text and out.startswith("<return>") and seed % 2:
            return "done, I think"
        return out


def varied_team_engine(path: str, device: str):
    """``MGRPO_ENGINE=services_testkit:varied_team_engine``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return None, tokenizer, VariedTeamPolicy(tokenizer)


PLANNER_GATE = threading.Event()  # cleared: the planner's turns wait (a slow model)
PLANNER_GATE.set()
PLANNER_BATCHES: list[int] = []  # rows of each planner generate call
PLANNER_HOLD: list[str] = []  # not empty: only planner prompts holding one of these wait


class GatedPolicy(ScriptedPolicy):
    """The scripted policy, but the planner's turns wait for ``PLANNER_GATE`` (at most 300 s):
    a model slow enough that queries pile up, for backpressure tests."""

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        first = self.tokenizer.decode(requests[0].prompt_ids, skip_special_tokens=False)
        if "<|planner|>" in first:
            PLANNER_BATCHES.append(len(requests))
            if not PLANNER_HOLD or any(text in first for text in PLANNER_HOLD):
                PLANNER_GATE.wait(timeout=300)
        return super().generate(requests)


def gated_engine(path: str, device: str):
    """``MGRPO_ENGINE=services_testkit:gated_engine``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    return None, tokenizer, GatedPolicy(tokenizer)


LOAD_GATE = threading.Event()  # cleared: loading the model waits (a model slow to load)
LOAD_GATE.set()


def slow_loading_engine(path: str, device: str):
    """``MGRPO_ENGINE=services_testkit:slow_loading_engine``: the scripted policy, but loading
    it waits for ``LOAD_GATE`` (at most 300 s), as a large model's load takes minutes."""
    LOAD_GATE.wait(timeout=300)
    return scripted_engine(path, device)


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


def embedded_settings(root: Path, run_config: Path, **extra):
    """Settings of the in-process services: a SQLite store and checkpoints under ``root``,
    the scripted policy (``extra`` overrides or adds fields, e.g. ``engine``, ``api_token``)."""
    from mgrpo.config import Settings

    fields = {"mode": "embedded", "database_url": f"sqlite:///{root}/store.db",
              "checkpoint_uri": str(root / "ckpt"), "run_config": str(run_config),
              "engine": "services_testkit:scripted_engine", **extra}
    return Settings(**fields)


@dataclass
class Services:
    settings: object
    cfg: object
    store: object
    bus: object
    planner: object
    trainers: dict = field(default_factory=dict)  # model -> TrainerService


def in_memory_backend(settings):
    """What the planner needs besides itself, in this process: the run config, the settings'
    store and an in-memory bus on it with the searcher and coder workers started; (cfg,
    store, bus)."""
    from mgrpo.bus import InMemoryBus
    from mgrpo.services.context import load_service_config, open_store
    from mgrpo.services.subagent.worker import SubagentWorker

    cfg = load_service_config(settings)
    store = open_store(settings)
    bus = InMemoryBus(store)
    for name, tool in (("searcher", "search"), ("coder", "python")):
        SubagentWorker(settings, cfg, store, bus, name, tool).start()
    return cfg, store, bus


@contextlib.contextmanager
def in_process_services(settings, *, trainers=("planner", "searcher", "coder"),
                        poll_s: float = 0.1) -> Iterator[Services]:
    """The distributed round's services in this process: an in-memory bus on the settings'
    store, the searcher and coder workers, the planner worker and a trainer per model in
    ``trainers`` (safety-net poll every ``poll_s``). On exit the trainers stop, then the bus
    and the store close."""
    from mgrpo.services.planner.worker import PlannerRuntime, PlannerWorker
    from mgrpo.services.trainer.service import TrainerService

    cfg, store, bus = in_memory_backend(settings)
    planner = PlannerWorker(PlannerRuntime.build(settings, cfg, store, bus))
    planner.start()
    started = {m: TrainerService(settings, cfg, store, bus, m, poll_s=poll_s)
               for m in trainers}
    for trainer in started.values():
        trainer.start()
    try:
        yield Services(settings, cfg, store, bus, planner, started)
    finally:
        for trainer in started.values():
            trainer.stop()
        bus.close()
        store.close()


def wait_done(store, round_id: str, timeout_s: float = 120.0) -> str:
    """The round's status once it is done, failed or cancelled, or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = store.get_round(round_id).status
        if status in ("done", "failed", "cancelled"):
            return status
        time.sleep(0.1)
    return store.get_round(round_id).status
