"""`mgrpo ablate`: the paper's comparison at small scale (docs/results.md, 'The paper's ablation
with power').

Three variants from the same expert demonstrations and warm-start recipe, several RL seeds
each: **single-agent GRPO** (one model plays planner and tools, warm-started on the inline
form of the same demonstrations), **main-only** (M-GRPO, sub-agents frozen) and
**co-training** (M-GRPO, every model trained). Writes ``{out_dir}/results.md`` (markdown in
the style of ``docs/results.md``, which it never touches) with the mean and a 95% t-interval
per variant, a paired comparison of each pair of variants on the same held-out questions
(difference and 95% paired bootstrap interval, ``mgrpo.algo.paired``), and a PNG of the mean
training accuracy curves.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import time
from pathlib import Path

from pydantic import Field, field_validator

from mgrpo.envs import load_benchmark
from mgrpo.envs.experts import ExpertErrors
from mgrpo.experiments.demo import DemoConfig, prepare, run_config, tokenizer_texts, warm_start
from mgrpo.training.inline import write_inline_demos
from mgrpo.training.metrics import read_metrics
from mgrpo.validation import StrictModel

VARIANTS = ("single-agent", "main-only", "co-training")
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262}  # two-sided 95% Student t quantiles by degrees of freedom


class AblateConfig(StrictModel):
    out_dir: str = "runs/ablate"
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2])
    variants: list[str] = Field(
        default_factory=lambda: list(VARIANTS),
        description="Which of single-agent, main-only, co-training to run (single-agent's "
        "own warm start is built only when it is among them).")
    rounds: int = 15
    demo: DemoConfig = Field(default_factory=DemoConfig)
    results_md: str | None = Field(
        None, description="Markdown report; default {out_dir}/results.md (never the docs: "
        "copy it into docs/results.md by hand once the run is worth keeping).")

    @field_validator("variants")
    @classmethod
    def _known_variants(cls, value: list[str]) -> list[str]:
        unknown = [v for v in value if v not in VARIANTS]
        if unknown or not value:
            raise ValueError(f"variants {value}: choose among {list(VARIANTS)}")
        return [v for v in VARIANTS if v in value]  # the table's order

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
    the sum of the roles' it plays: planner and searcher, plus the coder's when the schedule
    reaches stage 2 (the multi-agent variants' total SFT steps)."""
    # on use: keeps torch out of this module's import
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
    steps = sum(demo.sft_steps.get(role, 1000) for role in single_agent_roles(demo))
    return warm_start(demo, "single", data, steps, tokenizer_texts(bench, [data]), t0)


def single_agent_roles(demo: DemoConfig) -> tuple[str, ...]:
    """The roles the single model plays: the coder only when a stage reaches its tasks."""
    coder = any(s.get("stage") != 1 for s in demo.schedule())
    return ("planner", "searcher", "coder") if coder else ("planner", "searcher")


def schedule(cfg: AblateConfig) -> list[dict]:
    """The demo's RL schedule with ``cfg.rounds`` rounds in its last stage (the evaluated
    one): the quick demo's one stage, or demo-full's stage 1 then stage 2."""
    stages = [dict(s) for s in cfg.demo.schedule()]
    stages[-1]["rounds"] = cfg.rounds
    return stages


def variant_config(cfg: AblateConfig, variant: str, seed: int, paths: dict[str, str]) -> dict:
    base = run_config(cfg.demo, {r: p for r, p in paths.items() if r != "single"})
    base.update(name=f"{variant}-s{seed}", seed=seed,
                out_dir=str(Path(cfg.out_dir) / variant / f"seed{seed}"),
                stages=schedule(cfg))
    if variant == "single-agent":
        base.update(algorithm="grpo", agents={"planner": "single", "searcher": "single",
                                               "coder": "single"},
                    models={"single": {"path": paths["single"], "lr": cfg.demo.lr}})
    elif variant == "main-only":
        for role in ("searcher", "coder"):
            base["models"][role]["trainable"] = False
    return base


def run_ablation(cfg: AblateConfig) -> dict:
    # on use: keeps torch, sqlalchemy out of this module's import
    from mgrpo.training.config import RunConfig
    from mgrpo.training.loop import run_training

    t0 = time.perf_counter()
    paths = prepare(cfg.demo, t0)
    if "single-agent" in cfg.variants:
        paths["single"] = _prepare_single_agent(cfg, t0)
    results: dict[str, list[dict]] = {v: [] for v in cfg.variants}
    for seed in cfg.seeds:  # seed-major: a run cut short leaves every variant's first seeds
        for variant in cfg.variants:
            run_cfg = RunConfig.model_validate(variant_config(cfg, variant, seed, paths))
            done = finished_run(Path(run_cfg.out_dir), sum(s.rounds for s in run_cfg.stages))
            if done is None:
                if Path(run_cfg.out_dir).exists():  # cut short: start it again
                    shutil.rmtree(run_cfg.out_dir)
                result = run_training(run_cfg)
                done = {"before": result.before, "after": result.after}
            else:
                done["reused"] = True
            results[variant].append({"seed": seed, **done, "out_dir": run_cfg.out_dir})
            print(f"[ablate {time.perf_counter() - t0:6.1f}s] {variant} seed {seed}: "
                  f"greedy {done['after'].get('eval/greedy/accuracy', float('nan')):.3f}",
                  flush=True)
    Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
    Path(cfg.out_dir, "ablation.json").write_text(json.dumps(results, indent=2))
    curves = plot_curves(cfg, results)
    markdown = results_markdown(cfg, results, curves, time.perf_counter() - t0)
    cfg.results_path().parent.mkdir(parents=True, exist_ok=True)
    cfg.results_path().write_text(markdown)
    return results


