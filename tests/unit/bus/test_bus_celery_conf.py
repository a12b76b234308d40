"""The Celery app factory's delivery settings and topology (no broker needed)."""

from __future__ import annotations

from mgrpo.bus.app import TASK_FOR_KIND, make_celery_app, register_task
from mgrpo.bus.messages import MESSAGE_KINDS
from mgrpo.bus.names import DEAD_LETTER_EXCHANGE, TASK_TRAINER_INGEST, trainer_queue
from mgrpo.config import Settings


def test_delivery_settings_follow_the_messaging_rules():
    app = make_celery_app(Settings(), [trainer_queue("planner")])
    conf = app.conf
    assert conf.accept_content == ["json"] and conf.task_serializer == "json"
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert not conf.task_create_missing_queues
    queues = {q.name: q for q in conf.task_queues}
    assert set(queues) >= {"planner.episodes", "planner.replies", "trainer.planner",
                           "mgrpo.dead_letter"}
    trainer = queues["trainer.planner"]
    assert trainer.durable
    assert trainer.queue_arguments["x-dead-letter-exchange"] == DEAD_LETTER_EXCHANGE


def test_every_message_kind_has_a_task():
    assert set(TASK_FOR_KIND) == set(MESSAGE_KINDS)


def test_registered_task_keeps_its_explicit_name():
    app = make_celery_app(Settings())
    task = register_task(app, TASK_TRAINER_INGEST, lambda message: None)
    assert task.name == "trainer.ingest" and "trainer.ingest" in app.tasks


def test_worker_names_are_unique_per_process_and_call():
    import os

    from mgrpo.bus.app import worker_name

    first, second = worker_name("control"), worker_name("control")
    assert first != second
    assert first.startswith(f"control-{os.getpid()}-") and "@" in first


def test_undecodable_bodies_go_to_the_dead_letter_queue():
    app = make_celery_app(Settings())
    assert app.conf.worker_consumer == "mgrpo.bus.celery_consumer:DeadLetteringConsumer"
