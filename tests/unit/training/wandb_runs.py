"""Run under the W&B venv (``make wandb-venv``) by test_wandb_sink.py: a real embedded run and
a real distributed round (in-process services, scripted policies, real trainers), both with
``report_to: [tensorboard, wandb]`` and ``WANDB_MODE=offline``; then reads the offline run
files back and prints one JSON line: ``{run display name: {"dir": ..., "group": ...,
"history": [{"_step": N, key: value, ...}, ...]}}``.

The offline ``run-<id>.wandb`` file is wandb's record log (the LevelDB log format: 32 KiB
blocks of chunks with a 7-byte header, after a 7-byte ``:W&B`` file header) of protobuf
``Record`` messages; wandb 0.31 ships the protobuf classes but no Python reader.

Usage: python wandb_runs.py ROOT
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "services"))  # services_testkit

BLOCK = 32768


def wandb_records(path: Path):
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a wandb record log")
    pos, chunks = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # block trailer
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:  # zero padding to the block's end
            pos += left
            continue
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def read_offline_runs(wandb_dir: Path) -> dict:
    runs = {}
    for path in sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb")):
        name, group, history = None, None, []
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                name, group = record.run.display_name, record.run.run_group
            elif kind == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                       for item in record.history.item}
                history.append({k: v for k, v in row.items()
                                if k == "_step" or not k.startswith("_")})
        runs[name] = {"dir": str(path.parent), "group": group, "history": history}
    return runs


def embedded(root: Path) -> None:
    from services_testkit import make_bench, make_tiny

    from mgrpo.training.config import RunConfig
    from mgrpo.training.loop import run_training

    tiny, bench = make_tiny(root / "tiny"), make_bench(root / "bench")
    models = {m: {"path": str(tiny), "lr": 1e-3, "micro_batch_size": 4}
              for m in ("planner", "searcher", "coder")}
    run_training(RunConfig.model_validate({
        "name": "wb", "seed": 0, "models": models, "k": 2, "queries_per_round": 2,
        "stages": [{"stage": 1, "rounds": 1}], "report_to": ["tensorboard", "wandb"],
        "sampling": {"planner_max_turns": 2, "subagent_max_turns": 2, "max_new_tokens": 6},
        "eval_questions": 1, "bench_dir": str(bench), "out_dir": str(root / "run")}),
        progress=False)


def distributed(root: Path) -> None:
    import yaml
    from services_testkit import (
        embedded_settings,
        in_process_services,
        make_bench,
        make_tiny,
        wait_done,
        write_run_config,
    )

    from mgrpo.services.context import Queues
    from mgrpo.services.rounds import start_round

    cfg_path = write_run_config(root / "run.yaml", make_tiny(root / "tiny"),
                                make_bench(root / "bench"), name="wbsvc", k=2, queries=2)
    data = yaml.safe_load(cfg_path.read_text())
    cfg_path.write_text(yaml.safe_dump({**data, "report_to": ["tensorboard", "wandb"]}))
    settings = embedded_settings(root, cfg_path, tensorboard_dir=str(root / "tb"))
    with in_process_services(settings) as svc:  # on exit the trainers finish the W&B runs
        record = start_round(svc.store, svc.bus, svc.cfg, Queues())
        if wait_done(svc.store, record.round_id, timeout_s=300) not in ("done", "failed"):
            raise TimeoutError("the round did not finish in 300 s")
        metrics = svc.store.metrics("wbsvc", record.round_id)[record.round_id]
        (root / "recorded.json").write_text(json.dumps(metrics))


def main() -> None:
    import torch

    torch.set_num_threads(1)
    root = Path(sys.argv[1])
    os.environ.pop("WANDB_DIR", None)
    embedded(root / "embedded")  # W&B folder: the run's out_dir
    os.environ["WANDB_DIR"] = str(root / "wandb_dir")  # trainers: WANDB_DIR
    distributed(root / "distributed")
    print(json.dumps({"embedded": read_offline_runs(root / "embedded" / "run"),
                      "distributed": read_offline_runs(root / "wandb_dir")}))


if __name__ == "__main__":
    main()
