"""Adapters for public GPU-cluster traces: Alibaba PAI v2020 and v2023, SenseTime Helios, Pollux/Sia workloads.

Each adapter reads one file in the layout its source publishes (the source's own column names, docs/
trace-format.md "Public traces") and gives `TraceRow`s: submit time, GPUs, duration, id, user. The rule for
what is skipped is one for all four: a job is replayed when it held GPUs for a known time, whatever its end
state (completed, failed, cancelled: the cluster had to schedule it); rows without GPUs (CPU-only) and rows
without a run interval (never started, or no end) are skipped. A bad cell is one line naming the file, the
1-based line and the column (`TraceError`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import NamedTuple

from meshsched.sim.trace_rows import Rows, TraceError, TraceRow

_EPOCH = datetime(1970, 1, 1)


class PublicFormat(NamedTuple):
    """A public trace layout: its columns as the source spells them (in its order) and its parser."""

    name: str
    columns: tuple[str, ...]
    parse: Callable[[Rows, Mapping[str, int], str], list[TraceRow]]
    headerless: bool = False  # the source ships its files without a header line (the columns above, in order)


class _Cells:
    """One data row's cells by column name, trimmed, with the row's line for messages."""

    def __init__(self, rows: Rows, index: Mapping[str, int], line: int, fields: Sequence[str]) -> None:
        rows.width(line, fields, len(index))
        self.rows, self.line = rows, line
        self._cells = {c: fields[i].strip() for c, i in index.items()}

    def text(self, column: str, required: bool = True) -> str:
        value = self._cells[column]
        if required and not value:
            raise self.rows.fail(self.line, f"column {column!r}: empty")
        return value

    def number(self, column: str) -> float:
        return self.rows.number(self.line, column, self.text(column))

    def whole(self, column: str) -> int:
        """A count that the source may write as a float (`2.0`)."""
        value = self.number(column)
        if not value.is_integer():
            raise self.rows.fail(self.line, f"column {column!r}: {self.text(column)!r} is not a whole number")
        return int(value)

    def stamp(self, column: str) -> float:
        text = self.text(column)
        try:
            if len(text) != 19 or text[10] != " ":
                raise ValueError
            return (datetime.fromisoformat(text) - _EPOCH).total_seconds()
        except ValueError:
            raise self.rows.fail(self.line, f"column {column!r}: {text!r} is not YYYY-MM-DD HH:MM:SS") from None

    def one_of(self, column: str, allowed: Sequence[str]) -> str:
        value = self.text(column)
        if value not in allowed:
            raise self.rows.fail(self.line, f"column {column!r}: {value!r} is not one of {', '.join(allowed)}")
        return value


# ------------------------------------------------------------------------------------------------ Helios

HELIOS_COLUMNS = (
    "job_id", "user", "vc", "gpu_num", "cpu_num", "node_num", "state", "submit_time", "start_time", "end_time",
    "duration", "queue",
)  # fmt: skip
HELIOS_STATES = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "SUSPENDED")


def _parse_helios(rows: Rows, index: Mapping[str, int], prefix: str) -> list[TraceRow]:
    out: list[TraceRow] = []
    for line, fields in rows:
        c = _Cells(rows, index, line, fields)
        gpus = c.whole("gpu_num")
        state = c.one_of("state", HELIOS_STATES)
        if gpus < 0:
            raise rows.fail(line, f"column 'gpu_num': must be >= 0, got {gpus}")
        ran = c.text("start_time", required=False) and c.text("duration", required=False)
        if gpus == 0 or state == "SUSPENDED" or not ran:
            continue  # a CPU job; the one SUSPENDED job (Helios ignores it); a job that never ran
        out.append(TraceRow(
            line, c.stamp("submit_time"), gpus, c.number("duration"), None, f"{prefix}-{c.text('job_id')}",
            user=c.text("user", required=False) or "nobody", tenant=c.text("vc", required=False) or "default",
        ))
    return out


# ------------------------------------------------------------------------------------------------ Alibaba v2023

POD_COLUMNS = (
    "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase", "creation_time",
    "deletion_time", "scheduled_time",
)  # fmt: skip
POD_PHASES = ("Succeeded", "Running", "Failed", "Pending")


def _parse_pods(rows: Rows, index: Mapping[str, int], prefix: str) -> list[TraceRow]:
    out: list[TraceRow] = []
    for line, fields in rows:
        c = _Cells(rows, index, line, fields)
        gpus = c.whole("num_gpu")
        phase = c.one_of("pod_phase", POD_PHASES)
        submit = c.number("creation_time")
        if gpus == 0 or phase == "Pending" or not c.text("scheduled_time", required=False):
            continue  # a CPU-only pod; a pod never scheduled
        start, end = c.number("scheduled_time"), c.number("deletion_time")
        if end < start:
            raise rows.fail(line, f"column 'deletion_time': {end:g} is before scheduled_time {start:g}")
        out.append(TraceRow(
            line, submit, gpus, end - start, None, f"{prefix}-{c.text('name')}", name=c.text("name"),
            tenant=c.text("qos", required=False) or "default",
        ))
    return out


# ------------------------------------------------------------------------------------------------ Alibaba v2020

TASK_COLUMNS = (
    "job_name", "task_name", "inst_num", "status", "start_time", "end_time", "plan_cpu", "plan_mem", "plan_gpu",
    "gpu_type",
)  # fmt: skip
JOB_TABLE_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")


def _parse_tasks(rows: Rows, index: Mapping[str, int], prefix: str) -> list[TraceRow]:
    """One job per `job_name`: its GPU tasks' earliest start, latest end and GPUs (inst_num x ceil(plan_gpu/100))."""
    jobs: dict[str, list[float]] = {}  # job_name -> [first line, start, end, gpus]
    for line, fields in rows:
        c = _Cells(rows, index, line, fields)
        plan = c.text("plan_gpu", required=False)
        share = c.rows.number(line, "plan_gpu", plan) if plan else 0.0
        if share == 0 or not c.text("start_time", required=False) or not c.text("end_time", required=False):
            continue  # a CPU task (parameter server, evaluator); a task that never ran or has no end
        inst = c.whole("inst_num")
        start, end = c.number("start_time"), c.number("end_time")
        if end < start:
            raise rows.fail(line, f"column 'end_time': {end:g} is before start_time {start:g}")
        job = jobs.setdefault(c.text("job_name"), [line, start, end, 0])
        job[1], job[2] = min(job[1], start), max(job[2], end)
        job[3] += inst * math.ceil(share / 100.0)
    return [
        TraceRow(int(line), start, int(gpus), end - start, None, f"{prefix}-{name}", name=name)
        for name, (line, start, end, gpus) in jobs.items() if gpus > 0
    ]


