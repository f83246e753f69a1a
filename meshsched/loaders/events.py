"""Event lists for the simulator: drains and resumes at given times (`mesh simulate --events FILE`), so that a
maintenance window can be planned on a trace.

`load_events(path, nodes, origin, load)` reads a CSV or JSON-lines file (docs/trace-format.md, "Event lists")
and returns `(time, DrainChanged)` pairs sorted by time (ties keep file order), times in the replay's seconds.
A time is a number of seconds since the replay's first arrival (with an optional unit: `90m`, `2h`, `1d`) or a
timestamp on the trace's own clock (`2017-10-03 08:00:00`), placed as an arrival at that moment would be:
minus the trace's origin (its first replayed arrival), divided by the load factor. Everything wrong raises
`EventsError` with one line, `"<file>:<line>: <what is wrong>"`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from meshsched import events as ev
from meshsched.state import NodeSpec

__all__ = ["ACTIONS", "COLUMNS", "EventsError", "load_events", "parse_events"]

COLUMNS = ("time", "node", "action", "gpus", "reason")  # the first three are required
ACTIONS = ("drain", "resume")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_EPOCH = datetime(1970, 1, 1)  # the trace loaders' clock: a naive timestamp is seconds since this


class EventsError(Exception):
    """An event list could not be read; the message is one line."""


def load_events(path: str | Path, nodes: Sequence[NodeSpec], origin: float | None = None,
                load: float = 1.0) -> list[tuple[float, ev.DrainChanged]]:
    """The file's drains and resumes on the simulated cluster `nodes`; `origin`: the trace-clock time of the
    replay's first arrival (None: the trace has no clock, timestamps are refused); `load`: --load."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise EventsError(f"{p}: no such events file") from None
    except OSError as exc:
        raise EventsError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise EventsError(f"{p}: not UTF-8 text (byte {exc.start})") from None
    return parse_events(str(p), text, nodes, origin, load)


def parse_events(label: str, text: str, nodes: Sequence[NodeSpec], origin: float | None = None,
                 load: float = 1.0) -> list[tuple[float, ev.DrainChanged]]:
    """`load_events` on text already read (`label` names it in messages)."""
    lines = text.split("\n")
    first = next((i for i, ln in enumerate(lines) if ln.strip() and not ln.lstrip().startswith("#")), None)
    if first is None:
        raise EventsError(f"{label}: empty events file")
    reader = _Reader(label, nodes, origin, load)
    rows = _json_rows(label, lines, first) if lines[first].lstrip().startswith("{") else _csv_rows(label, lines, first)
    out = [(reader.time(n, r), n, reader.event(n, r)) for n, r in rows]
    if not out:
        raise EventsError(f"{label}: a header but no events")
    out.sort(key=lambda t: (t[0], t[1]))
    return [(t, e) for t, _, e in out]


def _csv_rows(label: str, lines: list[str], first: int) -> list[tuple[int, dict]]:
    head = [c.strip().lower() for c in next(csv.reader([lines[first]]))]
    bad = [c for c in head if c not in COLUMNS]
    if bad or len(set(head)) != len(head) or not {"time", "node", "action"} <= set(head):
        what = f"unknown column {bad[0]!r}" if bad else "a column given twice" if len(set(head)) != len(head) else \
            f"missing column(s) {', '.join(c for c in COLUMNS[:3] if c not in head)}"
        raise EventsError(f"{label}:{first + 1}: bad header ({what}); columns: {','.join(COLUMNS)} "
                          "(time, node and action required)")
    rows = []
    for i in range(first + 1, len(lines)):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        cells = next(csv.reader([line]))
        if len(cells) != len(head):
            raise EventsError(f"{label}:{i + 1}: {len(cells)} field(s), the header has {len(head)} "
                              "(quote a GPU list with commas: \"0,1\")")
        rows.append((i + 1, {k: v.strip() for k, v in zip(head, cells)}))
    return rows