def finished_run(out_dir: Path, rounds: int) -> dict | None:
    """{"before", "after"} held-out metrics of a run that completed ``rounds`` rounds and
    its final evaluation (read back from its metrics.csv), else None: ``mgrpo ablate``
    run again skips the runs it has finished."""
    state, after = out_dir / "state.json", out_dir / "eval_after_questions.json"
    if not state.exists() or not after.exists() or \
            json.loads(state.read_text()).get("completed_rounds") != rounds:
        return None
    series = read_metrics(out_dir)
    at = {when: {k: dict(v)[step] for k, v in series.items()
                 if k.startswith("eval/") and step in dict(v)}
          for when, step in (("before", 0), ("after", rounds))}
    return at if at["after"] else None


CURVES = (("planner/accuracy", "training accuracy"),
          ("searcher/reward_mean", "searcher reward (its calls)"),
          ("searcher/calls_per_episode", "searcher calls per episode"))


def plot_curves(cfg: AblateConfig, results: dict[str, list[dict]]) -> Path:
    """One panel per agent metric of ``CURVES``: each variant's mean over seeds per round
    (a variant without the metric, e.g. single-agent's searcher reward, is left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(5 * len(CURVES), 4))
    series = {v: [read_metrics(Path(r["out_dir"])) for r in runs] for v, runs in results.items()}
    for ax, (key, label) in zip(axes, CURVES, strict=True):
        for color, (variant, runs) in enumerate(series.items()):
            curves = [dict(m[key]) for m in runs if key in m]
            if not curves:
                continue
            rounds = sorted(set().union(*curves))
            means = [statistics.fmean(c[x] for c in curves if x in c) for x in rounds]
            ax.plot(rounds, means, label=variant, color=f"C{color}")  # same colour per panel
        ax.set_xlabel("round")
        ax.set_ylabel(f"{label}, mean over seeds")
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
             f"--rounds {cfg.rounds} --variants {','.join(results)}` ({wall_s / 60:.1f} min "
             f"on this machine{_reused_note(results)}). "
             f"Held-out: {cfg.demo.eval_questions} test questions of stage "
             f"{cfg.demo.held_out_stage()}; RL schedule {schedule(cfg)}; "
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
    order = sorted(results, key=lambda v: -summary[(v, "after", "greedy")][0])
    lines += ["", *paired_markdown(results)]
    lines += ["", f"Curves: `{curves}`.", "",
              "Paper's claimed ordering: co-training > main-only > single-agent.",
              f"Measured ordering (greedy accuracy after RL): {' > '.join(order)}."]
    return "\n".join(lines) + "\n"


def _reused_note(results: dict[str, list[dict]]) -> str:
    reused = sum(bool(r.get("reused")) for runs in results.values() for r in runs)
    return f"; {reused} finished runs reused from an earlier invocation" if reused else ""


PAIRS = (("co-training", "main-only"), ("co-training", "single-agent"),
         ("main-only", "single-agent"))


def question_scores(runs: list[dict], mode: str) -> dict[str, list[float]] | None:
    """{question id: [score of each run]} after RL, from each run's
    ``eval_after_questions.json``; None when a run has none (an older run folder)."""
    per_run = []
    for run in runs:
        path = Path(run["out_dir"]) / "eval_after_questions.json"
        if not path.exists():
            return None
        per_run.append(json.loads(path.read_text())[mode])
    common = sorted(set.intersection(*(set(r) for r in per_run))) if per_run else []
    return {q: [r[q] for r in per_run] for q in common}


def paired_markdown(results: dict[str, list[dict]], seed: int = 0,
                    pairs: tuple[tuple[str, str], ...] = PAIRS) -> list[str]:
    """Lines of the paired comparison table: for each pair of variants and decoding mode,
    the difference of held-out accuracy after RL on the same questions and its 95% paired
    bootstrap interval (questions paired, seeds resampled per variant)."""
    # on use: keeps torch, numpy out of this module's import
    from mgrpo.algo.paired import paired_bootstrap

    lines = ["Paired comparison after RL (same held-out questions; 95% bootstrap interval "
             "resampling questions, paired, and each variant's seeds):", "",
             "| comparison | mode | difference | 95% interval | excludes 0 |",
             "| --- | --- | ---: | ---: | --- |"]
    for a, b in pairs:
        if a not in results or b not in results:
            continue
        for mode in ("greedy", "sampled"):
            sa, sb = question_scores(results[a], mode), question_scores(results[b], mode)
            if sa is None or sb is None:
                lines.append(f"| {a} - {b} | {mode} | n/a | no per-question results | |")
                continue
            common = sorted(set(sa) & set(sb))
            res = paired_bootstrap(  # runs x questions
                [[sa[q][r] for q in common] for r in range(len(results[a]))],
                [[sb[q][r] for q in common] for r in range(len(results[b]))], seed=seed)
            lines.append(f"| {a} - {b} | {mode} | {res.diff:+.3f} | "
                         f"[{res.low:+.3f}, {res.high:+.3f}] | "
                         f"{'yes' if res.significant else 'no'} |")
    return lines
