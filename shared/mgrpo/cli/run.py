"""Top-level workflow commands: sft, train, eval, ablate, plot, demo, up."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach the workflow commands to the root app."""
