"""`mgrpo worlds ...`: the registered turn-based worlds (built-in and from ``MGRPO_PLUGINS``)
and their scripted experts.

``list`` prints one line per world: its name, its roles in turn order and its team-turn
limit (built with its default options; a world that cannot be built so says why).
``expert`` plays the scripted expert on a split and prints its solve rate (one JSON line);
worlds with a tool run its code in the in-process sandbox.
"""

from __future__ import annotations

import json

import typer

app = typer.Typer(no_args_is_help=True)


@app.command("list")
def list_worlds() -> None:
    """Print each world: name, roles (in turn order), max team turns."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.envs.worlds import build_world, world_names

    for name in world_names():
        try:
            world = build_world(name)
        except Exception as exc:  # a user's world may need options: list it anyway
            typer.echo(f"{name:<14} (needs options to build: {exc})")
            continue
        typer.echo(f"{name:<14} roles: {', '.join(world.roles):<22} max_turns: "
                   f"{world.max_turns}")


@app.command("expert")
def expert(name: str = typer.Argument(..., help="A world name (see `mgrpo worlds list`)."),
           split: str = typer.Option("test", "--split", help="train, dev or test."),
           n: int = typer.Option(200, "--n", min=1, help="Tasks to play."),
           seed: int = typer.Option(0, "--seed", help="The tasks' seed.")) -> None:
    """Play the scripted expert on N tasks of a split; print its solve rate as JSON."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.envs.worlds import build_world
    from mgrpo.envs.worlds.play import expert_report

    typer.echo(json.dumps(expert_report(build_world(name), split, n, seed)))


@app.command("demos")
def demos(name: str = typer.Argument(..., help="A world name (see `mgrpo worlds list`)."),
          out: str = typer.Option(..., "--out", help="JSONL file to write (mgrpo sft --data)."),
          split: str = typer.Option("train", "--split", help="train, dev or test."),
          n: int = typer.Option(200, "--n", min=1, help="Tasks to play."),
          seed: int = typer.Option(0, "--seed", help="The tasks' seed."),
          options: str = typer.Option("{}", "--options", help="The world's options as a "
                                      "JSON object (a run config's workflow.world_options), "
                                      "e.g. '{\"grid_input\": true}'.")) -> None:
    """Write the scripted expert's turns on N tasks (the solved episodes) as SFT examples,
    one per turn: {agent: role, segments: [observation, action]}."""
    # on use: keeps the library out of the CLI's start
    from mgrpo.envs.worlds import build_world
    from mgrpo.envs.worlds.demos import expert_demos, write_demos

    world_options = json.loads(options)
    if not isinstance(world_options, dict):
        raise typer.BadParameter(f"--options {options!r} is not a JSON object")
    examples = expert_demos(build_world(name, **world_options), split, n, seed)
    path = write_demos(examples, out)
    roles: dict[str, int] = {}
    for example in examples:
        roles[example["agent"]] = roles.get(example["agent"], 0) + 1
    typer.echo(json.dumps({"out": str(path), "examples": len(examples), "per_role": roles}))
