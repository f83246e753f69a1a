"""Accounting: one durable row per ended job, kept when retention forgets the job itself (`mesh acct`, sacct's
manner).

When a job reaches a terminal state, meshd writes its row into the journal's `accounting` table in the same
transaction as the record and the transition that ended it (`Journal.stage`): both commit or neither does, and a
full disk keeps the row in memory with the rest of that event's writes until a retry commits it (the journal's
deferred writes, daemon/diskwatch.py). Rows are never updated once the job has ended (a job's end is final) and
never deleted: retention (daemon/retention.py) removes the job's record and transitions, not its row.

GPU-hours: the job's GPUs x the seconds it held them, summed over its runs (a requeued or preempted job counts each
run from its launch to the moment it let go of its GPUs; time queued, held or preempted counts nothing), / 3600.
On a mesh every node applies every entry of the log with the leader's times, so every node writes the same row for
every job: each node's table is the whole mesh's accounting, and `mesh acct` asks only its own meshd.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from meshsched.daemon.journal import JobRecord, Journal

FIELDS = ("job_id", "user", "tenant", "name", "state", "exit_code", "submit", "start", "end", "gpus", "gpu_hours",
          "gpu_seconds", "restarts", "nodes")
INSERT = "INSERT OR {how} INTO accounting (job_id, end_time, user, uid, row) VALUES (?, ?, ?, ?, ?)"
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # one encoder for every row (a cancelled array: 300)


def row_of(rec: JobRecord, nodes: list[str]) -> dict:
    """A job's accounting row (its record once it ended; `nodes`: where its GPUs were)."""
    seconds = rec.gpus * rec.ran
    return {
        "job_id": rec.job_id, "user": rec.user, "uid": rec.uid, "tenant": rec.tenant, "name": rec.name,
        "state": rec.state, "exit_code": rec.exit_code, "submit": rec.submit_time, "start": rec.start_time,
        "end": rec.end_time, "gpus": rec.gpus, "gpu_seconds": round(seconds, 3),
        "gpu_hours": round(seconds / 3600, 6), "restarts": max(0, rec.restarts - 1),  # the record counts launches
        "nodes": nodes,
    }


class Accounting:
    """The accounting table, written through the journal's batches; `nodes_of` says where a record's GPUs are."""

    def __init__(self, journal: Journal, nodes_of: Callable[[JobRecord], list[str]]) -> None:
        self.journal = journal
        self.nodes_of = nodes_of

    def ended(self, rec: JobRecord, keep: bool = False) -> None:
        """Write `rec`'s row (in the open batch). `keep`: a row already there stays (retention writing the rows
        of jobs that ended before accounting existed)."""
        row = row_of(rec, self.nodes_of(rec))
        end = rec.end_time if rec.end_time is not None else rec.submit_time
        self.journal.stage(("acct", rec.job_id), INSERT.format(how="IGNORE" if keep else "REPLACE"),
                           (rec.job_id, end, rec.user, rec.uid, _ENCODE(row)))

    def rows(self, since: float | None = None, until: float | None = None, users: Iterable[str] = (),
             states: Iterable[str] = (), who: tuple[int | None, str] | None = None) -> list[dict]:
        """Rows of jobs that ended in [since, until), by end time (and those a full disk keeps in memory).
        `who` (uid, name): only that user's rows (a viewer who is not an operator)."""
        sql, args = "SELECT row FROM accounting WHERE 1", []
        if since is not None:
            sql, args = sql + " AND end_time >= ?", args + [since]
        if until is not None:
            sql, args = sql + " AND end_time < ?", args + [until]
        found = {}
        for (text,) in self.journal.select(sql + " ORDER BY end_time, job_id", tuple(args)):
            row = json.loads(text)
            found[row["job_id"]] = row
        for key, (_, values) in list(self.journal.pending.items()):
            if key[:2] == ("ext", "acct"):
                row = json.loads(values[4])
                if (since is None or row["end"] >= since) and (until is None or row["end"] < until):
                    found.setdefault(row["job_id"], row)
        users, states = set(users), {s.upper() for s in states}
        out = []
        for row in found.values():
            if users and row["user"] not in users or states and row["state"] not in states:
                continue
            if who is not None and not _owns(row, *who):
                continue
            out.append(row)
        out.sort(key=lambda r: (r["end"] or 0.0, r["job_id"]))
        return out


def _owns(row: dict, uid: int | None, name: str) -> bool:
    return row.get("uid") == uid if row.get("uid") is not None else row["user"] == name


def summary(rows: list[dict]) -> dict:
    """GPU-hours (and GPU-seconds, jobs) per user and per tenant over `rows`."""
    out: dict = {"users": {}, "tenants": {}, "total": {"jobs": 0, "gpu_seconds": 0.0, "gpu_hours": 0.0}}
    for row in rows:
        for table, key in (("users", row["user"]), ("tenants", row.get("tenant") or "default")):
            entry = out[table].setdefault(key, {"jobs": 0, "gpu_seconds": 0.0, "gpu_hours": 0.0})
            _add(entry, row)
        _add(out["total"], row)
    return out


def _add(entry: dict, row: dict) -> None:
    entry["jobs"] += 1
    entry["gpu_seconds"] = round(entry["gpu_seconds"] + row["gpu_seconds"], 3)
    entry["gpu_hours"] = round(entry["gpu_seconds"] / 3600, 6)
