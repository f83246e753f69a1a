"""When meshd's state disk fills: ends kept in memory and retried, new launches held with one reason.

An engine event has already happened when its journal transaction commits: if the commit fails (SQLite's
"database or disk is full", ENOSPC), the journal keeps its writes in memory (`Journal.pending`) and they go
with the next commit. `DiskWatch` notices that after each write, says it in one log line, and retries every
RETRY_S until the journal is whole again. Meanwhile no new job starts: a launch the engine decides is held
here (the job keeps its GPUs, LOADING, with the reason `DiskFull (...)`) and goes ahead once space returns;
so is a launch whose files cannot be written (ENOSPC). Running jobs are never touched. One more line says
when the disk has space again.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable

from meshsched.daemon.journal import Journal

from meshsched.actions import Launch

LOG = logging.getLogger("meshd")
RETRY_S = 2.0  # seconds between retries of what could not be written
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_full(exc: BaseException) -> bool:
    """A write failed because the disk (or the user's quota) is full."""
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


class DiskWatch:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.why = ""  # why the disk counts as full now ("" while it does not)
        self.parked: dict[str, Launch] = {}  # job -> the launch held until space returns
        self.resume: Callable[[list[Launch]], None] = lambda launches: None  # carries held launches out (LocalRuns)
        self._timer: asyncio.TimerHandle | None = None
        self._quiet = False  # retrying: a launch that fails again says nothing new

    @property
    def reason(self) -> str:
        """A held job's reason, as `mesh ls` / `mesh show` print it."""
        return f"DiskFull (meshd's state disk is full: {self.why}; the job starts once space returns)"

    def blocked(self) -> bool:
        """No new job may start now."""
        return bool(self.why)

    def check(self) -> None:
        """After a journal write: a commit that failed makes the disk full until a retry succeeds."""
        if self.journal.pending:
            self.full(self.journal.failure)

    def full(self, why: str) -> None:
        if not self.why:
            self.why = why or "no space left"
            if not self._quiet:
                LOG.warning("the state disk is full (%s): %d journal write(s) kept in memory and retried every "
                            "%g s; no new job starts until space returns, running jobs go on", self.why,
                            len(self.journal.pending), RETRY_S)
        self._arm()

    def park(self, action: Launch, why: str = "") -> None:
        """Hold `action` until the disk has space (`why`: the write that failed, when it did)."""
        self.parked[action.job_id] = action
        self.full(why)

    def unpark(self, job_id: str) -> Launch | None:
        """The held launch of `job_id` dropped (the job is stopped or cancelled before it started)."""
        return self.parked.pop(job_id, None)

    def _arm(self) -> None:
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a test driving the engine by hand): the next event retries
            return
        self._timer = loop.call_later(RETRY_S, self.retry)

    def retry(self) -> None:
        """Write what the journal keeps; once it is whole, carry out the held launches (each may be held again)."""
        self._timer = None
        if not self.journal.retry():
            self._arm()
            return
        if not self.why:
            return
        was, self.why = self.why, ""
        launches, self.parked = list(self.parked.values()), {}
        self._quiet = True
        try:
            self.resume(launches)
        finally:
            self._quiet = False
        if self.why or self.journal.pending:  # still full
            self.full(self.why or was)
            return
        LOG.warning("the state disk has space again: the journal is written; %d held launch(es) go ahead",
                    len(launches))

    def close(self) -> None:
        """meshd stops: one last try to write what is kept."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.journal.pending and not self.journal.retry():
            LOG.warning("meshd stops with %d journal write(s) the full disk refused; jobs whose end is among them "
                        "take it from their result.json on the next start, or are requeued", len(self.journal.pending))
