"""`mgrpo serve <service>`: start one service of the distributed system in this process.

Each command is a thin shell: it reads settings and hands over to ``services/<name>/main.py``.
"""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)
