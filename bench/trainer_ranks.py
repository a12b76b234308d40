"""The trainer service's update as a torchrun job of 1 vs 2 ranks (CPU, gloo), FSDP2 and DDP:
what rank 0 of ``mgrpo serve trainer`` pays per round for ``update_model`` under
``mgrpo.parallel.ranks``: the ``update`` command (the round's samples broadcast
from rank 0) plus the data-parallel policy update; 1 rank is the single-process trainer's
path (no wrapper, no process group). Then one checkpoint save, timed: 1 rank the
single-process trainer's (``.optimizer.pt`` + the folder), 2 ranks ``Ranks.save`` (the
optimizer shards by DCP, the weights gathered to rank 0, the same folder). The tiny
model and synthetic samples of ``bench/rank_timing.py``. The ranks are started once; the
update is timed ``--repeats`` times in the same job (the first, with its warm-up, kept
apart).

The machine's load (1-minute load average, CPU count) is recorded next to the figures: on a
shared machine a second rank competes with everything else for the same cores, so the ratio
says what gloo costs here, not what GPUs would do.

What it does NOT do: the store or the broker (the services' own costs), GPUs.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/trainer_ranks.py [--repeats 5]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from rank_timing import parse_args, read_samples, time_setups, torchrun, write_result

RESULT_FILE = Path(__file__).resolve().parent / "results" / "trainer_ranks.json"


def worker(model: str, samples_file: str, repeats: int, micro: int, out: str,
           how: str) -> None:
    import torch

    from mgrpo.config import Settings
    from mgrpo.models.checkpoint import save_checkpoint, version_uri
    from mgrpo.parallel.optimizer_state import save_optimizer_state
    from mgrpo.parallel.ranks import Ranks, world_size
    from mgrpo.services.trainer.ranks import follower_model, trainer_work
    from mgrpo.services.trainer.service import put_state
    from mgrpo.training.config import RunConfig
    from mgrpo.training.rounds import update_model

    torch.set_num_threads(1)
    models = {m: {"path": model, "lr": 2e-4, "micro_batch_size": micro}
              for m in ("planner", "searcher", "coder")}
    cfg = RunConfig.model_validate({"name": "bench", "k": 4, "models": models})
    lm = follower_model(Settings(), cfg, "planner")
    ranks = None
    if world_size() > 1:  # else: the single-process trainer (no DDP, no group)
        ranks = Ranks("cpu", trainer_work())
        ranks.wrap(lm.model, how)
        if ranks.rank > 0:
            ranks.follow(lm)
            return
        ranks.lead(lm)
        ranks.load(lm, 2e-4, None, model)
    else:
        put_state(lm, 2e-4, None, model)
    samples = read_samples(samples_file)
    times = []
    for i in range(repeats + 1):
        started = time.perf_counter()
        update_model(lm, samples, cfg, i)
        times.append(time.perf_counter() - started)
    root = f"{out}.ck"
    started = time.perf_counter()
    if ranks is not None:
        ranks.save(lm, root, 1, {})
        ranks.stop()
    else:
        save_optimizer_state(lm.optimizer, version_uri(root, "planner", 1))
        save_checkpoint(lm.model, root, "planner", 1, tokenizer=lm.tokenizer)
    save_s = time.perf_counter() - started
    Path(out).write_text(json.dumps({"update_s": times, "save_s": save_s}))


def run(ranks: int, how: str, model: Path, samples: Path, repeats: int, micro: int,
        out: Path) -> dict:
    torchrun(ranks, __file__, "--worker", str(model), str(samples), str(repeats), str(micro),
             str(out), how)
    return json.loads(out.read_text())


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        model, samples, repeats, micro, out, how = sys.argv[2:8]
        worker(model, samples, int(repeats), int(micro), out, how)
        return
    names = {"1": (1, "single"), "2-fsdp": (2, "fsdp"), "2-ddp": (2, "ddp")}
    args = parse_args(__doc__, repeats=5, out=RESULT_FILE, setups=tuple(names))
    setups = tuple(names[name] for name in args.setups)
    runs, loads = time_setups(args, setups, 1, lambda setup, model, samples, out: run(
        *setup, model, samples, args.repeats, args.micro_batch_size, Path(f"{out}.json")))
    result: dict = {"samples": args.samples, "length": args.length,
                    "micro_batch_size": args.micro_batch_size, "repeats": args.repeats,
                    "first_update_s": {}, "update_s": {}, "median_update_s": {},
                    "save_s": {}}
    for (ranks, how), [got] in runs.items():
        name = "1" if ranks == 1 else f"2-{how}"
        times = got["update_s"]
        result["first_update_s"][name] = round(times[0], 3)
        result["update_s"][name] = [round(t, 3) for t in times[1:]]
        result["median_update_s"][name] = round(statistics.median(times[1:]), 3)
        result["save_s"][name] = round(got["save_s"], 3)
    median = result["median_update_s"]
    result["speedup_2_over_1"] = {how: round(median["1"] / median[f"2-{how}"], 3)
                                  for how in ("fsdp", "ddp")
                                  if "1" in median and f"2-{how}" in median}
    write_result(result, loads, args.out)


if __name__ == "__main__":
    main()
