"""`mgrpo ablate`: the paper's comparison at small scale (SPEC 1.6).

Three variants from the same expert demonstrations and warm-start recipe, several RL seeds
each: **single-agent GRPO** (one model plays planner and tools, warm-started on the inline
form of the same demonstrations), **main-only** (M-GRPO, sub-agents frozen) and
**co-training** (M-GRPO, every model trained). Writes ``{out_dir}/results.md`` (markdown in
the style of ``docs/results.md``, which it never touches) with the mean and a 95% t-interval
per variant, and a PNG of the mean training accuracy curves.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

from pydantic import Field

from mgrpo.training.demo import DemoConfig, prepare, run_config, tokenizer_texts, warm_start
from mgrpo.validation import StrictModel

VARIANTS = ("single-agent", "main-only", "co-training")
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262}  # two-sided 95% Student t quantiles by degrees of freedom


class AblateConfig(StrictModel):
    out_dir: str = "runs/ablate"
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2])
    rounds: int = 15
    demo: DemoConfig = Field(default_factory=DemoConfig)
    results_md: str | None = Field(
        None, description="Markdown report; default {out_dir}/results.md (never the docs: "
        "copy it into docs/results.md by hand once the run is worth keeping).")

    def results_path(self) -> Path:
        return Path(self.results_md) if self.results_md else Path(self.out_dir) / "results.md"


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of the two-sided 95% Student-t interval."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    half = T_975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, half


def _prepare_single_agent(cfg: AblateConfig, t0: float) -> str:
    """Warm-start one model on the inline (single-context) form of the same demonstrations,
    with the same recipe as the multi-agent models (``demo.warm_start``); its SFT steps are
    the planner's and the searcher's together, since it learns both roles."""
    from mgrpo.envs import load_benchmark
    from mgrpo.envs.experts import ExpertErrors
    from mgrpo.training.inline import write_inline_demos
    from mgrpo.training.system import build_tools

    demo = cfg.demo
    out = Path(demo.out_dir)
    data = out / "demos-inline" / "planner.jsonl"
    bench = load_benchmark(out / "bench")
    if not data.exists():
        errors = ExpertErrors(planner=demo.planner_errors, searcher=demo.searcher_errors,
                              coder=demo.coder_errors)
        tools = build_tools(bench, ["searcher", "coder"], tool_cfg=demo.tools)
        write_inline_demos(bench, out / "demos-inline", tools, errors,
                           n=demo.demos_per_agent, stage=demo.stage, seed=demo.seed)
    steps = demo.sft_steps.get("planner", 1000) + demo.sft_steps.get("searcher", 1000)
    return warm_start(demo, "single", data, steps, tokenizer_texts(bench, [data]), t0)


def variant_config(cfg: AblateConfig, variant: str, seed: int, paths: dict[str, str]) -> dict:
    base = run_config(cfg.demo, {r: p for r, p in paths.items() if r != "single"})
    base.update(name=f"{variant}-s{seed}", seed=seed,
                out_dir=str(Path(cfg.out_dir) / variant / f"seed{seed}"),
                stages=[{"stage": cfg.demo.stage, "rounds": cfg.rounds}])
    if variant == "single-agent":
        base.update(algorithm="grpo", agents={"planner": "single", "searcher": "single",
                                               "coder": "single"},
                    models={"single": {"path": paths["single"], "lr": cfg.demo.lr}})
    elif variant == "main-only":
        for role in ("searcher", "coder"):
            base["models"][role]["trainable"] = False
    return base


def run_ablation(cfg: AblateConfig) -> dict:
    from mgrpo.training.config import RunConfig
    from mgrpo.training.loop import run_training

    t0 = time.perf_counter()
    paths = prepare(cfg.demo, t0)
    paths["single"] = _prepare_single_agent(cfg, t0)
    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for variant in VARIANTS:
        for seed in cfg.seeds:
            run_cfg = RunConfig.model_validate(variant_config(cfg, variant, seed, paths))
            result = run_training(run_cfg)
            results[variant].append({"seed": seed, "before": result.before,
                                     "after": result.after, "out_dir": run_cfg.out_dir})
            print(f"[ablate {time.perf_counter() - t0:6.1f}s] {variant} seed {seed}: "
                  f"greedy {result.after.get('eval/greedy/accuracy', float('nan')):.3f}",
                  flush=True)
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    Path(cfg.out_dir, "ablation.json").write_text(json.dumps(results, indent=2))
    curves = plot_curves(cfg, results)
    markdown = results_markdown(cfg, results, curves, time.perf_counter() - t0)
    cfg.results_path().parent.mkdir(parents=True, exist_ok=True)
    cfg.results_path().write_text(markdown)
    return results


def plot_curves(cfg: AblateConfig, results: dict[str, list[dict]]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mgrpo.training.metrics import read_metrics

    fig, ax = plt.subplots(figsize=(7, 4))
    for variant, runs in results.items():
        curves = [dict(read_metrics(Path(r["out_dir"])).get("planner/accuracy", []))
                  for r in runs]
        rounds = sorted(set().union(*curves)) if curves else []
        means = [statistics.fmean(c[x] for c in curves if x in c) for x in rounds]
        ax.plot(rounds, means, label=variant)
    ax.set_xlabel("round")
    ax.set_ylabel("training accuracy (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    path = Path(cfg.out_dir) / "ablation_curves.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def results_markdown(cfg: AblateConfig, results: dict[str, list[dict]], curves: Path,
                     wall_s: float) -> str:
    lines = ["# Results: the paper's ablation at small scale", "",
             f"Command: `mgrpo ablate --seeds {','.join(map(str, cfg.seeds))} "
             f"--rounds {cfg.rounds}` ({wall_s / 60:.1f} min on this machine). "
             f"Held-out: {cfg.demo.eval_questions} test questions of stage {cfg.demo.stage}; "
             "95% Student-t intervals over seeds.", "",
             "| variant | greedy before | greedy after | sampled before | sampled after |",
             "| --- | ---: | ---: | ---: | ---: |"]
    summary = {}
    for variant, runs in results.items():
        cells = []
        for when in ("before", "after"):
            for mode in ("greedy", "sampled"):
                vals = [r[when].get(f"eval/{mode}/accuracy", float("nan")) for r in runs]
                summary[(variant, when, mode)] = mean_ci(vals)
        for mode in ("greedy", "sampled"):
            for when in ("before", "after"):
                m, h = summary[(variant, when, mode)]
                cells.append(f"{m:.3f} ± {h:.3f}")
        lines.append(f"| {variant} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    order = sorted(VARIANTS, key=lambda v: -summary[(v, "after", "greedy")][0])
    lines += ["", f"Curves: `{curves}`.", "",
              "Paper's claimed ordering: co-training > main-only > single-agent.",
              f"Measured ordering (greedy accuracy after RL): {' > '.join(order)}."]
    return "\n".join(lines) + "\n"
