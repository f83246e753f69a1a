"""The pieces every trace parser shares: `TraceRow` (one job as a file gives it), `TraceError` (one line, with
the file and the 1-based line) and `Rows` (a file's data rows with checked number and integer fields)."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from typing import NamedTuple


class TraceError(Exception):
    """A trace could not be loaded; the message is one line ("<file>:<line>: <what is wrong>" for a row)."""


class TraceRow(NamedTuple):
    """One job as the trace file gives it; times in seconds on the file's own clock."""

    line: int
    submit: float
    gpus: int
    duration: float | None  # None: the row gives `iterations` instead
    iterations: int | None
    job_id: str
    name: str = ""
    user: str = "nobody"
    tenant: str = "default"
    model: str | None = None
    batch_size: int | None = None  # global batch
    deadline: float | None = None  # seconds after submit
    guaranteed: bool = False


class Rows:
    """The data rows after the header, each with its 1-based line number; blank lines skipped."""

    def __init__(self, label: str, lines: list[str], start: int) -> None:
        self.label = label
        self._lines = lines
        self._start = start

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        reader = csv.reader(self._lines[self._start:])
        for fields in reader:
            if fields and (len(fields) > 1 or fields[0].strip()):
                yield self._start + reader.line_num, fields

    def fail(self, line: int, what: str) -> TraceError:
        return TraceError(f"{self.label}:{line}: {what}")

    def number(self, line: int, column: str, text: str, minimum: float = 0.0) -> float:
        try:
            value = float(text)
        except ValueError:
            raise self.fail(line, f"column {column!r}: {text!r} is not a number") from None
        if not math.isfinite(value) or value < minimum:
            raise self.fail(line, f"column {column!r}: must be a finite number >= {minimum:g}, got {text!r}")
        return value

    def integer(self, line: int, column: str, text: str, minimum: int = 1) -> int:
        try:
            value = int(text)
        except ValueError:
            raise self.fail(line, f"column {column!r}: {text!r} is not an integer") from None
        if value < minimum:
            raise self.fail(line, f"column {column!r}: must be >= {minimum}, got {value}")
        return value

    def width(self, line: int, fields: Sequence[str], expected: int) -> None:
        if len(fields) != expected:
            raise self.fail(line, f"expected {expected} fields, got {len(fields)}")
