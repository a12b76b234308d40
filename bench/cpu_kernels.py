"""What the demo's AVX2 kernel pin costs: a GRPO step on AVX2 kernels against the machine's own.

``DemoConfig.cpu_kernels`` (default ``avx2``) pins torch's and MKL's kernels to AVX2 so
machines with other vector units give the same weights (:mod:`mgrpo.training.numerics`).
The kernels are chosen once per process, so each arm is a worker process of its own
(``fix_numerics(1, KERNELS)`` before its first tensor operation): the tiny Qwen2 of the
demo (``TinyModelConfig()``, ~1M parameters), P prompts x G completions of exactly L new
tokens, one optimizer step (:func:`mgrpo.training.step.grpo_step`, as ``bench/grpo_step.py``).
Both workers live at once and are stepped on command, alternately (the order within a step
alternates too), so the machine's load drifts over both alike. Step 0 is a warm-up.

Reported: the kernels each worker really used, median and IQR of generation, update and
step times per arm, the ratio of the medians and the median of the paired per-step ratios
(avx2 / native), the load average before and after.

Usage::

    .venv/bin/python bench/cpu_kernels.py [--steps 10] [-G 8] [-P 8] [-L 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package: its
# grpo_step.py (which imports torch) is imported after the worker's pin

ARMS = ("avx2", "native")


def worker(kernels: str, group: int, prompts_n: int, length: int) -> None:
    """One arm: pin, build the model, then one GRPO step per line on stdin."""
    from mgrpo.training.numerics import describe, fix_numerics

    fix_numerics(1, kernels)
    import torch
    from grpo_step import bench_prompts, even_share

    from mgrpo.engines.torch_engine import TorchEngine
    from mgrpo.models import TinyModelConfig, init_tiny, load_model
    from mgrpo.training.config import ModelConfig
    from mgrpo.training.step import grpo_step

    with tempfile.TemporaryDirectory() as tmp:
        model, tok = load_model(init_tiny(Path(tmp) / "m", TinyModelConfig(seed=0)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    engine = TorchEngine(model, tok, stop_at_eos=False)
    prompts = bench_prompts(prompts_n)

    print("READY " + json.dumps(describe()), flush=True)
    for step, _ in enumerate(sys.stdin):
        m = grpo_step(model, tok, opt, prompts, even_share, group_size=group,
                      max_new_tokens=length, seed=step * 1000,
                      model_cfg=ModelConfig(path="-", micro_batch_size=16), engine=engine,
                      stop_at_eos=False).metrics
        print(f"STEP {m['gen_s']} {m['update_s']}", flush=True)


def _start(kernels: str, group: int, prompts_n: int, length: int) -> tuple:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, __file__, "--worker", kernels, "-G", str(group),
                             "-P", str(prompts_n), "-L", str(length)], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    for line in proc.stdout:
        if line.startswith("READY "):
            return proc, json.loads(line[6:])
    raise RuntimeError(f"the {kernels} worker ended (exit {proc.wait()})")


def _step(proc: subprocess.Popen) -> tuple[float, float]:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if line.startswith("STEP "):
            gen_s, update_s = map(float, line.split()[1:])
            return gen_s, update_s
    raise RuntimeError(f"a worker ended (exit {proc.wait()})")


def run(steps: int, group: int, prompts_n: int, length: int) -> dict:
    from grpo_step import summary

    workers = {arm: _start(arm, group, prompts_n, length) for arm in ARMS}
    times = {arm: {"gen_s": [], "update_s": [], "step_s": []} for arm in ARMS}
    load_before = os.getloadavg()
    for step in range(steps + 1):  # step 0: warm-up, not recorded
        for arm in (ARMS if step % 2 else ARMS[::-1]):
            gen_s, update_s = _step(workers[arm][0])
            if step:
                times[arm]["gen_s"].append(gen_s)
                times[arm]["update_s"].append(update_s)
                times[arm]["step_s"].append(gen_s + update_s)
    for proc, _ in workers.values():
        proc.stdin.close()
        proc.wait(timeout=60)
    keys = ("step_s", "gen_s", "update_s")
    out = {arm: {key: summary(times[arm][key]) for key in keys} for arm in ARMS}
    return {"model": "tiny qwen2 (TinyModelConfig(), CPU)", "G": group, "P": prompts_n,
            "L": length, "steps": steps, "cpu": {arm: w[1] for arm, w in workers.items()},
            "machine": platform.processor() or platform.machine(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "results": out,
            "ratio_of_medians_avx2_over_native": {
                key: round(out["avx2"][key]["median"] / out["native"][key]["median"], 3)
                for key in keys},
            "paired_ratio_avx2_over_native": {
                key: summary([a / b for a, b in zip(times["avx2"][key],
                                                     times["native"][key], strict=True)])
                for key in keys}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("-G", type=int, default=8)
    parser.add_argument("-P", type=int, default=8)
    parser.add_argument("-L", type=int, default=64)
    parser.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"
                                             / "cpu_kernels.json"))
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.G, args.P, args.L)
        return
    report = run(args.steps, args.G, args.P, args.L)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
