"""Shared CLI output: one-line errors with a non-zero exit, JSON to stdout (aligned columns: meshsched.wire.jobtable).

Stdlib only (no typer, no rich; JSON through cli/jsonc.py when a command needs it): the common commands import this
on their fast path.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # `typing` costs the fast path ~2 ms; type checkers still read the import below
if TYPE_CHECKING:
    from typing import NoReturn


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `mesh: error: message` on stderr and exit with `code` (never a traceback)."""
    sys.stderr.write(f"mesh: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(code)


def print_json(data: object) -> None:
    """Compact JSON on one line (for scripts: pipe through `jq` to read it)."""
    from meshsched.cli.jsonc import dumps  # json's C encoder without `import json` (its re: ~5 ms)

    sys.stdout.write(dumps(data, separators=(",", ":"), default=str))
    sys.stdout.write("\n")


def print_json_bytes(data: bytes) -> None:
    """JSON meshd sent, passed through as it came (one line): nothing to decode or encode again."""
    sys.stdout.flush()
    sys.stdout.buffer.write(data.rstrip(b"\n") + b"\n")
