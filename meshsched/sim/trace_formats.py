"""Parsers for the job-trace CSV formats: Philly (Pollux artifact), Philly (RFold), and meshsched's own.

Each parser turns the text of one file into `TraceRow`s, checking every field and naming the file, the
1-based line and the column of the first thing wrong (`TraceError`). Nothing here knows about models or
the perf model: that is `trace_synth`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
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


PHILLY_HEADER = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
RFOLD_HEADER = ("job id", "arrival time (sec)", "topology", "shape", "size", "duration (sec)")
REQUIRED_COLUMNS = ("submit_time", "gpus")
OPTIONAL_COLUMNS = (
    "duration", "iterations", "job_id", "name", "user", "tenant", "model", "batch_size", "deadline",
    "guaranteed",
)
_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no")
_EPOCH = datetime(1970, 1, 1)


class TraceFile(NamedTuple):
    """A parsed file: its rows and whether it carries deadlines of its own."""

    rows: list[TraceRow]
    has_deadlines: bool


def parse_trace_text(label: str, text: str, job_prefix: str) -> TraceFile:
    """Pick the format from the header line and parse every row; job ids default to `job_prefix-<n>`."""
    lines = text.split("\n")  # not splitlines(): only \n ends a line, so line numbers match editors'
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if first is None:
        raise TraceError(f"{label}: empty trace (no header line)")
    head = lines[first].strip()
    parser: Callable[[_Rows, str], list[TraceRow]]
    if head.startswith("#"):
        columns = tuple(c.strip() for c in head[1:].split(","))
        if columns != RFOLD_HEADER:
            raise TraceError(f"{label}:{first + 1}: bad header {head!r}, expected '#{','.join(RFOLD_HEADER)}'")
        parser, has_deadlines = _parse_rfold, False
    elif tuple(c.strip() for c in head.split(",")) == PHILLY_HEADER:
        parser, has_deadlines = _parse_philly, False
    else:
        parser, has_deadlines = _own_format_parser(label, first + 1, head)
    rows = parser(_Rows(label, lines, first + 1), job_prefix)
    if not rows:
        raise TraceError(f"{label}: empty trace (a header but no jobs)")
    ids: set[str] = set()
    for row in rows:
        if row.job_id in ids:
            raise TraceError(f"{label}:{row.line}: duplicate job_id {row.job_id!r}")
        ids.add(row.job_id)
    return TraceFile(rows, has_deadlines)


class _Rows:
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


def _parse_philly(rows: _Rows, job_prefix: str) -> list[TraceRow]:
    out: list[TraceRow] = []
    for line, fields in rows:
        rows.width(line, fields, 5)
        stamp, duration, gpus, gpu_time, cluster = fields
        if len(stamp) != 19 or stamp[10] != " ":
            raise rows.fail(line, f"column 'timestamp': {stamp!r} is not YYYY-MM-DD HH:MM:SS")
        try:
            submit = (datetime.fromisoformat(stamp) - _EPOCH).total_seconds()
        except ValueError:
            raise rows.fail(line, f"column 'timestamp': {stamp!r} is not YYYY-MM-DD HH:MM:SS") from None
        rows.number(line, "gpu_time", gpu_time)
        if not cluster.strip():
            raise rows.fail(line, "column 'cluster': empty")
        out.append(TraceRow(
            line, submit, rows.integer(line, "num_gpus", gpus), rows.number(line, "duration", duration), None,
            f"{job_prefix}-{len(out)}", tenant=cluster.strip(),
        ))
    return out


def _parse_rfold(rows: _Rows, job_prefix: str) -> list[TraceRow]:
    out: list[TraceRow] = []
    for line, fields in rows:
        rows.width(line, fields, 6)
        job_id, arrival, _topology, shape, size, duration = fields
        gpus = rows.integer(line, "size", size)
        parts = shape.split("+")
        if not all(p.strip().isdigit() for p in parts) or sum(int(p) for p in parts) != gpus:
            raise rows.fail(line, f"column 'shape': {shape!r} is not a '+'-split of size {gpus}")
        if not job_id.strip():
            raise rows.fail(line, "column 'job id': empty")
        out.append(TraceRow(
            line, rows.number(line, "arrival time (sec)", arrival), gpus,
            rows.number(line, "duration (sec)", duration), None, f"{job_prefix}-{job_id.strip()}",
        ))
    return out


def _own_format_parser(
    label: str, header_line: int, head: str
) -> tuple[Callable[[_Rows, str], list[TraceRow]], bool]:
    """Check the header of meshsched's own format and return a parser bound to its columns."""
    columns = [c.strip() for c in next(csv.reader([head]))]
    where = f"{label}:{header_line}: bad header"
    known = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
    for c in columns:
        if c not in known:
            raise TraceError(f"{where}: unknown column {c!r} (known: {', '.join(known)})")
        if columns.count(c) > 1:
            raise TraceError(f"{where}: column {c!r} appears twice")
    for c in REQUIRED_COLUMNS:
        if c not in columns:
            raise TraceError(f"{where}: required column {c!r} missing")
    if ("duration" in columns) == ("iterations" in columns):
        raise TraceError(f"{where}: give exactly one of the columns 'duration' and 'iterations'")
    if "iterations" in columns and not {"model", "batch_size"} <= set(columns):
        raise TraceError(f"{where}: the 'iterations' form needs the columns 'model' and 'batch_size'")
    index = {c: i for i, c in enumerate(columns)}
    nonempty = REQUIRED_COLUMNS + (("duration",) if "duration" in index else ("iterations", "model", "batch_size"))

    def parse(rows: _Rows, job_prefix: str) -> list[TraceRow]:
        out: list[TraceRow] = []
        for line, fields in rows:
            rows.width(line, fields, len(columns))
            cell = {c: fields[i].strip() for c, i in index.items()}
            for c in nonempty:
                if not cell[c]:
                    raise rows.fail(line, f"column {c!r}: empty")
            flag = cell.get("guaranteed", "").lower()
            if flag not in _TRUE + _FALSE + ("",):
                raise rows.fail(line, f"column 'guaranteed': {flag!r} is not one of 1/0/true/false/yes/no")
            has = cell.get
            out.append(TraceRow(
                line,
                rows.number(line, "submit_time", cell["submit_time"]),
                rows.integer(line, "gpus", cell["gpus"]),
                rows.number(line, "duration", cell["duration"]) if has("duration") else None,
                rows.integer(line, "iterations", cell["iterations"]) if has("iterations") else None,
                has("job_id") or f"{job_prefix}-{len(out)}",
                name=has("name") or "",
                user=has("user") or "nobody",
                tenant=has("tenant") or "default",
                model=has("model") or None,
                batch_size=rows.integer(line, "batch_size", cell["batch_size"]) if has("batch_size") else None,
                deadline=_positive(rows, line, "deadline", cell["deadline"]) if has("deadline") else None,
                guaranteed=flag in _TRUE,
            ))
        return out

    return parse, "deadline" in index


def _positive(rows: _Rows, line: int, column: str, text: str) -> float:
    value = rows.number(line, column, text)
    if value <= 0:
        raise rows.fail(line, f"column {column!r}: must be > 0, got {text!r}")
    return value
