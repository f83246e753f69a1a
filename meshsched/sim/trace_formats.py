"""Parsers for the job-trace CSV formats: Philly (Pollux artifact), Philly (RFold), meshsched's own, and (through
`trace_public`) the public Alibaba PAI v2020/v2023, Helios and Pollux/Sia layouts; `TRACE_FORMATS` names them.

Each parser turns the text of one file into `TraceRow`s, checking every field and naming the file, the
1-based line and the column of the first thing wrong (`TraceError`). Nothing here knows about models or
the perf model: that is `trace_synth`.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from datetime import datetime
from typing import NamedTuple

from meshsched.sim.trace_public import PUBLIC_FORMATS, detect_public, public_parser
from meshsched.sim.trace_rows import Rows, TraceError, TraceRow

__all__ = ["PUBLIC_FORMATS", "TRACE_FORMATS", "TraceError", "TraceFile", "TraceRow", "parse_trace_text"]


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
# --trace-format: "auto" picks the format from the header line; "sia" is the Pollux layout (Sia ships the same)
TRACE_FORMATS = ("auto", "meshsched", "philly", "philly-rfold", *PUBLIC_FORMATS, "sia")
_ALIASES = {"sia": "pollux"}


class TraceFile(NamedTuple):
    """A parsed file: its rows and whether it carries deadlines of its own."""

    rows: list[TraceRow]
    has_deadlines: bool


def parse_trace_text(label: str, text: str, job_prefix: str, fmt: str = "auto") -> TraceFile:
    """Parse every row in format `fmt` (`TRACE_FORMATS`; "auto": picked from the header line); job ids default to
    `job_prefix-<n>`."""
    if fmt not in TRACE_FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; known: {', '.join(TRACE_FORMATS)}")
    lines = text.split("\n")  # not splitlines(): only \n ends a line, so line numbers match editors'
    first = next((i for i, ln in enumerate(lines) if ln.strip()), None)
    if first is None:
        raise TraceError(f"{label}: empty trace (no header line)")
    head = lines[first].strip()
    parser, has_deadlines, start = _pick_parser(label, first + 1, head, _ALIASES.get(fmt, fmt))
    rows = parser(Rows(label, lines, start), job_prefix)
    if not rows:
        raise TraceError(f"{label}: empty trace (a header but no jobs)")
    ids: set[str] = set()
    for row in rows:
        if row.job_id in ids:
            raise TraceError(f"{label}:{row.line}: duplicate job_id {row.job_id!r}")
        ids.add(row.job_id)
    return TraceFile(rows, has_deadlines)


def _pick_parser(
    label: str, header_line: int, head: str, fmt: str
) -> tuple[Callable[[Rows, str], list[TraceRow]], bool, int]:
    """(parser, whether the file carries deadlines, index of the first line the parser reads)."""
    columns = tuple(c.strip() for c in next(csv.reader([head.removeprefix("#")])))
    if fmt in PUBLIC_FORMATS or (fmt == "auto" and detect_public(columns)):
        public = PUBLIC_FORMATS[fmt] if fmt in PUBLIC_FORMATS else detect_public(columns)
        assert public is not None
        if public.headerless and columns != public.columns and not set(columns) & set(public.columns):
            return public_parser(label, public, header_line, None), False, header_line - 1  # no header line
        return public_parser(label, public, header_line, columns), False, header_line
    if head.startswith("#") and fmt in ("auto", "philly-rfold"):
        if columns != RFOLD_HEADER:
            raise TraceError(f"{label}:{header_line}: bad header {head!r}, expected '#{','.join(RFOLD_HEADER)}'")
        return _parse_rfold, False, header_line
    if columns == PHILLY_HEADER and fmt in ("auto", "philly"):
        return _parse_philly, False, header_line
    if fmt in ("philly", "philly-rfold"):
        expected = ",".join(PHILLY_HEADER) if fmt == "philly" else "#" + ",".join(RFOLD_HEADER)
        raise TraceError(f"{label}:{header_line}: bad header {head!r} for --trace-format {fmt}, expected {expected!r}")
    parser, has_deadlines = _own_format_parser(label, header_line, head)
    return parser, has_deadlines, header_line


def _parse_philly(rows: Rows, job_prefix: str) -> list[TraceRow]:
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


def _parse_rfold(rows: Rows, job_prefix: str) -> list[TraceRow]:
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
) -> tuple[Callable[[Rows, str], list[TraceRow]], bool]:
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

    def parse(rows: Rows, job_prefix: str) -> list[TraceRow]:
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


def _positive(rows: Rows, line: int, column: str, text: str) -> float:
    value = rows.number(line, column, text)
    if value <= 0:
        raise rows.fail(line, f"column {column!r}: must be > 0, got {text!r}")
    return value
