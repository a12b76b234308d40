"""Top-level workflow commands: train, eval, plot, demo, ablate, compare, up.

Thin: parse options, call ``mgrpo.training``; heavy imports inside the commands.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import typer

from mgrpo.cli.errors import UserError


def _parse_overrides(items: list[str]) -> dict:
    """``--set KEY=VALUE`` options as {dotted key: value}, each value read as YAML."""
    # on use: keeps torch out of the CLI's start
    from mgrpo.training.config_files import parse_set_value

    out = {}
    for item in items:
        if "=" not in item:
            raise typer.BadParameter(f"--set {item!r}: expected key=value, e.g. k=4")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = parse_set_value(value)
        except ValueError as exc:
            raise typer.BadParameter(f"--set {item!r}: {exc}") from None
    return out


def _with_rounds(cfg, rounds: int | None):
    """``--rounds N``: the config's stages cut or stretched to N rounds in all."""
    if rounds is None:
        return cfg
    # on use: keeps torch out of the CLI's start
    from mgrpo.training.config import StageConfig
    from mgrpo.training.config_files import with_rounds

    stages = with_rounds([s.model_dump() for s in cfg.stages], rounds)
    return cfg.model_copy(update={"stages": [StageConfig.model_validate(s) for s in stages]})


def _rounds_for_steps(cfg, steps: int) -> int:
    """``--steps N`` as rounds (``config_yaml.rounds_for_steps``); a refusal in one line."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.training.config_yaml import rounds_for_steps

    per_round = {m: cfg.models[m].mini_batches * cfg.models[m].ppo_epochs
                 for m in cfg.trained_models()}
    try:
        return rounds_for_steps(per_round, steps)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--steps") from None


def set_quiet(quiet: bool) -> None:
    """``--quiet``: through the environment, so every layer (and child process) sees it."""
    if quiet:
        os.environ["MGRPO_QUIET"] = "1"


def prepare_out_dir(out_dir: Path, resume: bool, overwrite: bool) -> None:
    """Refuse to train into a folder that holds anything unless told what to do with it:
    appending silently mixed two runs' metrics, event files and checkpoints. A folder a
    live run owns (its lock file) is refused whatever the options."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.training.run_lock import refuse_if_in_use

    if resume and overwrite:
        raise UserError("--resume and --overwrite contradict each other",
                        "keep the run (--resume) or delete it (--overwrite), not both")
    refuse_if_in_use(out_dir, "--resume" if resume else "--overwrite" if overwrite
                     else "a new run")
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
          set_: list[str] = typer.Option(
              [], "--set", help="Override KEY=VALUE (a YAML value; dotted and indexed keys), "
              "e.g. --set k=4 --set stages.0.rounds=2"),
          rounds: int | None = typer.Option(
              None, "--rounds", min=1, help="Train N rounds in all: the stages in order, the "
              "one N falls in shortened, later ones dropped (more than planned: the last "
              "stage longer). One round = B queries x K rollouts, one update per model."),
          steps: int | None = typer.Option(
              None, "--steps", min=1, help="Train until each trained model has made N "
              "optimizer steps (TRL's max_steps): N / (mini_batches x ppo_epochs) rounds, "
              "as --rounds; N must be a multiple of that."),
          log_every: int = typer.Option(
              1, "--log-every", min=1, help="A log line on stderr every N rounds (and the "
              "last), whatever stderr is (docs/metrics.md, \"Log lines\")."),
          quiet: bool = typer.Option(
              False, "--quiet", "-q", help="No log lines and no progress bars; warnings, "
              "errors and the result (stdout) only."),
          ) -> None:
    """Train a multi-agent system in embedded mode per a YAML run config. A non-empty
    out_dir is refused unless --resume (continue it) or --overwrite (replace it). One log
    line per round on stderr; a progress bar as well on a terminal."""
    # on use: keeps torch, sqlalchemy out of the CLI's start
    from mgrpo.experiments.plots import plot_run
    from mgrpo.progress import log_line
    from mgrpo.training.config_files import load_run_config
    from mgrpo.training.loop import run_training
    from mgrpo.training.numerics import pin

    if steps is not None and rounds is not None:
        raise typer.BadParameter("give the run's length once: --rounds or --steps",
                                 param_hint="--steps")
    set_quiet(quiet)
    cfg = load_run_config(config, _parse_overrides(set_))
    cfg = _with_rounds(cfg, _rounds_for_steps(cfg, steps) if steps is not None else rounds)
    cpu = pin(cfg.cpu_threads, cfg.cpu_kernels)  # before the first tensor operation
    for warning in cfg.precision_warnings():
        log_line(f"warning: {warning}", warning=True)
    prepare_out_dir(Path(cfg.out_dir), resume, overwrite)
    result = run_training(cfg, resume=resume, log_every=log_every)
    plot_run(cfg.out_dir)
    typer.echo(json.dumps({"out_dir": str(result.out_dir), "rounds": result.rounds,
                           "before": result.before, "after": result.after,
                           "wall_s": round(result.wall_s, 1), "cpu": cpu}, indent=2))


