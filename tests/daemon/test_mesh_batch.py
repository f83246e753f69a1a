"""The leader's append loop in batches (daemon/mesh.py `_sequence`/`_append`) and etcd's history compacted under
the mesh (after a snapshot), over a real etcd: MeshLink with a replica double that records what it applies."""

from __future__ import annotations

import asyncio
import re

import pytest
from meshsched.daemon.config import CoordinatorConfig
from meshsched.daemon.etcd import EtcdCoordinator, EtcdError, Gateway
from meshsched.daemon.etcd_local import ETCD, NO_ETCD, start_etcd
from meshsched.daemon.eventlog import Entry, Snapshot, index_of
from meshsched.daemon.mesh import LinkContext, MeshLink

from meshsched import events as ev


@pytest.fixture
def etcd(tmp_path):
    if ETCD is None:
        pytest.skip(NO_ETCD)
    server = start_etcd(tmp_path)
    yield server
    server.stop()


def _config(url: str, prefix: str, **kw) -> CoordinatorConfig:
    return CoordinatorConfig("etcd", (url,), ttl=3, loop_wait=1.0, retry_timeout=1.0, prefix=prefix, **kw)


class Replica:
    """The node side: the entries applied, in order (no engine, no processes)."""

    def __init__(self) -> None:
        self.applied: list[tuple[int, str]] = []  # (index, proposal)

    def apply_entry(self, entry: Entry, index: int, act: bool) -> None:
        self.applied.append((index, entry.proposal))

    def synced(self) -> None:
        pass

    def leadership_changed(self, leader: str | None) -> None:
        pass

    def snapshot(self, index: int, last_seq: dict, addresses: dict) -> Snapshot:
        return Snapshot(index, {}, {}, dict(last_seq), dict(addresses))

    def load_snapshot(self, snap: Snapshot, durable: int) -> None:
        pass


class Counting(EtcdCoordinator):
    """The real client; counts the transactions that write log entries and can die right after the k-th one
    (the write reached etcd, the leader never learns: it hangs until it is closed, as a SIGKILL would)."""

    def __init__(self, config: CoordinatorConfig, name: str, die_after: int = 0) -> None:
        super().__init__(config, name)
        self.log_writes = 0
        self.die_after = die_after
        self.died = asyncio.Event()
        self.gate: asyncio.Event | None = None  # set: the first watch of the log waits for it (a lagging follower)
        self.compacted_watches = 0

    async def _wrote_log(self) -> None:
        self.log_writes += 1
        if self.log_writes == self.die_after:
            self.died.set()
            await asyncio.Event().wait()

    async def put(self, key: str, value: str, term: int | None = None) -> int:
        revision = await super().put(key, value, term)
        if key.startswith("log/") and term is not None and not hasattr(EtcdCoordinator, "append"):
            await self._wrote_log()  # (the code before batching: one put per entry)
        return revision

    async def append(self, term: int, puts: list[tuple[str, str]], deletes: list[str]) -> int:
        revision = await super().append(term, puts, deletes)
        if any(k.startswith("log/") for k, _ in puts):
            await self._wrote_log()
        return revision

    async def watch(self, prefix: str = "", since: int | None = None):
        if prefix == "log/" and self.gate is not None:
            gate, self.gate = self.gate, None
            await gate.wait()
        try:
            async for change in super().watch(prefix, since):
                yield change
        except Exception as exc:
            if "compacted" in str(exc):
                self.compacted_watches += 1
            raise


def _link(name: str, coord: Counting, config: CoordinatorConfig) -> tuple[MeshLink, Replica]:
    replica = Replica()
    return MeshLink(LinkContext(name, name, (), 0, dict, {}), replica, coord, config, node_grace=30.0), replica


async def _propose(coord: EtcdCoordinator, nodes: int, per_node: int, start: int = 0) -> list[str]:
    """Proposals as MeshLink.propose writes them: `proposals/{node}/{seq}`, seq growing per node."""
    names = []
    for i in range(start, start + per_node):
        for n in range(nodes):
            proposal = f"p{n}/{i:08d}"
            await coord.put(f"proposals/{proposal}", Entry(ev.CancelRequested(f"c{n}-{i}", f"j{n}.{i}"),
                                                           f"p{n}").to_json())
            names.append(proposal)
    return names


