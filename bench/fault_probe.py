"""A fault and hostile-input probe of the distributed system, anyone can rerun: the outside
scenarios again, against the real services as separate processes (``mgrpo serve ...``: a
planner worker, a searcher and a coder sub-agent, a trainer per model, the planner API and
the control worker) on the local RabbitMQ and a fresh PostgreSQL database, with unique queue
names (deleted afterwards). Real tiny models (``mgrpo.experiments.tiny_assets``, the round
bench's warm-started ones), k = 2, 3 queries a round.

Scenarios, one round each, in this order (each records counts; none asserts):

- ``poison``: a body nested 100,000 levels deep published raw onto the planner's episode
  queue, the searcher's call queue and the planner trainer's queue, then a round;
- ``hostile_trajectory``: during a round, onto the planner trainer's queue a copy of one of
  the round's trajectories with a token id of 10**9 (a new attempt), one reusing a real
  (traj_id, attempt) with different content, and onto the searcher trainer's queue a
  searcher trajectory with an invocation number (99) the planner never recorded;
- ``concurrent_starts``: 20 threads ``POST /v1/rounds`` at once to the API process;
- ``unpublished_round``: a round created with its publish killed (``SystemExit`` out of
  ``publish_many``, as ``tests/integration/services/test_round_outbox.py`` does): the control
  worker's sweep (``PUBLISH_GRACE_S`` 60 s, every 30 s) must publish it;
- ``broker_restart``: ``rabbitmqctl stop_app`` / ``start_app`` of the local broker while a
  round runs. Rounds of these tiny models take well under a second, less than
  ``stop_app`` itself, so the planner worker is held (SIGSTOP) from just before the round
  starts until ``stop_app`` returned: the round's tasks are on the broker, 0 rollouts done,
  when it goes down. ``start_app`` comes once every worker's ``/healthz`` is 503
  (``MGRPO_CONSUMER_GRACE_S`` = 2 here) or after 20 s, and always (``finally``).

Every round's check: its status, rollouts completed / total, trained trajectories per model
(the round's ``<model>/trajectories`` metrics) against the expected counts (one per rollout
for the planner, the sum of the recorded d_k for a sub-agent model:
``expected_subagent_trajectories``), stored (traj_id, attempt) duplicates, every model's
latest checkpoint version, dead letters (count, queue, reason) and which hostile messages
got one, and service processes that died. The exit status is 1 when any scenario lost or
duplicated a trajectory, did not finish its round, or left a hostile message without a dead
letter.

Usage::

    OMP_NUM_THREADS=1 PYTHONPATH=shared:. .venv/bin/python bench/fault_probe.py \\
        [--out bench/results/fault_probe.json] [--skip unpublished_round ...]

What it does NOT do: fix anything, or restart a PostgreSQL (the broker is the shared local
one; its outage is kept short).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

import yaml  # noqa: E402
from fault_probe_report import MODELS, problems, table  # noqa: E402
from report import load_avg  # noqa: E402
from round_harness import make_config  # noqa: E402
from round_services import delete_queues, start_services  # noqa: E402

from mgrpo.services.launcher import ServiceProcesses, free_port  # noqa: E402

RESULT_FILE = Path(__file__).resolve().parent / "results" / "fault_probe.json"
TOKEN = "probe-token"
POISON = '{"kind":' + "[" * 100_000 + "]" * 100_000 + "}"
ROUND_TIMEOUT_S = 180.0
SCENARIOS = ("poison", "hostile_trajectory", "concurrent_starts", "unpublished_round",
             "broker_restart")


def machine() -> dict:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "cpu_count": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


class Probe:
    """One deployment (database, queue prefix, processes) the scenarios share."""

    def __init__(self, cfg, url: str, broker_url: str, workdir: Path) -> None:
        from mgrpo.bus.kombu_bus import KombuBus
        from mgrpo.services.context import Queues
        from mgrpo.store import Store

        self.cfg, self.broker_url, self.workdir = cfg, broker_url, workdir
        self.prefix = f"fp{uuid.uuid4().hex[:10]}."
        self.queues = Queues(self.prefix)
        self.store = Store(url)
        self.store.upgrade()
        config_file = workdir / "run.yaml"
        config_file.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        env = {**os.environ, "MGRPO_MODE": "distributed", "MGRPO_DATABASE_URL": url,
               "MGRPO_BROKER_URL": broker_url, "MGRPO_RUN_CONFIG": str(config_file),
               "MGRPO_QUEUE_PREFIX": self.prefix,
               "MGRPO_CHECKPOINT_URI": str(workdir / "ckpt"), "MGRPO_API_TOKEN": TOKEN,
               "MGRPO_CONSUMER_GRACE_S": "2",  # /healthz 503 2 s into a broker outage
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("MGRPO_ENGINE", None)  # real tiny models
        self.procs = ServiceProcesses(env, workdir)
        self.bus = KombuBus(broker_url, self.store,
                            dead_letter_queue_name=self.queues.dead_letter)
        self.api_port = free_port()
        self.workers: list[str] = []

    def start(self) -> float:
        started = time.perf_counter()
        start_services(self.procs, self.cfg)
        self.workers = list(self.procs.procs)
        self.procs.start("control", "serve", "control")
        self.procs.start("planner-api", "serve", "planner", "--port", str(self.api_port),
                         port=self.api_port)
        self.procs.wait_healthy(timeout_s=600)
        return time.perf_counter() - started

    def close(self) -> None:
        from kombu import Connection

        try:
            self.procs.stop_all()
        finally:
            self.bus.close()
            delete_queues(self.broker_url, self.prefix, self.procs, self.cfg)
            with Connection(self.broker_url) as connection:  # the control worker's
                for name in ("mgrpo.control", "mgrpo.evaluations"):
                    with contextlib.suppress(Exception):  # never declared
                        connection.channel().queue_delete(self.prefix + name)
            self.store.close()

    # --- helpers -------------------------------------------------------------------------

    def start_round(self):
        from mgrpo.services.rounds import start_round

        return start_round(self.store, self.bus, self.cfg, self.queues)

    def wait_done(self, round_id: str, timeout_s: float = ROUND_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.store.get_round(round_id).status
            if status in ("done", "failed", "cancelled") or time.monotonic() > deadline:
                return status
            time.sleep(0.05)

    def letters(self, want: int, timeout_s: float = 30.0) -> list:
        """Dead letters taken off the queue: until ``want`` came or ``timeout_s``, then one
        more pass a second later (a late extra one counts here, not in the next scenario)."""
        got: list = []
        deadline = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < deadline:
            got.extend(self.bus.dead_letters())
            time.sleep(0.2)
        time.sleep(1.0)
        got.extend(self.bus.dead_letters())
        return got

    def check_round(self, round_id: str, status: str, seconds: float) -> dict:
        """The round's counts: trained trajectories per model vs the expected ones, stored
        duplicates, checkpoint versions."""
        from mgrpo.services.trainer.readiness import expected_subagent_trajectories

        progress = self.store.round_progress(round_id)
        metrics = self.store.metrics(self.cfg.name, round_id).get(round_id, {})
        trained, expected, duplicates = {}, {}, {}
        for model in MODELS:
            roles = [r for r, m in self.cfg.agents.items() if m == model]
            expected[model] = (progress.total if "planner" in roles else
                               sum(expected_subagent_trajectories(self.store, r, round_id)[1]
                                   for r in roles))
            value = metrics.get(f"{model}/trajectories")
            trained[model] = None if value is None else int(value)
            trajs = self.store.round_trajectories(round_id, model)
            duplicates[model] = len(trajs) - len({(t.traj_id, t.attempt) for t in trajs})
        versions = {m: getattr(self.store.latest_checkpoint(m, self.cfg.name), "version", None)
                    for m in MODELS}
        return {"round_id": round_id, "status": status, "completed": progress.completed,
                "total": progress.total, "seconds_to_done": round(seconds, 2),
                "trained": trained, "expected": expected, "duplicates": duplicates,
                "checkpoint_versions": versions,
                "same_checkpoint_version": len(set(versions.values())) == 1}

    def healthz(self, name: str) -> int | None:
        import httpx

        try:
            return httpx.get(f"http://127.0.0.1:{self.procs.ports[name]}/healthz",
                             timeout=1).status_code
        except httpx.HTTPError:
            return None


def summarize_letters(letters: list) -> list[dict]:
    return [{"queue": letter.queue, "reason": letter.reason[:200]} for letter in letters]


def timed_round(probe: Probe, before=None) -> tuple[str, str, float]:
    started = time.monotonic()
    record = probe.start_round()
    if before is not None:
        before(record)
    status = probe.wait_done(record.round_id)
    return record.round_id, status, time.monotonic() - started


# --- scenarios -----------------------------------------------------------------------------

def poison(probe: Probe) -> dict:
    queues = [probe.queues.episodes, probe.queues.subagent("searcher"),
              probe.queues.trainer("planner")]
    for queue in queues:
        probe.bus.publish_raw(queue, POISON)
    round_id, status, seconds = timed_round(probe)
    letters = probe.letters(len(queues))
    hostile = {queue: sum(letter.queue == queue and letter.body.startswith('{"kind":[[')
                          for letter in letters) for queue in queues}
    return {"hostile_sent": len(queues), "hostile_dead_lettered": hostile,
            "dead_letters": summarize_letters(letters),
            **probe.check_round(round_id, status, seconds)}


def hostile_trajectory(probe: Probe) -> dict:
    from mgrpo.bus.messages import TrajectoryMessage

    sent: dict[str, tuple[str, str]] = {}  # name -> (queue, message_id)
    state: dict = {}

    def inject(record) -> None:
        rid, deadline = record.round_id, time.monotonic() + 60
        while (not probe.store.round_trajectories(rid, "planner")
               and time.monotonic() < deadline):
            time.sleep(0.01)
        state["round_status_at_send"] = probe.store.get_round(rid).status
        state["completed_at_send"] = probe.store.round_progress(rid).completed
        real = probe.store.round_trajectories(rid, "planner")[0]
        big = list(real.input_ids)
        big[-1] = 10**9
        other = list(real.input_ids)
        other[-1] = (other[-1] + 1) % 500  # another id inside the vocabulary (600)
        messages = {
            "token_id_1e9": (probe.queues.trainer("planner"), TrajectoryMessage(
                trajectory=real.model_copy(update={"attempt": real.attempt + 100,
                                                   "input_ids": big}))),
            "same_id_attempt_other_content": (probe.queues.trainer("planner"),
                                              TrajectoryMessage(trajectory=real.model_copy(
                                                  update={"result": "hostile",
                                                          "input_ids": other}))),
            "unrecorded_invocation_99": (probe.queues.trainer("searcher"), TrajectoryMessage(
                trajectory=real.model_copy(update={
                    "traj_id": f"{rid}/{real.query_id}/{real.rollout}/searcher/99",
                    "agent": "searcher", "model": "searcher", "invocation": 99,
                    "subtask": "hostile", "result": "hostile"}))),
        }
        for name, (queue, message) in messages.items():
            probe.bus.publish(queue, message)
            sent[name] = (queue, message.message_id)

    round_id, status, seconds = timed_round(probe, before=inject)
    letters = probe.letters(len(sent))
    hostile = {name: sum(letter.queue == queue and message_id in letter.body
                         for letter in letters) for name, (queue, message_id) in sent.items()}
    return {"hostile_sent": len(sent), "hostile_dead_lettered": hostile, **state,
            "dead_letters": summarize_letters(letters),
            **probe.check_round(round_id, status, seconds)}


def concurrent_starts(probe: Probe, threads: int = 20) -> dict:
    import httpx

    before = {r.round_id for r in probe.store.list_rounds(probe.cfg.name)}
    barrier = threading.Barrier(threads)
    codes: list = []
    lock = threading.Lock()
    url = f"http://127.0.0.1:{probe.api_port}/v1/rounds"

    def post() -> None:
        with httpx.Client(timeout=60) as client:
            barrier.wait()
            try:
                code = client.post(url, json={},
                                   headers={"Authorization": f"Bearer {TOKEN}"}).status_code
            except httpx.HTTPError as error:
                code = type(error).__name__
        with lock:
            codes.append(code)

    started = time.monotonic()
    pool = [threading.Thread(target=post) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    created = [r.round_id for r in probe.store.list_rounds(probe.cfg.name)
               if r.round_id not in before]
    out = {"requests": threads, "status_201": codes.count(201), "status_409": codes.count(409),
           "other_statuses": sorted(str(c) for c in codes if c not in (201, 409)),
           "rounds_created": len(created)}
    statuses = {rid: probe.wait_done(rid) for rid in created}
    letters = probe.letters(0, timeout_s=0)
    out["dead_letters"] = summarize_letters(letters)
    if len(created) == 1:
        out.update(probe.check_round(created[0], statuses[created[0]],
                                     time.monotonic() - started))
    else:
        out["statuses"] = statuses
    return out


def unpublished_round(probe: Probe) -> dict:
    from mgrpo.services.rounds import start_round

    def killed(sends):
        raise SystemExit("killed between creating the round and publishing")

    started = time.monotonic()
    probe.bus.publish_many = killed  # this instance only, put back below
    try:
        start_round(probe.store, probe.bus, probe.cfg, probe.queues)
    except SystemExit:
        pass
    finally:
        del probe.bus.publish_many
    record = probe.store.list_rounds(probe.cfg.name)[-1]
    out = {"published_at_create": record.published, "status_at_create": record.status}
    published_s = None
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while time.monotonic() < deadline:
        now = probe.store.get_round(record.round_id)
        if published_s is None and now.published:
            published_s = time.monotonic() - started
        if now.status in ("done", "failed", "cancelled"):
            break
        time.sleep(0.2)
    status = probe.store.get_round(record.round_id).status
    out["seconds_to_published"] = None if published_s is None else round(published_s, 1)
    out["dead_letters"] = summarize_letters(probe.letters(0, timeout_s=0))
    return {**out, **probe.check_round(record.round_id, status, time.monotonic() - started)}


def rabbitmqctl(*argv: str, timeout_s: float = 90) -> str:
    done = subprocess.run(["rabbitmqctl", *argv], capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    return f"rc={done.returncode}"


def broker_restart(probe: Probe, max_down_s: float = 20.0) -> dict:
    worker = probe.procs.procs["planner-worker"]
    out: dict = {}
    started = time.monotonic()
    stopped_at, record, codes = None, None, {}
    worker.send_signal(signal.SIGSTOP)  # holds the round open across stop_app (docstring)
    try:
        record = probe.start_round()
        out["stop_app"] = rabbitmqctl("stop_app")
        stopped_at = time.monotonic()
        out["status_when_broker_down"] = probe.store.get_round(record.round_id).status
        out["completed_when_broker_down"] = probe.store.round_progress(
            record.round_id).completed
        worker.send_signal(signal.SIGCONT)
        deadline = stopped_at + max_down_s
        while time.monotonic() < deadline:
            codes = {name: probe.healthz(name) for name in probe.workers}
            if all(code == 503 for code in codes.values()):
                break
            time.sleep(0.2)
        out["healthz_before_start_app"] = codes
        out["workers_503"] = sum(code == 503 for code in codes.values())
    finally:
        worker.send_signal(signal.SIGCONT)
        out["start_app"] = rabbitmqctl("start_app")  # always: a no-op on a running broker
        rabbitmqctl("await_startup", "--timeout", "60")
        out["broker_down_s"] = round(time.monotonic() - (stopped_at or started), 1)
    status = probe.wait_done(record.round_id)
    seconds = time.monotonic() - started
    deadline = time.monotonic() + 30  # the workers' consumers are back
    while time.monotonic() < deadline and any(probe.healthz(n) != 200 for n in probe.workers):
        time.sleep(0.5)
    out["healthz_after"] = {name: probe.healthz(name) for name in probe.workers}
    out["dead_letters"] = summarize_letters(probe.letters(0, timeout_s=0))
    return {**out, **probe.check_round(record.round_id, status, seconds)}


# --- the run -------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(RESULT_FILE))
    parser.add_argument("--skip", nargs="*", default=[], choices=SCENARIOS)
    parser.add_argument("--sft-steps", type=int, default=150,
                        help="warm-start SFT steps of the tiny planner and searcher (the "
                        "round bench's: the planner then delegates)")
    parser.add_argument("--postgres-url", default=os.environ.get(
        "MGRPO_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--broker-url", default=os.environ.get(
        "MGRPO_TEST_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"))
    args = parser.parse_args()

    from mgrpo.experiments.tiny_assets import prepare_cached
    from mgrpo.store.admin import temporary_database

    began, load_before = time.monotonic(), load_avg()
    paths = prepare_cached(args.sft_steps)
    rows: dict[str, dict] = {}
    startup_s = float("nan")
    with tempfile.TemporaryDirectory() as tmp, temporary_database(args.postgres_url) as url:
        cfg = make_config(paths, Path(tmp) / "out", b=3, k=2, name="probe")
        probe = Probe(cfg, url, args.broker_url, Path(tmp))
        try:
            startup_s = probe.start()
            for name in SCENARIOS:
                if name in args.skip:
                    continue
                dead_before = set(probe.procs.dead())
                load_at = load_avg()
                try:
                    rows[name] = globals()[name](probe)
                except Exception as error:  # noqa: BLE001 - recorded, the next one runs
                    rows[name] = {"error": f"{type(error).__name__}: {error}"[:2000]}
                rows[name]["died"] = sorted(set(probe.procs.dead()) - dead_before)
                rows[name]["load_at_start"] = load_at
                print(json.dumps({"scenario": name, **rows[name]}, default=str), flush=True)
        finally:
            probe.close()
    failures = [p for name, row in rows.items() for p in problems(name, row)]
    result = {"scenarios": rows, "failures": failures, "startup_s": round(startup_s, 1),
              "wall_s": round(time.monotonic() - began, 1), "skipped": args.skip,
              "size": {"queries_per_round": 3, "k": 2, "sft_steps": args.sft_steps},
              "machine": machine(), "load_avg_before": load_before,
              "load_avg_after": load_avg()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    print(table(rows))
    print(f"load average before {load_before}, after {result['load_avg_after']}; "
          f"wall {result['wall_s']} s; failures: {failures or 'none'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