def eval_(config: Path = typer.Option(..., "--config", exists=True, dir_okay=False),
          split: str = typer.Option("test", help="train, dev or test"),
          n: int = typer.Option(200, help="Questions (a turn team: tasks of its world) to "
                                "evaluate, the first N of the split."),
          stage: str | None = typer.Option(
              None, help="Hierarchy: 1 or 2, or all to mix stages on purpose (default: the "
              "config's eval_stage; a selection that would mix stages is refused)."),
          greedy: bool = typer.Option(True, help="Greedy (T=0) or sampled decoding."),
          checkpoints: bool = typer.Option(
              False, help="Evaluate the run's latest checkpoints (out_dir/checkpoints), not "
              "the models' starting paths."),
          bench_seed: int | None = typer.Option(
              None, help="Hierarchy: also evaluate on the config's benchmark rebuilt with this "
              "generator seed (new entities, same templates; built once into "
              "BENCH_DIR-seedS)."),
          subagent: str | None = typer.Option(
              None, help="Hierarchy: also play this sub-agent (searcher, coder) alone on the "
              "gold subtasks of the questions: its own r_expert, free of the planner's "
              "errors."),
          episodes: int = typer.Option(
              0, min=0, help="Hierarchy: also show the first N episodes as text on stderr "
              "(each agent's turns, tool calls and results, rewards; stdout stays the JSON); "
              "with --out FILE, also as JSON lines in FILE's name with .episodes.jsonl."),
          out: Path | None = typer.Option(None, help="Write the JSON here too."),
          set_: list[str] = typer.Option([], "--set")) -> None:
    """Evaluate the config's workflow, as JSON with the CPU kernels and threads used (the
    config's cpu_kernels, cpu_threads). A hierarchy: accuracy, format validity, calls and
    r_expert per sub-agent, tokens per answer (with --bench-seed, the same on another seed's
    benchmark beside). A turn team: team accuracy and reward, each role's turn reward and
    malformed actions, turns per episode, on tasks of its world's split."""
    # on use: keeps torch out of the CLI's start
    from mgrpo.training.config_files import load_run_config
    from mgrpo.training.heldout import parse_stage
    from mgrpo.training.numerics import pin
    from mgrpo.training.runners import evaluate_run
    from mgrpo.workflows import EvalRefused, EvalRequest

    cfg = load_run_config(config, _parse_overrides(set_))
    try:
        chosen = parse_stage(stage)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--stage") from None
    request = EvalRequest(split=split, n=n, greedy=greedy, checkpoints=checkpoints,
                          stage=chosen, bench_seed=bench_seed, subagent=subagent,
                          episodes=episodes or None)
    cpu = pin(cfg.cpu_threads, cfg.cpu_kernels)  # before the first tensor operation
    try:
        result = evaluate_run(cfg, request)  # the workflow's runner (mgrpo.training.runners)
    except EvalRefused as exc:
        raise UserError(str(exc), exc.hint) from None
    result["cpu"] = cpu
    shown = result.pop("episodes", [])
    if shown:
        show_episodes(shown, out.with_suffix(".episodes.jsonl") if out else None)
    text = json.dumps(result, indent=2, sort_keys=True)
    if out:
        out.write_text(text)
    typer.echo(text)


def show_episodes(records: list[dict], path: Path | None) -> None:
    """``mgrpo eval --episodes``: the records as text on stderr, and as JSON lines at
    ``path``."""
    # on use: keeps mgrpo.training out of the CLI's start
    from mgrpo.training.episode_text import render_episodes

    typer.echo(render_episodes(records), err=True, nl=False)
    if path is not None:
        path.write_text("".join(json.dumps(r, default=str) + "\n" for r in records))


def plot(run: Path = typer.Argument(..., exists=True, file_okay=False,
                                    help="A run folder (holds metrics.csv)."),
         out: Path | None = typer.Option(None, help="Folder for the PNGs (default RUN/plots).")
         ) -> None:
    """Write reward/accuracy/loss/time curves of a run as PNGs."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.experiments.plots import plot_run

    if not (run / "metrics.csv").exists():
        raise typer.BadParameter(f"{run} has no metrics.csv; is it a run folder?")
    for path in plot_run(run, out):
        typer.echo(str(path))


def demo(out: Path = typer.Option(Path("runs/demo"), help="Output folder."),
         seed: int = typer.Option(0),
         rounds: int = typer.Option(None, help="M-GRPO rounds (default: the demo's)."),
         config: Path | None = typer.Option(None, exists=True, dir_okay=False,
                                            help="YAML overriding DemoConfig fields."),
         set_: list[str] = typer.Option(
             [], "--set", help="Run-config override for the RL rounds, as `mgrpo train "
             "--set`, e.g. --set max_staleness=1 --set loss.rollout_is=token (asynchronous)."),
         log_every: int = typer.Option(1, "--log-every", min=1,
                                       help="A log line on stderr every N RL rounds."),
         quiet: bool = typer.Option(False, "--quiet", "-q",
                                    help="No log lines and no progress bars."),
         ) -> None:
    """The laptop demo: warm start, then M-GRPO co-training, embedded; before/after table.
    Log lines on stderr for each warm-start evaluation, RL round and held-out evaluation."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.experiments.demo import run_demo

    set_quiet(quiet)
    run_demo(demo_config(out, seed, rounds, config, set_), log_every=log_every)


