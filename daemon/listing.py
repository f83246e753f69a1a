"""meshd's job listings: the squeue table `mesh ls` prints (rendered here, passed through by the CLI) and the job
views `mesh ls --json` prints (encoded here), both cached between state changes.

Every change to a job record and every engine event ends a journal write (`Journal.writes` counts them), so a
job's table row or encoded view made at one count holds until the count moves; then the cache is dropped whole.
Only the jobs whose view moves with the clock (started and not ended: TIME, done_iterations; or with throughput
reports) are made afresh per request. A listing of 1,000 queued jobs is then one join of cached pieces.
"""

from __future__ import annotations

import json
import time

from meshsched.cli.jobs import JOBS_HEADER, jobs_row
from meshsched.cli.output import columns

PRIVATE = ("command", "cwd", "job_dir", "output", "error", "rank_reports")  # not listed to other users


class Listings:
    def __init__(self, daemon) -> None:
        self.daemon = daemon
        self._at = -1  # the journal's write count the cached pieces were made at
        self._rows: dict[str, tuple[str, ...]] = {}  # job -> its table row
        self._views: dict[str, list[bytes | None]] = {}  # job -> [its encoded view, the same without PRIVATE]

    def _fresh(self) -> None:
        writes = self.daemon.journal.writes
        if writes != self._at:
            self._rows.clear()
            self._views.clear()
            self._at = writes

    def _live(self, rec) -> bool:
        """Its view moves with the clock (or with rank reports that are no engine event)."""
        return (rec.start_time is not None and rec.end_time is None) or rec.job_id in self.daemon.throughput

    def table(self, recs: list) -> bytes:
        """The `mesh ls` table of `recs` (header first), UTF-8."""
        self._fresh()
        now, rows, cache = time.time(), [JOBS_HEADER], self._rows
        for rec in recs:
            row = cache.get(rec.job_id)
            if row is None:
                row = jobs_row(self.brief(rec, now))
                if not self._live(rec):
                    cache[rec.job_id] = row
            rows.append(row)
        return ("\n".join(columns(rows)) + "\n").encode()

    def views(self, recs: list, uid: int | None, operator: bool) -> bytes:
        """The JSON list of the job views of `recs`; a user who is not an operator sees other users' jobs
        without their PRIVATE fields (the queue is public, what others run and where is not)."""
        self._fresh()
        now, out, cache = time.time(), [], self._views
        for rec in recs:
            mine = operator or rec.uid == uid
            pair = cache.get(rec.job_id)
            if pair is None or pair[not mine] is None:
                view = self.daemon.job_view(rec, now)
                if not mine:
                    view = {k: v for k, v in view.items() if k not in PRIVATE}
                encoded = json.dumps(view, separators=(",", ":")).encode()
                if not self._live(rec):
                    cache.setdefault(rec.job_id, [None, None])[not mine] = encoded
                out.append(encoded)
            else:
                out.append(pair[not mine])
        return b"[" + b",".join(out) + b"]"

    def brief(self, rec, now: float) -> dict:
        """job_view's squeue columns only: the same values at a fraction of the cost."""
        d = self.daemon
        job, start = d.engine.state.jobs.get(rec.job_id), rec.start_time
        queued = job is not None and job.state.is_queued
        holds = job is not None and job.state.holds_gpus
        out = {"job_id": rec.job_id, "name": rec.name, "user": rec.user, "state": rec.state, "gpus": rec.gpus,
               "node": rec.node, "reason": d.engine.pending_reason(rec.job_id) if queued else rec.reason,
               "elapsed": 0.0 if start is None else max(0.0, (rec.end_time or now) - start),
               "partners": d.partners(job) if holds else [], "exec": rec.exec if holds else None}
        if rec.cancelling and holds:  # as job_view says it
            out["state"], out["reason"] = "COMPLETING", "cancelled; waiting for its processes to exit"
        return out
