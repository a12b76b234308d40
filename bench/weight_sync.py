"""Weight sync: how long a trainer's new weights take to reach a sampler, the old path and the
new one side by side in one run, at the tiny size and at a ~100M-parameter Qwen2 shape.

Per size, a trainer model (random weights, built locally from a config: nothing downloaded)
and a separate sampler model with its own :class:`~mgrpo.engines.torch_engine.TorchEngine`.
Each repeat moves the trainer's weights, writes version ``v`` (``save_checkpoint``, the
trainer's side of the distributed path: timed as ``save_s``) and syncs the sampler by each
path, alternated, every path then checked: the sampler's logprobs of a fixed sequence must
equal the trainer's (``max_abs_logprob_diff``, 0 expected).

- ``checkpoint_sha256`` (old distributed path, and the old embedded one for a sampler that is
  not the trained module): ``read_checkpoint_dir`` (every file of the version read and
  sha256-checked, the weights deserialised into new tensors) + ``load_state_dict``;
- ``checkpoint_crc32`` (new distributed path, ``TorchEngine.load_weights(uri)``:
  ``mgrpo.models.weights_read``): the weights file read once into one buffer, crc32-checked,
  tensors as views of it, copied in place;
- ``in_process`` (new embedded path, ``run_state.sync_sampler``): the trainer's tensors
  copied in place into the sampler (``load_state_dict``), no file.

Reported per path: best and median wall seconds and the CPU seconds of this process (less
moved by other jobs on a shared machine), and the 1-minute load average before and after.
A worker's sync in the services also waits for the checkpoint's announcement (a store row
and a bus message, milliseconds): not timed here.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/weight_sync.py [--sizes tiny 100m] [--repeats 3]
    .venv/bin/python bench/weight_sync.py --smoke    # tiny, one repeat (the test's)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

RESULT_FILE = Path(__file__).resolve().parent / "results" / "weight_sync.json"
SHAPES = {  # Qwen2 configs; "100m": ~100M parameters, "qwen2-0.5b": Qwen/Qwen2-0.5B's shape
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
    "100m": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                 num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4),
    "qwen2-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                       num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2),
}
PATHS = ("checkpoint_sha256", "checkpoint_crc32", "in_process")


def build(shape: str) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**SHAPES[shape], tie_word_embeddings=True, max_position_embeddings=512,
                         attn_implementation="sdpa")
    return Qwen2ForCausalLM(config).eval()


def sync(path: str, engine, trainer, uri: str, version: int) -> None:
    from mgrpo.models.checkpoint import read_checkpoint_dir

    if path == "checkpoint_sha256":  # TorchEngine.load_weights(uri) before weights_read
        state, _ = read_checkpoint_dir(uri)
        engine.model.load_state_dict(state, strict=False)
        engine.version = version
    elif path == "checkpoint_crc32":
        engine.load_weights(uri, version)
    else:
        engine.load_weights(trainer.state_dict(), version)


def logprob_diff(engine, trainer, ids: torch.Tensor) -> float:
    from mgrpo.models.logprobs import token_logprobs

    with torch.no_grad():
        return float((token_logprobs(engine.model, ids) - token_logprobs(trainer, ids))
                     .abs().max())


def one_size(shape: str, repeats: int, root: Path) -> dict:
    from mgrpo.engines.torch_engine import TorchEngine
    from mgrpo.models.checkpoint import save_checkpoint

    torch.manual_seed(0)
    trainer, sampler = build(shape), build(shape)
    engine = TorchEngine(sampler, SimpleNamespace(pad_token_id=0, eos_token_id=None),
                         device="cpu")  # sync and logprobs only: no text
    params = sum(p.numel() for p in trainer.parameters())
    ids = torch.randint(0, SHAPES[shape]["vocab_size"], (1, 32))
    times = {p: [] for p in PATHS}
    cpu = {p: [] for p in PATHS}
    diffs = {p: [] for p in PATHS}
    saves, load = [], [os.getloadavg()[0]]
    for version in range(1, repeats + 1):
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(torch.randn_like(p), alpha=1e-3)
        start = time.perf_counter()
        uri = save_checkpoint(trainer, str(root / shape), "planner", version)
        saves.append(time.perf_counter() - start)
        order = PATHS if version % 2 else tuple(reversed(PATHS))
        for path in order:
            with torch.no_grad():  # a different state before every path
                for p in sampler.parameters():
                    p.zero_()
            cpu0, start = time.process_time(), time.perf_counter()
            sync(path, engine, trainer, uri, version)
            times[path].append(time.perf_counter() - start)
            cpu[path].append(time.process_time() - cpu0)
            diffs[path].append(logprob_diff(engine, trainer, ids))
        load.append(os.getloadavg()[0])
    file_mb = Path(uri, "model.safetensors").stat().st_size / 1e6
    rows = {path: {"best_s": round(min(times[path]), 4),
                   "median_s": round(statistics.median(times[path]), 4),
                   "cpu_s_median": round(statistics.median(cpu[path]), 4),
                   "max_abs_logprob_diff": max(diffs[path])} for path in PATHS}
    old = rows["checkpoint_sha256"]["median_s"]
    return {"shape": shape, "parameters": params, "weights_file_mb": round(file_mb, 1),
            "repeats": repeats, "save_s_median": round(statistics.median(saves), 3),
            "paths": rows,
            "speedup_crc32_vs_sha256": round(old / rows["checkpoint_crc32"]["median_s"], 2),
            "speedup_in_process_vs_sha256": round(old / rows["in_process"]["median_s"], 2),
            "load_avg_1m": [round(x, 2) for x in load]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["tiny", "100m"], choices=sorted(SHAPES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULT_FILE)
    parser.add_argument("--smoke", action="store_true", help="tiny, one repeat")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.repeats = ["tiny"], 1
    with tempfile.TemporaryDirectory(prefix="mgrpo-weight-sync-") as tmp:
        sizes = [one_size(shape, args.repeats, Path(tmp)) for shape in args.sizes]
    for row in sizes:
        bad = {p: r["max_abs_logprob_diff"] for p, r in row["paths"].items()
               if r["max_abs_logprob_diff"] != 0.0}
        if bad:
            raise SystemExit(f"{row['shape']}: a sync left the sampler's logprobs off the "
                             f"trainer's: {bad}")
    result = {"sizes": sizes, "torch_threads": torch.get_num_threads(),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "cpus": os.cpu_count(),
              "machine": platform.processor() or platform.machine(),
              "python": sys.version.split()[0], "torch": torch.__version__,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
