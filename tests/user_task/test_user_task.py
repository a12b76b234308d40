"""A user's task, from outside the library: ``acme_task`` (its own HTTP search tool, verifier,
judge and JSONL data; mgrpo never names it) is imported with ``mgrpo data import``, trained
one round embedded (``mgrpo train``) and evaluated (``mgrpo eval``) with run.yaml and the CLI
alone, then trained one round through the services (separate processes on the real RabbitMQ
and PostgreSQL). The same YAML with a mistyped import path is refused in one line."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from string import Template

import pytest
from search_api import SearchAPI

HERE = Path(__file__).resolve().parent
DATA = HERE / "acme_task" / "data"


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "MGRPO_DEBUG": "", **extra}


def mgrpo(*argv: str, env: dict | None = None, timeout: float = 600
          ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mgrpo.cli.main", *argv], env=env or _env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def search_api():
    api = SearchAPI(DATA / "documents.jsonl")
    yield api
    api.close()


@pytest.fixture(scope="module")
def acme(tmp_path_factory, search_api):
    """The user's steps before training: import the data, make a model, write the config."""
    root = tmp_path_factory.mktemp("acme")
    done = mgrpo("data", "import", "--questions", str(DATA / "questions.jsonl"), "--out",
                 str(root / "bench"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote 12 questions (dev 1, test 1, train 10) and 0 "
                                  "documents")
    done = mgrpo("models", "init-tiny", "--out", str(root / "tiny"))
    assert done.returncode == 0, done.stderr
    text = Template((HERE / "run.yaml").read_text()).substitute(
        tiny=root / "tiny", bench=root / "bench", out=root / "out", search_url=search_api.url)
    (root / "run.yaml").write_text(text)
    return root


def test_trained_one_round_embedded_and_evaluated(acme, search_api):
    before = len(search_api.requests)
    done = mgrpo("train", "--config", str(acme / "run.yaml"))
    assert done.returncode == 0, done.stderr[-3000:]
    with open(acme / "out" / "metrics.csv") as f:
        metrics = {(int(r["round"]), r["key"]): float(r["value"]) for r in csv.DictReader(f)}
    assert metrics[(0, "planner/verifier_errors")] == 0.0  # the user's verifier ran clean
    assert metrics[(0, "web/judge_errors")] == 0.0
    assert (1, "eval/greedy/accuracy") in metrics
    # the tool was built from the YAML's keywords in the training process (its health check)
    assert "/health" in search_api.requests[before:]
    done = mgrpo("eval", "--config", str(acme / "run.yaml"), "--n", "1", "--episodes", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "accuracy" in done.stdout
    assert "\nquestion: " in done.stderr  # the episode, as a person reads it


def test_a_mistyped_import_path_is_refused_in_one_line(acme):
    bad = acme / "bad.yaml"
    bad.write_text((acme / "run.yaml").read_text().replace("acme_task.tools:HttpSearch",
                                                           "acme_task.tool:HttpSearch"))
    done = mgrpo("train", "--config", str(bad))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[0] == (
        "error: invalid RunConfig: tools.websearch.class: 'acme_task.tool:HttpSearch': no "
        "module named 'acme_task.tool' (is its folder on PYTHONPATH or the package installed?)")
    assert not (acme / "bad-out").exists()


@pytest.mark.integration
def test_one_round_through_the_services(acme, search_api, postgres_url, rabbitmq_url,
                                        unique_name, tmp_path):
    """Sub-agent ``web`` served with ``--tool websearch`` (the YAML's class and URL), a planner
    worker scoring with the user's verifier, and a trainer per model, each its own process;
    the policy is scripted (acme_policy) so the round's calls are known."""
    from kombu import Connection

    from mgrpo.bus.kombu_bus import KombuBus
    from mgrpo.config import Settings
    from mgrpo.services.context import Queues, load_service_config
    from mgrpo.services.launcher import ServiceProcesses
    from mgrpo.services.rounds import start_round
    from mgrpo.store import Store
    from mgrpo.store.admin import temporary_database

    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        env = _env(MGRPO_MODE="distributed", MGRPO_DATABASE_URL=url,
                   MGRPO_BROKER_URL=rabbitmq_url, MGRPO_RUN_CONFIG=str(acme / "run.yaml"),
                   MGRPO_ENGINE="acme_policy:scripted_engine",
                   MGRPO_QUEUE_PREFIX=f"{unique_name}.",
                   MGRPO_CHECKPOINT_URI=str(tmp_path / "ckpt"))
        services = ServiceProcesses(env, tmp_path)
        before = len(search_api.searches())
        try:
            services.start("subagent-web", "serve", "subagent", "--name", "web", "--tool",
                           "websearch")
            services.start("planner-worker", "serve", "planner-worker")
            for model in ("planner", "web"):
                services.start(f"trainer-{model}", "serve", "trainer", "--model", model)
            services.wait_healthy(*services.procs)
            settings = Settings(**{k[6:].lower(): v for k, v in env.items()
                                   if k.startswith("MGRPO_")})
            cfg = load_service_config(settings)
            queues = Queues(settings.queue_prefix)
            bus = KombuBus(settings.broker_url, store,
                           dead_letter_queue_name=queues.dead_letter)
            record = start_round(store, bus, cfg, queues)
            deadline = time.monotonic() + 300
            while store.get_round(record.round_id).status not in ("done", "failed") \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
            status = store.get_round(record.round_id).status
            assert status == "done", services.log("planner-worker")[-3000:]
            outcomes = store.read_planner_outcomes(record.round_id)
            # the answers are whole sentences ("The capital of Kelvar is Ostra."): exact
            # match scores 0, the user's contains_gold scores 1
            assert len(outcomes) == 4 and all(o.correct == 1.0 for o in outcomes)
            assert len(search_api.searches()) - before == 4  # the sub-agent's process called
            assert {(c.model, c.version) for c in store.list_checkpoints()} == \
                {("planner", 1), ("web", 1)}
            bus.close()
        finally:
            services.stop_all()
            with Connection(rabbitmq_url) as connection:
                for name in ("planner.episodes", "trainer.planner", "trainer.web",
                             "subagent.web", "mgrpo.dead_letter"):
                    with contextlib.suppress(Exception):  # never declared
                        connection.channel().queue_delete(f"{unique_name}.{name}")
            store.close()


def test_transcripts_from_a_teacher_warm_start_the_planner(acme, search_api, tmp_path):
    """``mgrpo data transcripts``: the teacher (here the scripted acme policy, any engine
    works) plays every role; episodes the user's verifier scores wrong are dropped (a
    question whose answer no document holds); ``mgrpo sft`` trains on what was kept."""
    questions = tmp_path / "questions.jsonl"
    questions.write_text((DATA / "questions.jsonl").read_text() + json.dumps(
        {"id": "nowhere", "question": "What is the capital of Nowhere?", "answer": "Zed",
         "split": "train"}) + "\n")
    done = mgrpo("data", "import", "--questions", str(questions), "--out", str(tmp_path / "b"))
    assert done.returncode == 0, done.stderr
    done = mgrpo("data", "transcripts", "--teacher", "acme_policy:scripted_engine",
                 "--config", str(acme / "run.yaml"), "--bench", str(tmp_path / "b"),
                 "--out", str(tmp_path / "tr"), "--samples", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("kept 20 of 22 episodes (10 of 11 questions)")
    planner = [json.loads(line) for line in (tmp_path / "tr" / "planner.jsonl").open()]
    web = [json.loads(line) for line in (tmp_path / "tr" / "web.jsonl").open()]
    assert len(planner) == len(web) == 20
    trained = [s["text"] for s in planner[0]["segments"] if s["train"]]
    assert trained[0].startswith("<call>web|") and trained[-1].startswith("<answer>")
    assert [s["train"] for s in web[0]["segments"]] == [False, True, False, True]
    done = mgrpo("sft", "--model", str(acme / "tiny"), "--data", str(tmp_path / "tr" /
                 "planner.jsonl"), "--agent", "planner", "--name", "planner", "--out",
                 str(tmp_path / "ckpt"), "--steps", "2", "--batch-size", "4")
    assert done.returncode == 0, done.stderr[-3000:]
