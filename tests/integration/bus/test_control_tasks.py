"""The control plane's Celery tasks through the real RabbitMQ and a real Celery worker (solo
pool, one task at a time, started in this process), on a fresh PostgreSQL database: each task
has its effect, a malformed payload is dead-lettered with the reason, a transient failure is
retried with back-off, and replays and redeliveries act once."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker
from celery.signals import task_retry
from kombu import Connection
from queues_cleanup import delete_run_queues

import mgrpo.bus.kombu_bus as kombu_bus
from mgrpo.bus.app import control_app, send_control
from mgrpo.bus.control import (
    TASK_PRUNE_CHECKPOINTS,
    TASK_REPLAY_DEAD_LETTERS,
    TASK_ROUND,
    CancelRound,
    PruneCheckpoints,
    ReplayDeadLetters,
    StartRound,
)
from mgrpo.bus.kombu_bus import KombuBus
from mgrpo.bus.topology import work_queue
from mgrpo.config import Settings
from mgrpo.models.checkpoint import MANIFEST, list_versions, run_root, version_uri
from mgrpo.parallel.optimizer_state import optimizer_state_uri
from mgrpo.services.context import Queues
from mgrpo.services.control.tasks import Backoff, ControlContext, register_control_tasks
from mgrpo.store import Store
from mgrpo.store.admin import temporary_database
from mgrpo.training.config import ModelConfig, RunConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "services"))
from services_testkit import make_bench  # noqa: E402

TIMEOUT_S = 20.0
SHA = "0" * 64


@pytest.fixture(scope="module")
def control(postgres_url, rabbitmq_url, tmp_path_factory):
    """(ctx, app, reader bus): a control worker running for the whole module."""
    root = tmp_path_factory.mktemp("control")
    prefix = f"ctl{time.time_ns()}."
    cfg = RunConfig(models={m: ModelConfig(path=str(root / m)) for m in
                            ("planner", "searcher", "coder")},
                    bench_dir=str(make_bench(root / "bench")), queries_per_round=2, k=2)
    with temporary_database(postgres_url) as url:
        store = Store(url)
        store.upgrade()
        settings = Settings(broker_url=rabbitmq_url, database_url=url, queue_prefix=prefix,
                            checkpoint_uri=str(root / "ckpt"))
        queues = Queues(prefix)
        bus = KombuBus(rabbitmq_url, store, dead_letter_queue_name=queues.dead_letter)
        reader = KombuBus(rabbitmq_url, dead_letter_queue_name=queues.dead_letter)
        ctx = ControlContext(settings, store, bus, cfg, queues)
        app = control_app(settings)
        register_control_tasks(app, ctx, Backoff(first_s=0.2, max_s=0.4, max_retries=3))
        try:
            with start_worker(app, pool="solo", concurrency=1,
                              queues=[app.conf.mgrpo_control_queue],
                              perform_ping_check=False, shutdown_timeout=30):
                yield ctx, app, reader
        finally:
            bus.close()
            reader.close()
            store.close()
            delete_run_queues(rabbitmq_url, queues, subagents=(),
                              extra=(app.conf.mgrpo_control_queue, prefix + "replay.source"))



def _until(condition, what: str):
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if (value := condition()):
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _done(ctx, task: str, n: int) -> None:
    _until(lambda: ctx.done.get(task, 0) >= n, f"{n} x {task}")


def _message_count(bus: KombuBus, queue: str) -> int:
    with Connection(bus.broker_url) as connection:
        return connection.channel().queue_declare(queue, passive=True).message_count


def _letters(reader: KombuBus, n: int) -> list:
    got: list = []
    _until(lambda: got.extend(reader.dead_letters()) or len(got) >= n, f"{n} dead letter(s)")
    return got


def _write_version(root: str, model: str, version: int) -> None:
    folder = Path(version_uri(root, model, version))
    folder.mkdir(parents=True)
    (folder / MANIFEST).write_text("{}")
    Path(optimizer_state_uri(str(folder))).write_text("optimizer")


def test_prune_keeps_the_newest_versions_and_is_idempotent(control):
    ctx, app, _ = control
    run, model = "prune-run", "searcher"
    root = run_root(ctx.settings.checkpoint_uri, run)
    _write_version(root, model, 0)  # unrecorded, older than every kept one: a killed prune
    for version in range(1, 6):
        _write_version(root, model, version)
        ctx.store.record_checkpoint(model, version, version_uri(root, model, version), SHA,
                                    run_id=run)
    before = ctx.done.get(TASK_PRUNE_CHECKPOINTS, 0)
    send_control(app, TASK_PRUNE_CHECKPOINTS, PruneCheckpoints(run_id=run, model=model, keep=2))
    _done(ctx, TASK_PRUNE_CHECKPOINTS, before + 1)
    assert list_versions(root, model) == [4, 5]
    assert sorted(c.version for c in ctx.store.list_checkpoints(model, run_id=run)) == [4, 5]
    assert not Path(optimizer_state_uri(version_uri(root, model, 1))).exists()
    assert Path(optimizer_state_uri(version_uri(root, model, 4))).exists()
    send_control(app, TASK_PRUNE_CHECKPOINTS, PruneCheckpoints(run_id=run, model=model, keep=2))
    _done(ctx, TASK_PRUNE_CHECKPOINTS, before + 2)
    assert list_versions(root, model) == [4, 5]


def test_malformed_payloads_are_dead_lettered_with_the_reason(control):
    ctx, app, reader = control
    queue = app.conf.mgrpo_control_queue
    options = {"queue": work_queue(queue, ctx.queues.dead_letter), "routing_key": queue}
    app.send_task(TASK_PRUNE_CHECKPOINTS, args=[{"run_id": "r", "model": "searcher",
                                                 "keep": 0}], **options)
    app.send_task(TASK_ROUND, args=[{"command": "restart", "round_id": "x"}], **options)
    app.send_task(TASK_REPLAY_DEAD_LETTERS, args=[{}, {}], **options)
    letters = sorted(_letters(reader, 3), key=lambda letter: letter.reason)
    reasons = [letter.reason for letter in letters]
    assert "invalid mgrpo.control.prune_checkpoints payload: keep: Input should be greater " \
           "than or equal to 1" in reasons[0]
    assert "invalid mgrpo.control.round payload" in reasons[1] and "'restart'" in reasons[1]
    assert "takes one argument, its payload; got 2 argument(s)" in reasons[2]
    assert all(letter.queue == queue for letter in letters)


def test_a_dead_letter_is_replayed_once_when_replays_race(control, rabbitmq_url):
    ctx, app, reader = control
    source = ctx.queues.prefix + "replay.source"
    ctx.bus.declare_queue(ctx.bus.work_queue(source))
    reader.dead_letter(source, '{"kind": "trajectory"}', "handler failed: test")
    before = ctx.done.get(TASK_REPLAY_DEAD_LETTERS, 0)
    racer = KombuBus(rabbitmq_url, dead_letter_queue_name=ctx.queues.dead_letter)
    try:
        task_id = send_control(app, TASK_REPLAY_DEAD_LETTERS, ReplayDeadLetters(source=source))
        send_control(app, TASK_REPLAY_DEAD_LETTERS, ReplayDeadLetters(), task_id=task_id)
        send_control(app, TASK_REPLAY_DEAD_LETTERS, ReplayDeadLetters())
        outside = threading.Thread(target=racer.replay_report, args=(1000,))
        outside.start()  # `mgrpo dlq replay` at the same time
        outside.join(TIMEOUT_S)
        _done(ctx, TASK_REPLAY_DEAD_LETTERS, before + 2)  # the redelivered id ran once
        _until(lambda: _message_count(ctx.bus, ctx.queues.dead_letter) == 0, "an empty DLQ")
        time.sleep(0.5)  # a third replay would have landed by now
        assert _message_count(ctx.bus, source) == 1
        assert ctx.done.get(TASK_REPLAY_DEAD_LETTERS, 0) == before + 2
    finally:
        racer.close()


def test_a_transient_failure_is_retried_with_backoff(control, monkeypatch):
    ctx, app, _ = control
    source = ctx.queues.prefix + "replay.source"
    ctx.bus.declare_queue(ctx.bus.work_queue(source))
    with Connection(ctx.bus.broker_url) as connection:
        connection.channel().queue_purge(source)
    ctx.bus.dead_letter(source, '{"kind": "trajectory"}', "handler failed: test")
    monkeypatch.setattr(kombu_bus, "DEAD_LETTER_LOCK_WAIT_S", 0.1)
    retries: list[float] = []

    def on_retry(request=None, **_):
        retries.append(time.monotonic())

    task_retry.connect(on_retry, weak=False)
    before = ctx.done.get(TASK_REPLAY_DEAD_LETTERS, 0)
    holder = Connection(ctx.bus.broker_url)
    try:  # hold the dead-letter queue's pass lock: the replay task meets DeadLetterBusy
        kombu_bus._hold_pass_lock(holder, ctx.queues.dead_letter, 1.0)
        send_control(app, TASK_REPLAY_DEAD_LETTERS, ReplayDeadLetters(source=source))
        _until(lambda: len(retries) >= 2, "two retries")
        holder.release()
        _done(ctx, TASK_REPLAY_DEAD_LETTERS, before + 1)
    finally:
        holder.release()
        task_retry.disconnect(on_retry)
    assert _message_count(ctx.bus, source) == 1
    assert retries[1] - retries[0] >= 0.2  # the back-off: first_s, then twice as long


def test_round_commands_start_and_cancel_a_round(control, monkeypatch):
    ctx, app, reader = control
    run = "ctl-run"
    before = ctx.done.get(TASK_ROUND, 0)
    send_control(app, TASK_ROUND, StartRound(command="start", run_id=run, index=0))
    send_control(app, TASK_ROUND, StartRound(command="start", run_id=run, index=0))  # again
    _done(ctx, TASK_ROUND, before + 2)
    record = ctx.store.get_round(f"{run}-r0000")
    assert record is not None and record.status == "running"
    assert _message_count(ctx.bus, ctx.queues.episodes) == 2 * 2  # B queries x K, once
    send_control(app, TASK_ROUND, CancelRound(command="cancel", round_id=f"{run}-r0000"))
    _done(ctx, TASK_ROUND, before + 3)
    assert ctx.store.get_round(f"{run}-r0000").status == "cancelled"
    send_control(app, TASK_ROUND, CancelRound(command="cancel", round_id="no-such-round"))
    [letter] = _letters(reader, 1)
    assert "round 'no-such-round' does not exist" in letter.reason
    # a replayed control letter runs as the same task again (and fails again, for the same
    # reason, since the round still does not exist)
    reader.dead_letter(letter.queue, letter.body, letter.reason)
    [replayed] = reader.replay_dead_letters(source=app.conf.mgrpo_control_queue)
    [again] = _letters(reader, 1)
    assert again.reason == letter.reason and again.body == replayed.body


def test_the_cli_sends_each_task_to_the_worker(control, monkeypatch):
    """`mgrpo control ...` through the broker to the running worker: a prune, then a cancel."""
    from typer.testing import CliRunner

    from mgrpo.cli.main import app as cli
    from mgrpo.config import get_settings

    ctx, _, reader = control
    run, model = "cli-run", "coder"
    root = run_root(ctx.settings.checkpoint_uri, run)
    for version in (1, 2, 3):
        _write_version(root, model, version)
        ctx.store.record_checkpoint(model, version, version_uri(root, model, version), SHA,
                                    run_id=run)
    monkeypatch.setenv("MGRPO_QUEUE_PREFIX", ctx.settings.queue_prefix)
    monkeypatch.setenv("MGRPO_BROKER_URL", ctx.settings.broker_url)
    get_settings.cache_clear()
    try:
        before = ctx.done.get(TASK_PRUNE_CHECKPOINTS, 0)
        result = CliRunner().invoke(cli, ["control", "prune", "--run-id", run, "--model",
                                          model, "--keep", "1"])
        assert result.exit_code == 0, result.output
        assert f'"queue": "{ctx.settings.queue_prefix}mgrpo.control"' in result.output
        _done(ctx, TASK_PRUNE_CHECKPOINTS, before + 1)
        assert list_versions(root, model) == [3]
        result = CliRunner().invoke(cli, ["control", "cancel-round", "cli-no-such-round"])
        assert result.exit_code == 0, result.output
        [letter] = _letters(reader, 1)
        assert "round 'cli-no-such-round' does not exist" in letter.reason
        refused = CliRunner().invoke(cli, ["control", "prune", "--run-id", "a/b", "--model",
                                           model, "--keep", "1"])
        assert refused.exit_code == 1 and "invalid PruneCheckpoints: run_id" in refused.output
    finally:
        get_settings.cache_clear()


def test_a_trainer_sends_its_pruning_to_the_control_worker(control):
    """MGRPO_CONTROL_PRUNE: the trainer's prune after a save is a task the worker runs;
    without it the trainer prunes itself."""
    from mgrpo.services.trainer.weights import RunWeights, TrainedModel

    ctx, _, _ = control
    run, model = "trainer-run", "planner"
    root = run_root(ctx.settings.checkpoint_uri, run)

    def record(version: int) -> None:
        _write_version(root, model, version)
        ctx.store.record_checkpoint(model, version, version_uri(root, model, version), SHA,
                                    run_id=run)

    for version in (1, 2, 3, 4):
        record(version)
    weights = RunWeights(ctx.settings.model_copy(update={"control_prune": True}), ctx.cfg,
                         ctx.store, TrainedModel(name=model, model=None, tokenizer=None,
                                                 engine=None, optimizer=None))
    before = ctx.done.get(TASK_PRUNE_CHECKPOINTS, 0)
    assert weights.prune(run, 2) == []  # sent, nothing deleted here
    _done(ctx, TASK_PRUNE_CHECKPOINTS, before + 1)
    assert list_versions(root, model) == [3, 4]
    record(5)
    weights.settings = ctx.settings  # control_prune off: the trainer deletes v3 itself
    assert weights.prune(run, 2) == [3]
    assert list_versions(root, model) == [4, 5]
    assert ctx.done.get(TASK_PRUNE_CHECKPOINTS, 0) == before + 1


def test_a_control_message_that_is_not_utf8_is_dead_lettered(control):
    ctx, app, reader = control
    queue = app.conf.mgrpo_control_queue
    reader.publish_raw(queue, b'\xff\xfe{"task": "x"}')  # Celery cannot decode it
    [letter] = _letters(reader, 1)
    assert letter.queue == queue
    assert "Celery could not decode its body" in letter.reason, letter.reason
    assert letter.raw == b'\xff\xfe{"task": "x"}'


def test_a_broker_dead_lettered_task_is_replayed_with_its_celery_headers(control):
    from mgrpo.bus.topology import DLX

    ctx, app, reader = control
    queue, dlq = app.conf.mgrpo_control_queue, ctx.queues.dead_letter
    before = ctx.done.get(TASK_PRUNE_CHECKPOINTS, 0)
    # a protocol-2 task message as the broker dead-letters it: Celery's headers, x-death
    app.send_task(TASK_PRUNE_CHECKPOINTS, args=[{"run_id": "no-run", "model": "coder",
                                                 "keep": 1}],
                  exchange=DLX, routing_key=dlq,
                  headers={"x-death": [{"queue": queue, "reason": "rejected", "count": 1}]})
    _until(lambda: _message_count(ctx.bus, dlq) == 1, "the letter in the DLQ")
    [replayed] = reader.replay_dead_letters(source=queue)
    assert replayed.headers["task"] == TASK_PRUNE_CHECKPOINTS
    assert "x-death" not in replayed.headers
    _done(ctx, TASK_PRUNE_CHECKPOINTS, before + 1)  # consumed as the task it was
    assert _message_count(ctx.bus, dlq) == 0


def test_start_round_has_the_apis_limits_refused_not_clamped(control):
    ctx, app, reader = control
    queue = app.conf.mgrpo_control_queue
    options = {"queue": work_queue(queue, ctx.queues.dead_letter), "routing_key": queue}
    for size in ({"k": 500}, {"queries_per_round": 100_000}, {"queries_per_round": 1000}):
        app.send_task(TASK_ROUND, args=[{"command": "start", "run_id": "limits", "index": 0,
                                         **size}], **options)
    reasons = sorted(letter.reason for letter in _letters(reader, 3))
    assert "k: Input should be less than or equal to 64" in reasons[0], reasons
    assert "queries_per_round: Input should be less than or equal to 4096" in reasons[0] + \
        reasons[1], reasons
    assert any("queries_per_round=1000 is larger than the training pool" in r
               for r in reasons), reasons
    assert ctx.store.get_round("limits-r0000") is None
