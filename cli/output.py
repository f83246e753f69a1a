"""Shared CLI output: one-line errors with a non-zero exit, and JSON to stdout."""

from __future__ import annotations

import json
import sys
from typing import NoReturn

import typer


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `mesh: error: message` on stderr and exit with `code` (never a traceback)."""
    typer.echo(f"mesh: error: {message}", err=True)
    raise typer.Exit(code)


def print_json(data: object) -> None:
    """Compact JSON on one line (for scripts: pipe through `jq` to read it)."""
    sys.stdout.write(json.dumps(data, separators=(",", ":"), default=str))  # dumps: the C encoder
    sys.stdout.write("\n")
