"""`mgrpo data ...`: build the benchmark, write expert demonstrations, show counts.

Thin: parsing and printing only; the work is in ``mgrpo.envs``.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mgrpo.cli.errors import UserError

app = typer.Typer(no_args_is_help=True)


def _read_config(path: Path | None) -> dict:
    if path is None:
        return {}
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return yaml.safe_load(text) or {}
    return json.loads(text)


@app.command()
def build(seed: int = typer.Option(0, help="generator seed; same seed, same bytes"),
          out: Path = typer.Option(..., help="folder to write the benchmark to"),
          config: Path | None = typer.Option(None, help="YAML/JSON BenchmarkConfig fields "
                                             "(n_train, n_dev, n_test, entities, ...)")) -> None:
    """Generate the knowledge graph, corpus and train/dev/test questions."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.envs import BenchmarkConfig, build_benchmark

    cfg = BenchmarkConfig(**{**_read_config(config), "seed": seed})
    bench = build_benchmark(cfg)
    bench.save(out)
    typer.echo(f"wrote {len(bench.all_questions)} questions and {len(bench.corpus)} documents "
               f"to {out}")


@app.command("import")
def import_(questions: Path = typer.Option(..., help="JSONL (or parquet) of question, answer "
                                           "and optionally id, split, stage, kind, subtasks"),
            out: Path = typer.Option(..., help="new folder to write the benchmark to"),
            docs: Path | None = typer.Option(None, help="folder of .txt/.md documents"),
            corpus: Path | None = typer.Option(None, help="JSONL of {id, title, text} "
                                               "documents (instead of --docs)"),
            seed: int = typer.Option(0, help="seeds the split of rows without one"),
            dev: float = typer.Option(0.1, help="share of rows without a split put in dev"),
            test: float = typer.Option(0.1, help="share of rows without a split put in test"),
            ) -> None:
    """Turn your questions and documents into a benchmark folder (bench_dir, --bench)."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.envs.importing import DataImportError, import_benchmark, write_benchmark_atomic

    try:
        bench, ignored = import_benchmark(questions, docs, corpus, seed=seed, dev=dev,
                                          test=test)
    except DataImportError as exc:
        for line in exc.lines:
            typer.echo(line, err=True)
        raise UserError(exc.summary, "fix the rows listed above (numbers count from 1)") \
            from None
    write_benchmark_atomic(bench, out)
    splits = {s: len(bench.questions(s)) for s in sorted({q.split for q in bench.all_questions})}
    typer.echo(f"wrote {len(bench.all_questions)} questions "
               f"({', '.join(f'{s} {n}' for s, n in splits.items())}) and {len(bench.corpus)} "
               f"documents to {out}")
    if ignored:
        typer.echo(f"ignored columns: {', '.join(ignored)}")


def _executor(sandbox_url: str | None):
    if sandbox_url:
        # on use: keeps httpx out of the CLI's start
        from mgrpo.sandbox.client import SandboxClient

        return SandboxClient(sandbox_url)
    # on use: keeps the library out of the CLI's start
    from mgrpo.sandbox.local import LocalSandbox

    return LocalSandbox()


INSTEAD_OF_DEMOS = ("write SFT transcripts for your task (format: docs/protocol.md, 'SFT "
                    "transcripts'; e.g. from a stronger model's correct answers) and run `mgrpo "
                    "sft` on them, or skip the warm start and train from an instruct model "
                    "(docs/extending.md)")


@app.command()
def demos(bench: Path = typer.Option(..., help="benchmark folder (mgrpo data build)"),
          out: Path = typer.Option(..., help="folder for {agent}.jsonl and summary.json"),
          error_rate: str = typer.Option("", help="e.g. planner.skip_delegation=0.5,"
                                         "searcher.bad_query=0.1 (unset types: 0)"),
          n: int | None = typer.Option(None, help="episodes (default: the whole split)"),
          split: str = typer.Option("train"),
          stage: int | None = typer.Option(None, help="1 or 2 (default: both)"),
          seed: int = typer.Option(0, help="seeds question order and error draws"),
          sandbox_url: str | None = typer.Option(None, envvar="MGRPO_SANDBOX_URL",
                                                 help="sandbox service; unset: in-process"),
          min_accuracy: float = typer.Option(
              0.5, min=0.0, max=1.0, help="refuse (write nothing) when the experts answer "
              "fewer of the questions without injected errors correctly; 0: never refuse"),
          chat_model: Path | None = typer.Option(
              None, "--chat-model", help="a model folder: write each record in its chat "
              "template with native tool calls (protocol.format: chat_template) instead of "
              "the markup"),
          roles: str = typer.Option("searcher,coder", help="--chat-model: the planner's "
                                    "sub-agents, as the run config's agents list them"),
          tool_call_format: str = typer.Option("hermes", help="--chat-model: how calls are "
                                               "written (hermes, json_list)"),
          chat_template: str | None = typer.Option(
              None, help="--chat-model: a built-in template (chatml_tools) or Jinja file "
              "replacing the model's, as protocol.chat_template(_path)"),
          ) -> None:
    """Run the scripted experts and write SFT transcripts per agent (built-in tasks only:
    on a benchmark the experts cannot solve it refuses and says what to do instead)."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.envs import load_benchmark
    from mgrpo.envs.demos import ExpertsCannotSolve, write_demos
    from mgrpo.envs.experts import ExpertErrors
    from mgrpo.tools import build_tool

    try:
        errors = ExpertErrors.parse(error_rate)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--error-rate") from None
    benchmark = load_benchmark(bench)
    if not len(benchmark.corpus):
        raise UserError(f"{bench} has no documents: the scripted experts answer by searching "
                        "them, so they cannot solve it", INSTEAD_OF_DEMOS)
    tools = {"searcher": build_tool("search", corpus=benchmark.corpus),
             "coder": build_tool("python", executor=_executor(sandbox_url))}
    chat = None
    if chat_model is not None:
        # on use: tokenizers load only for chat-template demos
        from mgrpo.envs.protocol import DEFAULT_AGENTS, AgentCard
        from mgrpo.envs.turn_formats import build_turn_format
        from mgrpo.models.chat_templates import resolve_chat_template
        from mgrpo.models.loading import load_tokenizer

        known = {c.name: c for c in DEFAULT_AGENTS}
        cards = [known.get(r.strip(), AgentCard(r.strip(), r.strip()))
                 for r in roles.split(",") if r.strip()]
        try:
            fmt = build_turn_format("chat_template", load_tokenizer(chat_model),
                                    tool_call_format,
                                    resolve_chat_template(chat_template) if chat_template
                                    else None)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--chat-model") from None
        chat = (fmt, cards)
    try:
        summary = write_demos(benchmark, out, tools, errors, n=n, split=split, stage=stage,
                              seed=seed, progress=True, min_accuracy=min_accuracy or None,
                              chat=chat)
    except ExpertsCannotSolve as exc:
        raise UserError(str(exc), INSTEAD_OF_DEMOS) from None
    typer.echo(f"{summary['episodes']} episodes, expert accuracy {summary['accuracy']:.3f}, "
               f"records {summary['records']} -> {out}")
    for key, stat in summary["errors"].items():
        if stat["count"]:
            typer.echo(f"  {key}: {stat['count']}/{stat['chances']}")


