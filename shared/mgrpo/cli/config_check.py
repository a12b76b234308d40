"""`mgrpo config check FILE`: validate a config file without running it.

Thin: :func:`mgrpo.experiments.config_files.check_file` does the work.
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("check")
def check(files: list[Path] = typer.Argument(..., exists=True, dir_okay=False,
                                              help="YAML config files.")) -> None:
    """Validate each file as the kind of config it is (a run config for `mgrpo train`, or a
    demo config for `mgrpo demo`/`ablate`), and check that every file or folder it names
    (model paths, bench_dir, prompts) exists. Exit 1 if any file has a problem."""
    # on use: keeps torch out of the CLI's start
    from mgrpo.experiments.config_files import COMMANDS, check_file

    failed = False
    for path in files:
        kind, problems = check_file(path)
        use = COMMANDS[kind].replace("FILE", str(path))
        if problems:
            failed = True
            typer.secho(f"{path}: {len(problems)} problem{'s' if len(problems) > 1 else ''} "
                        f"in this {kind} config (for {use}):", err=True, fg="red")
            for problem in problems:
                typer.echo(f"  {problem}", err=True)
        else:
            typer.echo(f"{path}: ok, a {kind} config for {use}")
    if failed:
        raise typer.Exit(1)
