"""Job traces for the simulator: the built-in Philly traces and user CSV files, loaded as `JobSpec`s.

`load_trace(name_or_path, perf, options)` reads a built-in trace from the package data
(`meshsched.profiles/traces/*.csv.gz`) or a file (plain or gzip), selects a window and/or the first N jobs,
rebases arrivals so the first selected job arrives at 0.0, divides arrival times by the load factor, and
gives each job a model, batch, iteration count and deadline (`trace_synth`). Formats: docs/trace-format.md.
`load_plan_trace` reads one for an execution-plan workload (`meshsched.sim.rubick_trace.plan_workload`).
"""

from __future__ import annotations

import gzip
import math
import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType

from meshsched.perf import PerfModel
from meshsched.perf.plans import PlanPerfModel
from meshsched.sim.rubick_trace import WorkloadOptions, plan_workload
from meshsched.sim.trace_formats import TRACE_FORMATS, TraceError, parse_trace_text
from meshsched.sim.trace_synth import JobSynthesizer
from meshsched.state import JobSpec

__all__ = ["BUILTIN_TRACES", "TRACE_FORMATS", "Trace", "TraceError", "TraceOptions", "load_plan_trace", "load_trace", "read_trace"]

BUILTIN_TRACES: tuple[str, ...] = ("philly", "philly-rfold")
BUILTIN_FILES = MappingProxyType({"philly": "philly.csv.gz", "philly-rfold": "philly_rfold.csv.gz"})


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """How to turn a trace into jobs; checked on construction (`TraceError`)."""

    gpu_type: str
    gpus_per_node: int
    seed: int = 0
    load: float = 1.0  # arrival times are divided by this: 2.0 = arrivals twice as dense
    first_n: int | None = None  # keep the first N jobs (after the window)
    window: tuple[float, float] | None = None  # [start, end) seconds since the trace's first arrival
    trace_format: str = "auto"  # TRACE_FORMATS (meshsched.sim.trace_formats); "auto": picked from the header

    def __post_init__(self) -> None:
        if self.trace_format not in TRACE_FORMATS:
            raise TraceError(f"bad options: unknown trace format {self.trace_format!r}; known: {', '.join(TRACE_FORMATS)}")
        if not isinstance(self.gpu_type, str) or not self.gpu_type:
            raise TraceError(f"bad options: gpu_type must be a non-empty string, got {self.gpu_type!r}")
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise TraceError(f"bad options: gpus_per_node must be an integer >= 1, got {self.gpus_per_node!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TraceError(f"bad options: seed must be an integer, got {self.seed!r}")
        if not isinstance(self.load, (int, float)) or not math.isfinite(self.load) or self.load <= 0:
            raise TraceError(f"bad options: load must be a finite number > 0, got {self.load!r}")
        if self.first_n is not None and (
            isinstance(self.first_n, bool) or not isinstance(self.first_n, int) or self.first_n < 1
        ):
            raise TraceError(f"bad options: first_n must be an integer >= 1, got {self.first_n!r}")
        if self.window is not None:
            if len(self.window) != 2:
                raise TraceError(f"bad options: window must be (start, end), got {self.window!r}")
            start, end = self.window
            if not math.isfinite(start) or start < 0 or math.isnan(end) or end <= start:
                raise TraceError(f"bad options: window [{start}, {end}) is empty or negative")


@dataclass(frozen=True, slots=True)
class Trace:
    """Jobs sorted by submit time (first at 0.0) and, in the same order, each job's duration in the trace."""

    name: str
    jobs: tuple[JobSpec, ...]
    durations: tuple[float, ...]
    origin: float | None = None  # the first job's arrival on the file's clock (None: no clock, a made workload)
    load: float = 1.0  # arrivals on the file's clock were divided by this (TraceOptions.load)


def load_trace(trace: str, perf: PerfModel, options: TraceOptions) -> Trace:
    """Load a built-in trace (`BUILTIN_TRACES`) or a CSV file (plain or gzip) as jobs; see the module doc."""
    label, name, text = read_trace(trace)
    parsed = parse_trace_text(label, text, job_prefix=name, fmt=options.trace_format)
    rows = sorted(parsed.rows, key=lambda r: r.submit)  # stable: ties keep file order
    if options.window is not None:
        start, end = options.window
        first = rows[0].submit
        rows = [r for r in rows if start <= r.submit - first < end]
        if not rows:
            raise TraceError(f"{label}: no job arrives in the window [{start:g}, {end:g}) s")
    if options.first_n is not None:
        rows = rows[: options.first_n]
    synth = JobSynthesizer(perf, options.gpu_type, options.gpus_per_node, options.seed, label)
    base, load, draw = rows[0].submit, float(options.load), not parsed.has_deadlines
    jobs: list[JobSpec] = []
    durations: list[float] = []
    for row in rows:
        spec, duration = synth.job(row, (row.submit - base) / load, draw)
        jobs.append(spec)
        durations.append(duration)
    return Trace(name, tuple(jobs), tuple(durations), base, load)


def load_plan_trace(trace: str, perf: PlanPerfModel, opts: WorkloadOptions) -> list[JobSpec]:
    """`plan_workload` (meshsched.sim.rubick_trace) over a built-in trace or a trace file (the formats above)."""
    label, name, text = read_trace(trace)
    rows = [r for r in parse_trace_text(label, text, job_prefix=name).rows if r.duration is not None]
    if not rows:
        raise TraceError(f"{label}: no row gives a duration (plan workloads need durations)")
    return plan_workload(rows, perf, opts)


def read_trace(trace: str) -> tuple[str, str, str]:
    """(label for messages, trace name, text) of a built-in trace or a file; gzip is detected by content."""
    if trace in BUILTIN_FILES:
        label, name = BUILTIN_FILES[trace], trace
        try:
            data = (resources.files("meshsched.profiles") / "traces" / label).read_bytes()
        except OSError as exc:
            raise TraceError(f"built-in trace {trace!r}: package data {label} unreadable: {exc}") from None
    else:
        path = Path(trace)
        if not path.is_file():
            raise TraceError(
                f"unknown trace {trace!r}: not a built-in one ({', '.join(BUILTIN_TRACES)}) and no such file"
            )
        label = str(path)
        name = path.name.removesuffix(".gz").removesuffix(".csv") or "trace"
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise TraceError(f"{label}: cannot read: {exc.strerror or exc}") from None
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceError(f"{label}: bad gzip data: {exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{label}: not UTF-8 text (byte {exc.start})") from None
    return label, name, text
