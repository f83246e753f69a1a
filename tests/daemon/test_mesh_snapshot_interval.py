"""The leader's snapshot interval (daemon/mesh.py `_snapshot_due`) counts log entries as the log holds them: a
second copy of a proposal (appended again after a failover or a retried put) and an entry that does not decode
take a log key and a joining node's replay like any other, so they count toward `snapshot_entries` and
`snapshot_bytes` too (before, they were skipped uncounted and the snapshot came that many entries late)."""

from __future__ import annotations

import asyncio

from meshsched.daemon.config import CoordinatorConfig
from meshsched.daemon.coordinator import CoordinatorError
from meshsched.daemon.eventlog import Entry, Snapshot
from meshsched.daemon.mesh import LinkContext, MeshLink

from meshsched import events as ev


class Replica:
    def __init__(self) -> None:
        self.applied: list[int] = []

    def apply_entry(self, entry: Entry, index: int, act: bool) -> None:
        self.applied.append(index)

    def snapshot(self, index: int, last_seq: dict, addresses: dict) -> Snapshot:
        return Snapshot(index, {}, {}, dict(last_seq), dict(addresses))


def _leader(**kw) -> tuple[MeshLink, list[int]]:
    config = CoordinatorConfig("etcd", ("http://127.0.0.1:1",), ttl=3, loop_wait=1.0, retry_timeout=1.0, **kw)
    link = MeshLink(LinkContext("a", "a", (), 0, dict, {}), Replica(), None, config, node_grace=30.0)
    taken: list[int] = []
    link._take_snapshot = lambda term: (taken.append(link.position), setattr(link, "_since_snapshot", [0, 0]))
    link.term = 7  # it leads
    return link, taken


def _entry(node: str, seq: int) -> str:
    return Entry(ev.CancelRequested(f"c{seq}", f"j{seq}"), node, proposal=f"{node}/{seq:08d}").to_json()


def test_second_copies_and_unreadable_entries_count_toward_snapshot_entries():
    link, taken = _leader(snapshot_entries=5, snapshot_bytes=0)
    texts = [_entry("n1", 1), _entry("n1", 2), _entry("n1", 2), "{not json", _entry("n1", 3), _entry("n1", 4),
             _entry("n1", 4), _entry("n1", 5), _entry("n1", 6), _entry("n1", 7)]
    for index, text in enumerate(texts, start=1):
        link._apply_text(index, text)
    assert link.position == 10
    assert link.replica.applied == [1, 2, 5, 6, 8, 9, 10]  # the second copies and the bad entry are not applied
    assert taken == [5, 10]  # but the log's 5th and 10th entries are where the snapshots fall


def test_second_copies_count_toward_snapshot_bytes():
    one = _entry("n1", 1)
    link, taken = _leader(snapshot_entries=0, snapshot_bytes=3 * len(one))
    for index, text in enumerate([one, one, one], start=1):
        link._apply_text(index, text)
    assert taken == [3]


def test_an_entry_already_applied_does_not_count():
    link, taken = _leader(snapshot_entries=3, snapshot_bytes=0)
    for index in (1, 2, 2, 1, 2):
        link._apply_text(index, _entry("n1", index))
    assert (link.position, taken) == (2, [])
    link._apply_text(3, _entry("n1", 3))
    assert taken == [3]


class FlakyStore:
    """The coordinator as `_store_snapshot` uses it; the first `fail` puts time out (an etcd too busy to answer
    within retry_timeout, as in the 32-node scale runs on a loaded machine)."""

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.heads: list[str] = []

    async def put(self, key: str, value: str, term: int | None = None) -> int:
        if self.fail:
            self.fail -= 1
            raise CoordinatorError("etcd at http://10.0.0.1:2379 does not answer: timed out (tried for 1 s)")
        if key.startswith("snapshots/"):
            self.heads.append(key)
        return 1

    async def delete_range(self, start: str, end: str, term: int | None = None) -> int:
        return 0

    async def compact(self, revision: int) -> None:
        pass


async def _settle(link: MeshLink) -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_failed_snapshot_write_is_tried_again_a_tenth_of_an_interval_later():
    config = CoordinatorConfig("etcd", ("http://127.0.0.1:1",), ttl=3, loop_wait=1.0, retry_timeout=1.0,
                               snapshot_entries=20, snapshot_bytes=0)
    store = FlakyStore(fail=1)
    link = MeshLink(LinkContext("a", "a", (), 0, dict, {}), Replica(), store, config, node_grace=30.0)
    link.term = 7
    for index in range(1, 21):
        link._apply_text(index, _entry("n1", index))
    await _settle(link)
    assert (link.snapshots_written, store.heads) == (0, [])  # the write at entry 20 timed out
    for index in (21, 22):
        link._apply_text(index, _entry("n1", index))
    await _settle(link)
    assert link.snapshots_written == 1 and link.snapshot_index == 22  # not 1,000 entries later: 2 (a tenth of 20)
