"""Shared CLI output: one-line errors with a non-zero exit, JSON to stdout, plain aligned columns.

Stdlib only (no typer, no rich; json when a command needs it): the common commands import this on their
fast path.
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
    import json

    sys.stdout.write(json.dumps(data, separators=(",", ":"), default=str))  # dumps: the C encoder
    sys.stdout.write("\n")


def print_json_bytes(data: bytes) -> None:
    """JSON meshd sent, passed through as it came (one line): nothing to decode or encode again."""
    sys.stdout.flush()
    sys.stdout.buffer.write(data.rstrip(b"\n") + b"\n")


def columns(rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns two spaces apart (the last column is not padded); rows[0] is the header."""
    if not rows:
        return []
    widths = [max(map(len, col)) for col in list(zip(*rows))[:-1]]
    fmt = "".join(f"%-{w}s  " for w in widths) + "%s"  # one format per row: thousands of rows in < 1 ms
    return [fmt % tuple(r) for r in rows]