def _json_rows(label: str, lines: list[str], first: int) -> list[tuple[int, dict]]:
    rows = []
    for i in range(first, len(lines)):
        line = lines[i].strip()
        if not line or line.startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EventsError(f"{label}:{i + 1}: not a JSON object: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise EventsError(f"{label}:{i + 1}: not a JSON object")
        unknown = [k for k in obj if k not in COLUMNS]
        if unknown:
            raise EventsError(f"{label}:{i + 1}: unknown key {unknown[0]!r}; keys: {', '.join(COLUMNS)}")
        rows.append((i + 1, obj))
    return rows


class _Reader:
    """Checks one row's fields against the simulated cluster and the trace's clock."""

    def __init__(self, label: str, nodes: Sequence[NodeSpec], origin: float | None, load: float) -> None:
        self.label = label
        self.nodes = list(nodes)
        self.by_name = {n.name: n for n in self.nodes}
        self.origin = origin
        self.load = load

    def fail(self, line: int, what: str) -> EventsError:
        return EventsError(f"{self.label}:{line}: {what}")

    def time(self, line: int, row: dict) -> float:
        raw = row.get("time")
        if raw is None or raw == "":
            raise self.fail(line, "no time")
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            raise self.fail(line, f"time {raw!r} is not a number of seconds or a timestamp")
        at = float(raw) if not isinstance(raw, str) else self._time_text(line, raw.strip())
        if not math.isfinite(at) or at < 0:
            raise self.fail(line, f"time {raw!r} is before the replay's first arrival (or not finite)")
        return at

    def _time_text(self, line: int, text: str) -> float:
        number, unit = (text[:-1], _UNITS[text[-1].lower()]) if text and text[-1].lower() in _UNITS else (text, 1.0)
        try:
            return float(number) * unit
        except ValueError:
            pass
        try:
            stamp = datetime.fromisoformat(text)
        except ValueError:
            raise self.fail(line, f"time {text!r} is neither seconds (e.g. 3600, 90m, 2h) nor a timestamp "
                                  "(YYYY-MM-DD HH:MM:SS)") from None
        if self.origin is None:
            raise self.fail(line, f"time {text!r}: this trace has no clock of its own; give seconds")
        return ((stamp.replace(tzinfo=None) - _EPOCH).total_seconds() - self.origin) / self.load

    def event(self, line: int, row: dict) -> ev.DrainChanged:
        action = str(row.get("action") or "").strip().lower()
        if action not in ACTIONS:
            raise self.fail(line, f"action {row.get('action')!r}: expected drain or resume")
        node_text = row.get("node")
        gpus_text = row.get("gpus")
        if isinstance(node_text, str) and ":" in node_text and gpus_text in (None, ""):
            node_text, _, gpus_text = node_text.partition(":")  # NODE:GPU,... as `mesh drain` takes it
        node = self._node(line, node_text)
        gpus = self._gpus(line, gpus_text, node)
        reason = row.get("reason") or ""
        if not isinstance(reason, str):
            raise self.fail(line, f"reason {reason!r} is not text")
        return ev.DrainChanged(f"events-{line}", node.name, gpus, action == "drain", reason.strip(), "events file")

    def _node(self, line: int, raw) -> NodeSpec:
        if isinstance(raw, str) and raw.strip() in self.by_name:
            return self.by_name[raw.strip()]
        try:
            index = int(raw) if not isinstance(raw, (bool, float)) else None
        except (TypeError, ValueError):
            index = None
        if index is None or not 0 <= index < len(self.nodes):
            names = f"{self.nodes[0].name} ... {self.nodes[-1].name}" if len(self.nodes) > 1 else self.nodes[0].name
            raise self.fail(line, f"node {raw!r}: not a node of the simulated cluster (an index 0..{len(self.nodes) - 1} "
                                  f"or a name {names})")
        return self.nodes[index]

    def _gpus(self, line: int, raw, node: NodeSpec) -> tuple[int, ...]:
        if raw is None or raw == "" or raw == []:
            return ()
        parts = raw if isinstance(raw, list) else str(raw).replace(";", ",").replace(" ", ",").split(",")
        gpus = []
        for p in parts:
            if p == "":
                continue
            try:
                g = int(p) if not isinstance(p, (bool, float)) else None
            except (TypeError, ValueError):
                g = None
            if g is None or not 0 <= g < node.gpus:
                raise self.fail(line, f"GPU {p!r}: {node.name} has GPUs 0..{node.gpus - 1}")
            gpus.append(g)
        return tuple(sorted(set(gpus)))