@app.command()
def transcripts(teacher: str = typer.Option(..., help="a local HF model folder, the http(s) "
                                            "URL of an OpenAI-compatible server (vllm serve), "
                                            "or a 'module:factory' engine"),
                config: Path = typer.Option(..., exists=True, dir_okay=False,
                                            help="run config: roles, tools, verifier, sampling"),
                out: Path = typer.Option(..., help="folder for {agent}.jsonl and summary.json"),
                bench: Path | None = typer.Option(None, help="benchmark folder (default: the "
                                                  "config's bench_dir)"),
                tokenizer: Path | None = typer.Option(
                    None, help="tokenizer folder of a server or factory teacher (default: "
                    "the planner model's path)"),
                split: str = typer.Option("train"),
                n: int | None = typer.Option(None, help="questions (default: the whole split)"),
                samples: int = typer.Option(4, min=1, help="rollouts per question"),
                min_score: float = typer.Option(1.0, help="keep episodes the verifier scores "
                                                "at least this"),
                seed: int = typer.Option(0)) -> None:
    """SFT transcripts by rejection sampling: a teacher plays every role, the episodes your
    verifier scores correct are kept (format: docs/protocol.md)."""
    # on use: keeps torch out of the CLI's start
    from mgrpo.config import Settings
    from mgrpo.engines.registry import build_engine
    from mgrpo.envs import load_benchmark
    from mgrpo.experiments.transcripts import write_transcripts
    from mgrpo.training.config_files import load_run_config
    from mgrpo.workflows import refuse_embedded_only

    cfg = load_run_config(config)
    refuse_embedded_only(cfg, "mgrpo data transcripts")
    device = Settings().device
    if Path(teacher).is_dir():
        _, tok, engine = build_engine("torch", teacher, device)
    else:
        path = str(tokenizer or cfg.models[cfg.agents["planner"]].path)
        _, tok, engine = build_engine(teacher, path, device)
    summary = write_transcripts(cfg, load_benchmark(bench or cfg.bench_dir), engine, tok, out,
                                split=split, n=n, samples=samples, seed=seed,
                                min_score=min_score, progress=True)
    typer.echo(f"kept {summary['kept']} of {summary['played']} episodes "
               f"({summary['questions_solved']} of {summary['questions']} questions), "
               f"records {summary['records']} -> {out}")


@app.command()
def show(folder: Path = typer.Argument(..., help="benchmark folder")) -> None:
    """Question counts per split / stage / kind, and the corpus size."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.envs import load_benchmark

    bench = load_benchmark(folder)
    typer.echo(f"{'split':<6} {'stage':>5} {'kind':<8} {'n':>6}")
    for key, count in bench.counts().items():
        split, stage, kind = key.split("/")
        typer.echo(f"{split:<6} {stage:>5} {kind:<8} {count:>6}")
    typer.echo(f"documents: {len(bench.corpus)}")
