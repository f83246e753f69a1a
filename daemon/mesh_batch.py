"""The leader's batches (daemon.mesh): proposals taken from the sequencer's queue, one etcd transaction each; the
leader's own proposals handed to its sequencer without a round trip through etcd (`LocalProposals`); and the
per-hop trace of a proposal (`trace`: MESHSCHED_MESH_TRACE=1 in meshd's environment, quiet by default)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import replace

from meshsched.daemon.eventlog import Entry, LogError, log_key

BATCH_ENTRIES = 64  # log entries per transaction: etcd's --max-txn-ops (128 by default) counts a put and a delete
BATCH_BYTES = 256 * 1024  # proposal bytes per transaction: far under etcd's --max-request-bytes (1.5 MiB) in base64
LOG = logging.getLogger("meshd.mesh")
TRACE = logging.getLogger("meshd.mesh.trace")
if os.environ.get("MESHSCHED_MESH_TRACE") == "1":
    TRACE.setLevel(logging.DEBUG)


def trace(what: str, *keys: str, event=None) -> None:
    """One hop of a proposal (`proposals/NODE/SEQ` or `NODE/SEQ`), with the wall clock, at DEBUG: `trace T WHAT
    KEY... [EVENT JOB]` (benchmarks/failover.py --hops reads them from every meshd's log)."""
    if TRACE.isEnabledFor(logging.DEBUG):
        if event is not None:
            job = getattr(event, "job_id", None) or getattr(getattr(event, "spec", None), "job_id", None)
            keys = (*keys, type(event).__name__, job or "-")
        TRACE.debug("trace %.6f %s %s", time.time(), what, " ".join(keys))


def log_entries(batch: list[tuple[str, str]], last: int) -> tuple[list[tuple[str, str]], list[str]]:
    """A batch's log entries (at last+1, ..., stamped with the leader's clock and their proposal) and its
    proposals' deletes; a proposal that does not decode is deleted, never logged (one error line)."""
    puts: list[tuple[str, str]] = []
    deletes: list[str] = []
    for key, value in batch:
        proposal = key.removeprefix("proposals/")
        deletes.append(f"proposals/{proposal}")
        try:
            entry = replace(Entry.from_json(value), time=time.time(), proposal=proposal)
        except LogError as exc:
            LOG.error("mesh: proposal %s dropped: %s", key, exc)
            continue
        puts.append((log_key(last + 1 + len(puts)), entry.to_json()))
    return puts, deletes


async def take_batch(queue: asyncio.Queue) -> tuple[list[tuple[str, str]], BaseException | None]:
    """The next batch (waits for one proposal, then takes what is queued, each key once, up to BATCH_ENTRIES and
    BATCH_BYTES) and the error that ended the feeder, if it is next."""
    batch: list[tuple[str, str]] = []
    keys, size = set(), 0
    item = await queue.get()
    while True:
        if isinstance(item, BaseException):
            return batch, item
        if item[0] not in keys:  # the same key put twice (a retried put): one proposal
            keys.add(item[0])
            batch.append(item)
            size += len(item[1])
        if len(batch) >= BATCH_ENTRIES or size >= BATCH_BYTES or queue.empty():
            return batch, None
        item = queue.get_nowait()


class LocalProposals:
    """The leader's own proposals, straight into its sequencer's queue: no put to `proposals/` and no wait for
    its watch (one etcd round trip less, e.g. a job's start on the leader's node). The outbox hands one at a time
    and keeps it (in its file too) until the transaction that appends it has committed (`committed`); when
    there is no sequencer, or it stops, is cancelled or its transaction fails, `hand` says False and the outbox
    puts it as any node does (a transaction that committed although its answer was lost leaves a second copy,
    which the log applies once, as after a failover). A node's proposals enter the log in their order (the log
    applies a proposal older than one it applied of the same node never): after a put, none is handed until
    that put's proposal is in the log (`seen`), since the sequencer's watch may not have delivered it yet."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue | None = None  # the sequencer's, while it sequences
        self.unseen: str | None = None  # the newest proposal this node put (or tried to) not yet in the log
        self._waiting: dict[str, asyncio.Future] = {}

    def open(self, queue: asyncio.Queue) -> None:
        self.queue = queue

    def close(self) -> None:
        """The sequencer stopped (or lists again): what it was handed and has not appended goes back."""
        self.queue = None
        for future in self._waiting.values():
            if not future.done():
                future.set_result(False)

    def committed(self, keys) -> None:
        for key in keys:
            future = self._waiting.get(key)
            if future is not None and not future.done():
                future.set_result(True)

    def seen(self, key: str) -> None:
        """The log holds proposal `key` (applied here)."""
        if key == self.unseen:
            self.unseen = None

    async def hand(self, key: str, value: str) -> bool:
        """True once `key` is in the log; False: not taken (put it)."""
        if self.queue is None or self.unseen is not None:
            return False
        future = asyncio.get_running_loop().create_future()
        self._waiting[key] = future
        self.queue.put_nowait((key, value))
        try:
            return await future
        finally:
            self._waiting.pop(key, None)
