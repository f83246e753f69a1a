"""`mesh ls` as squeue prints it: which jobs a listing selects (`select`: --user, --me, --state, --name, ids), its
columns (`FIELDS`, `--format id,user,state,time,name`), pending array tasks collapsed into one row (`collapse`:
`12_[5-299%8]`, as squeue), and the table laid out in display cells (`render`: a column is at most `CAP` cells wide,
cut with an ellipsis; wide (CJK) characters take two cells, combining marks none).

A row is made from listing's brief of a job (daemon/listing.py `Listings.brief`), as the asking user may see it.
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable

from meshsched.wire.jobtable import batch, fmt_time, mps, partners, where

CAP = 32  # cells a column may take (the last one, NODE(REASON), is not padded and not cut)
STATES = ("PENDING", "LOADING", "RUNNING", "PAUSING", "PREEMPTED", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
TERMINAL = frozenset(("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"))


def _at(value: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(value)) if value is not None else "-"


def _step(b: dict) -> str:
    done = b.get("done_iterations")
    return "-" if done is None else f"{int(done)}/{b['iterations']}"


# field -> (header, its text of a brief, what it is (docs/daemon.md, `mesh ls --help`))
FIELDS: dict[str, tuple[str, Callable[[dict], str], str]] = {
    "id": ("JOBID", lambda b: b["job_id"], "job id (pending array tasks: ARRAY_[TASKS%LIMIT])"),
    "name": ("NAME", lambda b: b["name"], "job name"),
    "user": ("USER", lambda b: b["user"], "who submitted it"),
    "state": ("STATE", lambda b: b["state"], "PENDING, RUNNING, ... (COMPLETING: cancelled, processes ending)"),
    "time": ("TIME", lambda b: fmt_time(b["elapsed"]), "time it ran (held GPUs); not while queued or preempted"),
    "gpus": ("GPUS", lambda b: str(b["gpus"]), "GPUs asked for"),
    "partner": ("PARTNER", partners, "jobs sharing its GPUs"),
    "batch": ("BATCH", batch, "per-GPU micro-batch x accumulation steps"),
    "mps": ("MPS%", mps, "MPS active-thread share (100: a whole GPU)"),
    "where": ("NODE(REASON)", where, "its node while it runs, else (why it waits or ended)"),
    "node": ("NODE", lambda b: b["node"] or "-", "the node it runs (or last ran) on"),
    "reason": ("REASON", lambda b: b["reason"] or "-", "why it waits, or how it ended"),
    "submit": ("SUBMIT_TIME", lambda b: _at(b["submit_time"]), "when it was submitted"),
    "start": ("START_TIME", lambda b: _at(b["start_time"]), "when it first started"),
    "end": ("END_TIME", lambda b: _at(b["end_time"]), "when it ended"),
    "limit": ("TIME_LIMIT", lambda b: fmt_time(b["time_limit"]) if b["time_limit"] else "UNLIMITED",
              "time limit per run (--time)"),
    "left": ("TIME_LEFT", lambda b: "-" if b["time_left"] is None else fmt_time(b["time_left"]),
             "time left of its limit"),
    "array": ("ARRAY", lambda b: b["array_id"] or "-", "the array it is a task of"),
    "step": ("STEP", _step, "iterations the job reported / its total ('-': it reports none, see docs)"),
    "exit": ("EXIT", lambda b: "-" if b["exit_code"] is None else str(b["exit_code"]), "exit code once ended"),
}
DEFAULT = ("id", "name", "user", "state", "time", "gpus", "partner", "batch", "mps", "where")


def parse_format(text: str) -> tuple[str, ...]:
    """`id,user,state` -> the fields; ValueError naming an unknown one and the known ones."""
    names = tuple(n.strip().lower() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in FIELDS]
    if bad or not names:
        raise ValueError(f"--format {text!r}: unknown field {','.join(bad) or '(none given)'}; fields: "
                         f"{','.join(FIELDS)}")
    return names


def select(recs, query, user: str) -> list:
    """The records a listing's query selects: all=0 (unfinished only; a --state naming an ended state includes
    those), state=S[,S], user=NAME, mine=1 (`user`: the asking user), name=N. ValueError for an unknown state."""
    states = {s.strip().upper() for s in query.get("state", "").split(",") if s.strip()}
    bad = states - set(STATES)
    if bad:
        raise ValueError(f"--state {','.join(sorted(bad))}: no such state (states: {', '.join(STATES)})")
    if query.get("all", "1") == "0" and not states & TERMINAL:
        recs = [r for r in recs if r.state not in TERMINAL]
    who = user if query.get("mine") == "1" else query.get("user", "")
    name = query.get("name", "")
    if states or who or name:
        recs = [r for r in recs if (not states or r.state in states) and (not who or r.user == who)
                and (not name or r.name == name)]
    return list(recs)


def collapse(briefs: list[dict]) -> list[dict]:
    """Pending tasks of one array waiting for the same reason become one row (squeue's `12_[5-299%8]`), where
    its first task was; everything else stays as it is."""
    groups: dict[tuple, list[dict]] = {}
    out: list = []
    for b in briefs:
        if b.get("array_id") and b["state"] == "PENDING" and b.get("array_task") is not None:
            key = (b["array_id"], b["reason"])
            if key not in groups:
                groups[key] = []
                out.append(key)
            groups[key].append(b)
        else:
            out.append(b)
    rows = []
    for item in out:
        if isinstance(item, dict):
            rows.append(item)
            continue
        tasks = groups[item]
        if len(tasks) == 1:
            rows.append(tasks[0])
            continue
        limit = tasks[0].get("array_limit") or 0
        ids = task_ranges(sorted(t["array_task"] for t in tasks)) + (f"%{limit}" if limit else "")
        rows.append(dict(tasks[0], job_id=f"{item[0]}_[{ids}]"))
    return rows


def task_ranges(tasks: list[int]) -> str:
    """[1, 3, 5, 6, 7] -> '1,3,5-7'."""
    parts, i = [], 0
    while i < len(tasks):
        j = i
        while j + 1 < len(tasks) and tasks[j + 1] == tasks[j] + 1:
            j += 1
        parts.append(str(tasks[i]) if i == j else f"{tasks[i]}-{tasks[j]}")
        i = j + 1
    return ",".join(parts)


def row(b: dict, names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(FIELDS[n][1](b) for n in names)


def cells(text: str) -> int:
    """The terminal cells `text` takes: two for a wide (CJK) character, none for a combining mark."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def fit(text: str, cap: int) -> str:
    """`text` in at most `cap` cells: cut with an ellipsis when longer."""
    if cells(text) <= cap:
        return text
    out, used = [], 0
    for c in text:
        w = cells(c)
        if used + w > cap - 1:
            break
        out.append(c)
        used += w
    return "".join(out) + "…"


def render(rows: list[tuple[str, ...]], cap: int = CAP) -> bytes:
    """Left-aligned columns two spaces apart, in display cells; every column but the last (not padded) cut to
    `cap` cells. rows[0] is the header. UTF-8. An all-ASCII table within the cap (the common one) is a %-format
    per row, as wire.jobtable.columns."""
    if not rows:
        return b""
    last = len(rows[0]) - 1
    cols = list(zip(*rows))[:last]
    widths = [max(map(len, col)) for col in cols]
    if max(widths, default=0) <= cap and all("".join(col).isascii() for col in cols):
        fmt = "".join(f"%-{w}s  " for w in widths) + "%s"
        return ("\n".join([fmt % r for r in rows]) + "\n").encode()
    wide = ["".join(r[:last]).isascii() is False for r in rows]  # rows laid out cell by cell; the rest: %-format
    odd = [i for i, col in enumerate(cols) if widths[i] > cap or not "".join(col).isascii()]  # columns to cut
    cols = [[fit(v, cap) for v in col] if i in odd else col for i, col in enumerate(cols)]
    rows = [(*(col[k] for col in cols), orig[last]) for k, orig in enumerate(rows)]
    widths = [max(map(cells, col)) if i in odd else widths[i] for i, col in enumerate(cols)]
    fmt = "".join(f"%-{w}s  " for w in widths) + "%s"  # an ASCII row cut with "…" (one cell) still fits it
    return ("\n".join([("".join(v + " " * (widths[i] - cells(v) + 2) for i, v in enumerate(r[:last])) + r[last])
                        if w else fmt % r for r, w in zip(rows, wide)]) + "\n").encode()
