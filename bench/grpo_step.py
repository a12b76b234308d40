"""Single-agent GRPO step time: :func:`mgrpo.training.step.grpo_step` (generation + update).

Tiny Qwen2 (``TinyModelConfig()``, ~1M parameters, CPU), P prompts x G completions of
exactly L new tokens (EOS ignored), temperature 1, one optimizer step (one mini-batch,
micro-batch 16), reward = share of even token ids. Two variants, alternated step by step
in one process so the machine's load drifts over both alike:

- ``ours``: the defaults (sort-free sampling, the static KV cache, pi_old from the first
  mini-batch's forward);
- ``before``: the code before issue 15 item 3 (``TorchEngine(sort_free=False,
  static_cache=False)`` and ``UpdateSpec(reuse_first_pass=False)``: a vocabulary sort per
  token, transformers' forward on a ``DynamicCache``, and a separate no-grad pi_old pass).

- ``trl``: TRL's ``GRPOTrainer`` (``bench/trl_step.py``, run by ``--trl-python``, a venv
  of its own with TRL 1.16; same weights, prompts decoded to text, ``min_new_tokens = L``,
  beta 0, one iteration, one thread), stepped on command in the same alternation. Skipped
  when that interpreter does not exist.

Each variant owns a model with the same starting weights. Reported: median and IQR of the
step (and for ours generation and update) times per variant, the ratios of the medians, and
the median/IQR of the paired per-step ratios (step i of one against step i of the other, run
back to back; the order within a step alternates); the load average before and after.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python bench/grpo_step.py [--steps 8] [-G 8] [-P 8] [-L 64]
    make trl-venv   # TRL 1.16 in .venv-trl, on the main venv's torch/transformers (.pth)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch

from mgrpo.engines.torch_engine import TorchEngine
from mgrpo.models import TinyModelConfig, init_tiny, load_model
from mgrpo.training.config import ModelConfig
from mgrpo.training.step import grpo_step


def even_share(prompt_ids, completion) -> float:
    """The benchmark's reward: the share of even token ids in a completion."""
    return sum(t % 2 == 0 for t in completion.completion_ids) / max(
        len(completion.completion_ids), 1)


def summary(values: list[float]) -> dict[str, float]:
    """Median and quartiles, rounded."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": round(q[1], 4), "q1": round(q[0], 4), "q3": round(q[2], 4)}


def bench_prompts(n: int) -> list[list[int]]:
    """``n`` fixed prompts of 8-24 token ids (generator seed 1)."""
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(30, 390, (int(k),), generator=gen).tolist()
            for k in torch.randint(8, 25, (n,), generator=gen)]


def _trl_worker(python: str, folder: Path, steps: int, group: int, prompts: list[list[int]],
                length: int) -> subprocess.Popen | None:
    if not Path(python).exists():
        return None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.Popen(
        [python, str(Path(__file__).parent / "trl_step.py"), str(folder), str(steps + 1),
         str(group), str(len(prompts)), str(length), json.dumps(prompts)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=env)


def _trl_step(proc: subprocess.Popen) -> float:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if line.startswith("STEP "):
            return float(line.split()[1])
    raise RuntimeError(f"the TRL worker ended (exit {proc.wait()}); run bench/trl_step.py "
                       "by hand to see why")


def run(steps: int, group: int, prompts_n: int, length: int, trl_python: str) -> dict:
    torch.manual_seed(0)
    tmp = tempfile.TemporaryDirectory()
    folder = init_tiny(Path(tmp.name) / "m", TinyModelConfig(seed=0))
    variants = {}
    for name, fast in (("ours", True), ("before", False)):
        model, tok = load_model(folder)
        variants[name] = {
            "model": model, "tok": tok, "fast": fast,
            "opt": torch.optim.Adam(model.parameters(), lr=1e-5),
            "engine": TorchEngine(model, tok, stop_at_eos=False, sort_free=fast,
                                  static_cache=fast),
            "times": {"step_s": [], "gen_s": [], "update_s": []}}
    prompts = bench_prompts(prompts_n)
    mcfg = ModelConfig(path="-", micro_batch_size=16)
    trl = _trl_worker(trl_python, folder, steps, group, prompts, length)
    trl_times: list[float] = []
    load_before = os.getloadavg()
    for step in range(steps + 1):  # step 0: warm-up, not recorded
        if trl is not None:
            seconds = _trl_step(trl)
            if step:
                trl_times.append(seconds)
        names = ["ours", "before"] if step % 2 else ["before", "ours"]  # no order bias
        for v in (variants[n] for n in names):
            result = grpo_step(v["model"], v["tok"], v["opt"], prompts, even_share,
                               group_size=group, max_new_tokens=length, seed=step * 1000,
                               model_cfg=mcfg, engine=v["engine"], stop_at_eos=False,
                               reuse_first_pass=v["fast"])
            if step:
                m = result.metrics
                v["times"]["gen_s"].append(m["gen_s"])
                v["times"]["update_s"].append(m["update_s"])
                v["times"]["step_s"].append(m["gen_s"] + m["update_s"])
    out = {name: {key: summary(vals) for key, vals in v["times"].items()}
           for name, v in variants.items()}
    ratio = {key: round(out["ours"][key]["median"] / out["before"][key]["median"], 3)
             for key in ("step_s", "gen_s", "update_s")}
    # paired: step i of ours against step i of before (run back to back): less load drift
    paired = {key: summary([a / b for a, b in zip(variants["ours"]["times"][key],
                                                   variants["before"]["times"][key],
                                                   strict=True)])
              for key in ("step_s", "gen_s", "update_s")}
    trl_note = "not timed: no TRL venv at " + trl_python
    if trl is not None:
        trl.stdin.close()
        trl.wait(timeout=120)
        out["trl"] = {"step_s": summary(trl_times)}
        trl_note = "TRL 1.16 GRPOTrainer, own venv, same alternation"
        ratio["ours_over_trl_step"] = round(out["ours"]["step_s"]["median"]
                                            / out["trl"]["step_s"]["median"], 3)
        ratio["before_over_trl_step"] = round(out["before"]["step_s"]["median"]
                                              / out["trl"]["step_s"]["median"], 3)
        paired["ours_over_trl_step"] = summary(
            [a / b for a, b in zip(variants["ours"]["times"]["step_s"], trl_times,
                                   strict=True)])
    tmp.cleanup()
    return {"model": "tiny qwen2 (TinyModelConfig(), CPU)",
            "parameters": sum(p.numel() for p in variants["ours"]["model"].parameters()),
            "G": group, "P": prompts_n, "L": length, "steps": steps,
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "results": out, "ratio_of_medians": ratio, "paired_ratios": paired,
            "trl": trl_note}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("-G", type=int, default=8)
    parser.add_argument("-P", type=int, default=8)
    parser.add_argument("-L", type=int, default=64)
    parser.add_argument("--trl-python", default=str(Path(__file__).parent.parent / ".venv-trl"
                                                     / "bin" / "python"))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"
                                             / "grpo_step.json"))
    args = parser.parse_args()
    report = run(args.steps, args.G, args.P, args.L, args.trl_python)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
