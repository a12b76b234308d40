"""Memory of three LoRA agents on one base: one shared copy of the base vs one copy each.

Each case runs in a fresh subprocess that builds a run config whose three models (planner,
searcher, coder) load the same ``--model`` folder, each with a LoRA adapter (r 8 on q/k/v/o),
and calls :func:`mgrpo.training.system.load_models` (the embedded mode's load) with
``share_base: true`` or ``false``. It records the process's peak RSS
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``) before the load (interpreter, torch,
transformers, peft imported), after it and after one forward pass of each model (which reads
every weight: transformers maps a safetensors file whose dtype is the load's, so weights
not read yet are not resident), ``/proc/self/smaps_rollup``'s Rss, Pss and Anonymous then,
the bytes of the distinct tensor storages the three models hold (parameters and buffers),
and the load's wall time. ``--tiny`` loads a
tiny Qwen2 made on the spot (the smoke test's size).

Writes JSON (``--out``, default ``bench/results/shared_base_memory.json``) with the 1-minute
load average before and after. Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/shared_base_memory.py \\
        [--model runs/models/smollm2-135m-instruct] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_FILE = ROOT / "bench" / "results" / "shared_base_memory.json"
ROLES = ("planner", "searcher", "coder")
LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def child(model: str, share: bool) -> dict:
    """Load the three LoRA agents in this process; what it cost."""
    import resource

    import peft  # noqa: F401  (imported before the first figure: not part of the load)
    import torch

    from mgrpo.models.shared_base import unique_storage_bytes
    from mgrpo.training.config import RunConfig
    from mgrpo.training.system import load_models

    with tempfile.TemporaryDirectory() as out:
        cfg = RunConfig.model_validate({
            "name": "bench", "bench_dir": out, "out_dir": out,
            "models": {m: {"path": model, "lora": LORA, "share_base": share} for m in ROLES}})
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        models = load_models(cfg)
        load_s = time.perf_counter() - start
        rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        nets = [models[m].model for m in ROLES]
        with torch.no_grad():  # a forward of each touches every weight, as a round's does
            for net in nets:
                net(input_ids=torch.tensor([[1, 2, 3, 4]]))
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    storages, held = unique_storage_bytes(nets)
    trainable = sum(p.numel() * p.element_size() for net in nets for p in net.parameters()
                    if p.requires_grad)
    return {"share_base": share, "peak_rss_before_load_mb": round(rss_before / 1024, 1),
            "peak_rss_after_load_mb": round(rss_loaded / 1024, 1),
            "peak_rss_mb": round(rss_after / 1024, 1),
            "load_peak_rss_mb": round((rss_after - rss_before) / 1024, 1),
            "smaps_rollup_kb": _smaps(),
            "tensor_storages": storages, "tensor_bytes_mb": round(held / 1e6, 1),
            "adapter_bytes_mb": round(trainable / 1e6, 2), "load_s": round(load_s, 2),
            "torch": torch.__version__}


def _smaps() -> dict:
    """Rss, Pss (shared pages divided among their mappers) and Anonymous of this process now
    (/proc/self/smaps_rollup; {} where there is none): weights mapped from a safetensors file
    are file pages, so Rss can count one page once per mapping while Pss does not."""
    try:
        lines = Path("/proc/self/smaps_rollup").read_text().splitlines()
    except OSError:
        return {}
    fields = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        if key in ("Rss", "Pss", "Anonymous"):
            fields[key] = int(value.split()[0])
    return fields


def run_case(model: str, share: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "shared"), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.run([sys.executable, __file__, "--child", "--model", model,
                           "--share", "1" if share else "0"],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"child (share_base={share}) failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "runs" / "models" /
                                               "smollm2-135m-instruct"))
    parser.add_argument("--tiny", action="store_true", help="a tiny Qwen2 made on the spot")
    parser.add_argument("--out", default=str(RESULT_FILE))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--share", default="1", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.share == "1")))
        return
    model = args.model
    if args.tiny:
        from mgrpo.models import TinyModelConfig, init_tiny

        model = str(init_tiny(Path(tempfile.mkdtemp()) / "tiny", TinyModelConfig(seed=0)))
    if not Path(model, "config.json").is_file():
        raise SystemExit(f"--model {model!r} is not a Hugging Face model folder")
    load_before = os.getloadavg()
    cases = [run_case(model, share) for share in (False, True)]
    untied, tied = cases
    result = {
        "what": "3 LoRA agents (planner, searcher, coder) on one base, load_models",
        "model": model, "lora": LORA, "cases": cases,
        "saved_peak_rss_mb": round(untied["peak_rss_mb"] - tied["peak_rss_mb"], 1),
        "saved_tensor_mb": round(untied["tensor_bytes_mb"] - tied["tensor_bytes_mb"], 1),
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