def demo_config(out: Path, seed: int, rounds: int | None, config: Path | None,
                set_: list[str]):
    """`mgrpo demo`'s options as a validated DemoConfig (``--set`` adds to the file's
    ``run_set``)."""
    fields = read_demo_config(config)
    fields.update({"out_dir": str(out), "seed": seed})
    if rounds is not None:
        fields["rounds"] = rounds
    if set_:
        fields["run_set"] = {**fields.get("run_set", {}), **_parse_overrides(set_)}
    return validate_demo_config(config, fields)


def read_demo_config(config: Path | None) -> dict:
    # on use: keeps torch out of the CLI's start
    from mgrpo.training.config_files import read_yaml

    return read_yaml(config) if config else {}


def validate_demo_config(config: Path | None, fields: dict):
    """A DemoConfig of ``fields`` (read from ``config``); a run config is refused as one."""
    # on use: keeps torch out of the CLI's start
    from mgrpo.experiments.config_files import load_demo_config

    return load_demo_config(config, fields)


def ablate(out: Path = typer.Option(Path("runs/ablate"), help="Output folder."),
           seeds: str = typer.Option("0,1,2", help="RL seeds, comma-separated."),
           rounds: int = typer.Option(15, help="RL rounds per run (of the last stage when "
                                      "the demo config is a curriculum)."),
           demo_dir: Path = typer.Option(Path("runs/demo"),
                                         help="Warm start to reuse (built if missing; "
                                         "one built with another recipe is refused)."),
           config: Path | None = typer.Option(
               None, exists=True, dir_okay=False, help="YAML of DemoConfig fields, as for "
               "`mgrpo demo` (examples/demo_full.yaml: the stage-2 curriculum)."),
           results: Path | None = typer.Option(
               None, help="Markdown report (default OUT/results.md)."),
           variants: str = typer.Option(
               "single-agent,main-only,co-training", help="Variants to run, comma-separated. "
               "Finished runs in OUT are reused, so a later call can add the rest."),
           ) -> None:
    """Single-agent GRPO vs main-only vs co-training from the same warm start, N seeds; or,
    with a turn team's ablation config (`kind: turn_team`: its own arms, seeds and out_dir,
    the other options unused), that config's arms."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.experiments.ablate import AblateConfig, run_ablation

    if config is not None and read_demo_config(config).get("kind") == "turn_team":
        # on use: keeps the library out of the CLI's start
        from mgrpo.experiments.team_ablate import load_team_ablate, run_team_ablation

        run_team_ablation(load_team_ablate(config))
        return
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"--seeds {seeds!r}: expected integers like 0,1,2") from None
    demo = validate_demo_config(config, {**read_demo_config(config), "out_dir": str(demo_dir)})
    run_ablation(AblateConfig(out_dir=str(out), seeds=seed_list, rounds=rounds, demo=demo,
                              variants=[v.strip() for v in variants.split(",") if v.strip()],
                              results_md=str(results) if results else None))


def compare(arm: list[str] = typer.Option(..., help="NAME=RUN_DIR,RUN_DIR,... (one per "
                                          "seed); repeat for each arm, the first is the "
                                          "one compared against the others."),
            out: Path | None = typer.Option(None, help="Write the markdown here too."),
            ) -> None:
    """Arms side by side: held-out accuracy after RL, generated tokens per round, and the
    first arm minus each other, paired on the same questions (95% bootstrap)."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.experiments.compare import compare_markdown

    arms = {}
    for item in arm:
        name, sep, dirs = item.partition("=")
        if not sep or not dirs:
            raise typer.BadParameter(f"--arm {item!r}: expected NAME=DIR,DIR")
        arms[name] = [d for d in dirs.split(",") if d]
    if len(arms) < 2:
        raise typer.BadParameter("give at least two --arm")
    markdown = compare_markdown(arms)
    print(markdown, end="")
    if out:
        out.write_text(markdown)


def register(app: typer.Typer) -> None:
    """Attach the workflow commands to the root app."""
    app.command("demo")(demo)
    app.command("train")(train)
    app.command("eval")(eval_)
    app.command("plot")(plot)
    app.command("ablate")(ablate)
    app.command("compare")(compare)
