"""Job ids never go back: a high-water mark kept apart from the journal.

The journal's own counter (`Journal.next_seq`) is lost with the journal: one moved aside, emptied (0 bytes) or
cut short (a truncated WAL) would hand out again the ids it gave. The floor of every new id is therefore the
larger of two marks the journal does not hold: the highest job directory (`dirs.highest_job_dir`, a job that has
run) and `last-job-id` in the state directory, the highest sequence number ever given out (a job still queued has
no directory yet). The file is rewritten in place (one fixed-width `pwrite`, no new block to allocate) before
the record with that id is journaled, so a kill -9 of meshd between the two never loses it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from meshsched.daemon.dirs import highest_job_dir

LOG = logging.getLogger("meshd")
WIDTH = 20  # digits of the mark, so every write has the same length (no truncation, no torn tail)


class IdMark:
    """The highest job sequence number given out, in `path` (0600); `jobs_dir` sets a floor under it."""

    def __init__(self, path: Path, jobs_dir: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.last = max(_read(self._fd), highest_job_dir(jobs_dir))

    def floor(self) -> int:
        """The smallest sequence number a new job may get."""
        return self.last + 1

    def given(self, seq: int) -> None:
        """`seq` was given out: raise the mark (before the record with that id is journaled)."""
        if seq <= self.last:
            return
        os.pwrite(self._fd, f"{seq:>{WIDTH}}\n".encode(), 0)
        self.last = seq

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _read(fd: int) -> int:
    text = os.pread(fd, WIDTH + 1, 0).decode(errors="replace").strip()
    if not text:
        return 0
    try:
        return int(text)
    except ValueError:
        LOG.warning("the job id mark holds %r, not a number: ids continue past the job directories", text[:40])
        return 0