async def _until(check, timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _log(coord: EtcdCoordinator) -> list[tuple[int, str]]:
    listing = await coord.list("log/")
    return sorted((index_of(k), Entry.from_json(v).proposal) for k, v in listing.items.items())


def _check_log(log: list[tuple[int, str]], proposed: list[str]) -> None:
    assert [i for i, _ in log] == list(range(1, len(log) + 1)), "a gap in the log"
    got = [p for _, p in log]
    assert sorted(got) == sorted(proposed), "a proposal missing from the log or in it twice"
    for node in {p.split("/")[0] for p in proposed}:  # each node's proposals in their order
        mine = [p for p in got if p.startswith(node + "/")]
        assert mine == sorted(mine)


async def test_many_proposals_go_into_the_log_in_order_each_once_in_few_transactions(etcd):
    config = _config(etcd.url, "/batch")
    probe = EtcdCoordinator(config, "probe")
    await probe.start()
    proposed = await _propose(probe, 4, 50)  # 200 waiting when the leader starts: listed, then written in batches
    leader_coord = Counting(config, "a")
    link, replica = _link("a", leader_coord, config)
    link.start()
    try:
        await _until(lambda: link.position == 200, 30, "the listed proposals in the log")
        proposed += await _propose(probe, 4, 25, start=50)  # and 100 more through the watch, while it runs
        await _until(lambda: link.position == 300, 30, "the watched proposals in the log")
        _check_log(await _log(probe), proposed)
        assert [i for i, _ in replica.applied] == list(range(1, 301))
        assert (await probe.list("proposals/")).items == {}
        assert leader_coord.log_writes <= 200 // 64 + 1 + 100, leader_coord.log_writes  # the listing: 4 txns
    finally:
        await link.close()
        await probe.close()


async def test_a_leader_killed_right_after_a_batch_reached_etcd_leaves_no_gap_and_no_double(etcd):
    config = _config(etcd.url, "/batchkill")
    probe = EtcdCoordinator(config, "probe")
    await probe.start()
    proposed = await _propose(probe, 3, 60)
    a_coord, b_coord = Counting(config, "a", die_after=2), Counting(config, "b")
    a, _ = _link("a", a_coord, config)
    a.start()
    await asyncio.wait_for(a_coord.died.wait(), 30)  # its second write is in etcd; it never learned
    b, b_replica = _link("b", b_coord, config)
    b.start()
    await asyncio.sleep(0.5)
    assert b.term is None  # a still holds the leader key
    await a.close()  # the kill: its lease goes, b takes over from what etcd holds
    try:
        await _until(lambda: b.position == len(proposed), 30, "b to append the rest")
        _check_log(await _log(probe), proposed)
        assert (await probe.list("proposals/")).items == {}
        assert [p for _, p in b_replica.applied] == [p for _, p in await _log(probe)]
    finally:
        await b.close()
        await probe.close()


async def test_history_is_compacted_after_a_snapshot_and_a_lagging_follower_lists_again(etcd):
    config = _config(etcd.url, "/compact", snapshot_entries=10)
    probe = EtcdCoordinator(config, "probe")
    await probe.start()
    a_coord, b_coord = Counting(config, "a"), Counting(config, "b")
    a, _ = _link("a", a_coord, config)
    a.start()
    await _until(lambda: a.term is not None, 15, "a to lead")
    gate = b_coord.gate = asyncio.Event()  # b lists the (empty) log, then its watch of it waits
    b, b_replica = _link("b", b_coord, config)
    b.start()
    await _until(lambda: b.synced, 15, "b to list the log")
    listed = (await probe.list("log/")).revision
    try:
        proposed = await _propose(probe, 3, 5)  # 15 entries: a snapshot at 10, etcd compacted under it
        await _until(lambda: a.snapshots_written == 1 and a.position == 15, 30, "a's snapshot")
        gateway = Gateway((etcd.url,), 1.0, idle=3.0)
        await gateway.open()
        try:
            await _until_compacted(gateway, listed)
        finally:
            await gateway.close()
        assert b_replica.applied == []
        gate.set()  # b's watch opens from before the compaction: etcd answers ErrCompacted, b lists the log again
        await _until(lambda: b.position == 15, 30, "b to follow past the compaction")
        assert b_coord.compacted_watches >= 1
        # (at position 0 it starts from the newest snapshot, as a joining node does, and applies the tail)
        assert b_replica.applied == [(i, p) for i, p in await _log(probe) if i > b.snapshot_index]
        _check_log(await _log(probe), proposed)
    finally:
        await b.close()
        await a.close()
        await probe.close()


async def _until_compacted(gateway: Gateway, revision: int) -> None:
    """etcd refuses a read at `revision`: its history is compacted past it (the leader compacted after its snapshot)."""
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        try:
            await gateway.call("/v3/kv/range", {"key": "eA==", "revision": str(revision)})
        except EtcdError as exc:
            assert exc.code == 11 and re.search("compacted", str(exc)), exc
            return
        assert asyncio.get_running_loop().time() < deadline, f"etcd's history still holds revision {revision}"
        await asyncio.sleep(0.1)


@pytest.fixture(params=["local", "etcd"])
async def store(request):
    """A started coordinator of each backend, its own leader (term)."""
    from meshsched.daemon.coordinator import LocalCoordinator

    if request.param == "local":
        coord = LocalCoordinator("a")
    else:
        coord = EtcdCoordinator(_config(request.getfixturevalue("etcd").url, "/store"), "a")
    await coord.start()
    await _until_term(coord)
    yield coord
    await coord.close()


async def _until_term(coord) -> None:
    for _ in range(100):
        if await coord.acquire_leadership() is not None:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("no leadership")


async def test_append_is_one_fenced_transaction_and_compact_ends_older_watches(store):
    from meshsched.daemon.coordinator import StaleTerm, WatchCompacted

    term = store.term
    await store.put("proposals/x/1", "p1")
    await store.put("proposals/x/2", "p2")
    revision = await store.append(term, [("log/1", "e1"), ("log/2", "e2")], ["proposals/x/1", "proposals/x/2"])
    assert (await store.list("log/")).items == {"log/1": "e1", "log/2": "e2"}
    assert (await store.list("proposals/")).items == {}
    with pytest.raises(StaleTerm):  # a term older than the current one: nothing written
        await store.append(term - 1, [("log/3", "e3")], ["log/1"])
    assert (await store.list("log/")).items == {"log/1": "e1", "log/2": "e2"}
    before = revision - 1
    await store.put("other", "y")
    await store.compact(revision + 1)
    await store.compact(revision + 1)  # again (another leader did it already): no error
    with pytest.raises(WatchCompacted):
        async with asyncio.timeout(10):
            async for _ in store.watch("log/", since=before):
                pass