# ------------------------------------------------------------------------------------------------ Pollux / Sia

POLLUX_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
# The workloads give no durations: Pollux and Sia run each job until its model converges. meshsched gives each
# application GPU-hours by the size class Pollux's evaluation puts it in (Small 0-1, Medium 1-10, Large 10-100,
# XLarge 100-1000 GPU-hours; our reading, docs/trace-format.md), spread over its num_replicas GPUs.
POLLUX_GPU_HOURS = {
    "cifar10": 0.5, "ncf": 0.5, "bert": 0.5, "deepspeech2": 5.0, "yolov3": 50.0, "imagenet": 500.0,
}  # fmt: skip


def _parse_pollux(rows: Rows, index: Mapping[str, int], prefix: str) -> list[TraceRow]:
    out: list[TraceRow] = []
    for line, fields in rows:
        c = _Cells(rows, index, line, fields)
        app = c.one_of("application", tuple(POLLUX_GPU_HOURS))
        gpus = c.whole("num_replicas")
        if gpus < 1:
            raise rows.fail(line, f"column 'num_replicas': must be >= 1, got {gpus}")
        c.whole("batch_size")  # checked, not used: the global batch need not divide by the GPUs here
        out.append(TraceRow(
            line, c.number("time"), gpus, POLLUX_GPU_HOURS[app] * 3600.0 / gpus, None,
            f"{prefix}-{c.text('name')}", name=app,
        ))
    return out


PUBLIC_FORMATS: dict[str, PublicFormat] = {
    "alibaba-v2020": PublicFormat("alibaba-v2020", TASK_COLUMNS, _parse_tasks, headerless=True),
    "alibaba-v2023": PublicFormat("alibaba-v2023", POD_COLUMNS, _parse_pods),
    "helios": PublicFormat("helios", HELIOS_COLUMNS, _parse_helios),
    "pollux": PublicFormat("pollux", POLLUX_COLUMNS, _parse_pollux),
}


def detect_public(columns: tuple[str, ...]) -> PublicFormat | None:
    """The public format whose header is exactly `columns`, if any (pai_job_table's: v2020, to refuse it)."""
    if columns == JOB_TABLE_COLUMNS:
        return PUBLIC_FORMATS["alibaba-v2020"]
    return next((f for f in PUBLIC_FORMATS.values() if f.columns == columns), None)


def public_parser(
    label: str, fmt: PublicFormat, header_line: int, columns: tuple[str, ...] | None
) -> Callable[[Rows, str], list[TraceRow]]:
    """A parser for `fmt` over a file whose header (None: headerless) names `columns`; extra columns are allowed."""
    if columns == JOB_TABLE_COLUMNS:
        raise TraceError(f"{label}:{header_line}: this is pai_job_table, which has no GPU counts; "
                         "give the trace's pai_task_table.csv (its GPU tasks become jobs)")
    if columns is None:
        index = {c: i for i, c in enumerate(fmt.columns)}
    else:
        missing = [c for c in fmt.columns if c not in columns]
        if missing:
            raise TraceError(f"{label}:{header_line}: bad header for --trace-format {fmt.name}: "
                             f"column {missing[0]!r} missing (expected {','.join(fmt.columns)})")
        index = {c: columns.index(c) for c in fmt.columns}
        index.update({c: i for i, c in enumerate(columns) if c not in index})  # extra columns, for the width check

    def parse(rows: Rows, prefix: str) -> list[TraceRow]:
        return fmt.parse(rows, index, prefix)

    return parse
