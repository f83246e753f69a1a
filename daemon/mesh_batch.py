"""The leader's batches (daemon.mesh): proposals taken from the sequencer's queue, one etcd transaction each."""

from __future__ import annotations

import asyncio

BATCH_ENTRIES = 64  # log entries per transaction: etcd's --max-txn-ops (128 by default) counts a put and a delete
BATCH_BYTES = 256 * 1024  # proposal bytes per transaction: far under etcd's --max-request-bytes (1.5 MiB) in base64


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
