"""Top-level workflow commands: train, eval, plot, demo, ablate, up.

Thin: parse options, call ``mgrpo.training``; heavy imports inside the commands.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import typer


def _parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise typer.BadParameter(f"--set {item!r}: expected key=value, e.g. k=4")
        key, value = item.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def prepare_out_dir(out_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to train into a folder that holds anything unless told what to do with it:
    appending silently mixed two runs' metrics, event files and checkpoints."""
    from mgrpo.cli.errors import UserError

    if resume and overwrite:
        raise UserError("--resume and --overwrite contradict each other",
                        "keep the run (--resume) or delete it (--overwrite), not both")
    if resume or not out_dir.exists() or not any(out_dir.iterdir()):
        return
    if not overwrite:
        raise UserError(f"out_dir {out_dir} is not empty (a previous run?)",
                        "continue it with --resume, replace it with --overwrite, or pick "
                        "another folder with --set out_dir=...")
    resolved = out_dir.resolve()
    if resolved in (Path.cwd().resolve(), *Path.cwd().resolve().parents, Path.home()):
        raise UserError(f"--overwrite refuses to delete {resolved} (the current folder, one "
                        "of its parents, or home)", "set out_dir to a folder of its own")
    shutil.rmtree(resolved)


def train(config: Path = typer.Option(..., "--config", exists=True, dir_okay=False,
                                      help="YAML run config (docs/configuration.md)."),
          resume: bool = typer.Option(False, help="Continue from the last complete round."),
          overwrite: bool = typer.Option(False, help="Delete a non-empty out_dir first."),
          set_: list[str] = typer.Option([], "--set", help="Override, e.g. --set k=4"),
          ) -> None:
    """Train a multi-agent system in embedded mode per a YAML run config. A non-empty
    out_dir is refused unless --resume (continue it) or --overwrite (replace it)."""
    from mgrpo.training.config import load_run_config
    from mgrpo.training.loop import run_training
    from mgrpo.training.plots import plot_run

    cfg = load_run_config(config, _parse_overrides(set_))
    prepare_out_dir(Path(cfg.out_dir), resume, overwrite)
    result = run_training(cfg, resume=resume)
    plot_run(cfg.out_dir)
    typer.echo(json.dumps({"out_dir": str(result.out_dir), "rounds": result.rounds,
                           "before": result.before, "after": result.after,
                           "wall_s": round(result.wall_s, 1)}, indent=2))


def eval_(config: Path = typer.Option(..., "--config", exists=True, dir_okay=False),
          split: str = typer.Option("test", help="train, dev or test"),
          n: int = typer.Option(200, help="Questions to evaluate."),
          greedy: bool = typer.Option(True, help="Greedy (T=0) or sampled decoding."),
          out: Path | None = typer.Option(None, help="Write the JSON here too."),
          set_: list[str] = typer.Option([], "--set")) -> None:
    """Evaluate: accuracy, format validity, calls per sub-agent, tokens per answer (JSON)."""
    from mgrpo.training.config import load_run_config
    from mgrpo.training.evaluate import evaluate
    from mgrpo.training.system import build_system

    cfg = load_run_config(config, _parse_overrides(set_))
    system = build_system(cfg)
    questions = system.bench.questions(split)[:n]
    if not questions:
        raise typer.BadParameter(f"split {split!r} has no questions in {cfg.bench_dir}")
    from mgrpo.progress import progress_bar

    with progress_bar(desc="eval", total=len(questions)) as bar:
        result = evaluate(system, questions, greedy=greedy, progress=bar.update)
    text = json.dumps(result, indent=2, sort_keys=True)
    if out:
        out.write_text(text)
    typer.echo(text)


def plot(run: Path = typer.Argument(..., exists=True, file_okay=False,
                                    help="A run folder (holds metrics.csv)."),
         out: Path | None = typer.Option(None, help="Folder for the PNGs (default RUN/plots).")
         ) -> None:
    """Write reward/accuracy/loss/time curves of a run as PNGs."""
    from mgrpo.training.plots import plot_run

    if not (run / "metrics.csv").exists():
        raise typer.BadParameter(f"{run} has no metrics.csv; is it a run folder?")
    for path in plot_run(run, out):
        typer.echo(str(path))


def demo(out: Path = typer.Option(Path("runs/demo"), help="Output folder."),
         seed: int = typer.Option(0),
         rounds: int = typer.Option(None, help="M-GRPO rounds (default: the demo's)."),
         config: Path | None = typer.Option(None, exists=True, dir_okay=False,
                                            help="YAML overriding DemoConfig fields."),
         ) -> None:
    """The laptop demo: warm start, then M-GRPO co-training, embedded; before/after table."""
    import yaml

    from mgrpo.training.demo import DemoConfig, run_demo

    fields = yaml.safe_load(config.read_text()) if config else {}
    fields.update({"out_dir": str(out), "seed": seed})
    if rounds is not None:
        fields["rounds"] = rounds
    run_demo(DemoConfig.model_validate(fields))


def ablate(out: Path = typer.Option(Path("runs/ablate"), help="Output folder."),
           seeds: str = typer.Option("0,1,2", help="RL seeds, comma-separated."),
           rounds: int = typer.Option(15, help="RL rounds per run."),
           demo_dir: Path = typer.Option(Path("runs/demo"),
                                         help="Warm start to reuse (built if missing)."),
           results: Path | None = typer.Option(
               None, help="Markdown report (default OUT/results.md)."),
           ) -> None:
    """Single-agent GRPO vs main-only vs co-training from the same warm start, N seeds."""
    from mgrpo.training.ablate import AblateConfig, run_ablation
    from mgrpo.training.demo import DemoConfig

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"--seeds {seeds!r}: expected integers like 0,1,2") from None
    run_ablation(AblateConfig(out_dir=str(out), seeds=seed_list, rounds=rounds,
                              demo=DemoConfig(out_dir=str(demo_dir)),
                              results_md=str(results) if results else None))


def register(app: typer.Typer) -> None:
    """Attach the workflow commands to the root app."""
    app.command("demo")(demo)
    app.command("train")(train)
    app.command("eval")(eval_)
    app.command("plot")(plot)
    app.command("ablate")(ablate)
