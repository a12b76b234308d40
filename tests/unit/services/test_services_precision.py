"""A run with bf16 autocast, gradient checkpointing and a cosine schedule with warm-up trains
through the services (in one process: in-memory bus, SQLite store, real tiny models in the
trainers): the trainer service reads the same model fields as the embedded loop."""

from __future__ import annotations

import yaml
from services_testkit import (
    embedded_settings,
    in_process_services,
    make_bench,
    make_tiny,
    wait_done,
    write_run_config,
)

from mgrpo.algo.schedules import lr_at
from mgrpo.services.context import Queues
from mgrpo.services.rounds import start_round


def test_bf16_checkpointed_cosine_rounds_train_through_the_services(tmp_path):
    cfg_path = write_run_config(tmp_path / "run.yaml", make_tiny(tmp_path / "tiny"),
                                make_bench(tmp_path / "bench"), k=2, queries=2)
    data = yaml.safe_load(cfg_path.read_text())
    for m in data["models"].values():
        m.update(dtype="bfloat16", gradient_checkpointing=True, lr_schedule="cosine",
                 warmup_steps=1, mini_batches=2, weight_decay=0.01)
    data["stages"] = [{"stage": 1, "rounds": 3}]
    cfg_path.write_text(yaml.safe_dump(data))
    with in_process_services(embedded_settings(tmp_path, cfg_path), poll_s=0.2) as svc:
        for _ in range(2):
            record = start_round(svc.store, svc.bus, svc.cfg, Queues())
            assert wait_done(svc.store, record.round_id) == "done"
        lm = svc.trainers["planner"].lm
        assert lm.model.is_gradient_checkpointing
        assert type(lm.optimizer).__name__ == "AdamW"
        # 2 rounds x 2 steps taken of the run's 3 x 2: the next step's rate, from Adam's count
        assert lm.optimizer.param_groups[0]["lr"] == lr_at(3, 1e-3, "cosine", 1, 6)
        metrics = svc.store.metrics(svc.cfg.name, record.round_id)[record.round_id]
        assert {c.version for c in svc.store.list_checkpoints("planner")} == {1, 2}
    assert metrics["planner/num_tokens"] > 0 and "planner/entropy" in metrics
