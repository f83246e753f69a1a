"""MeshLink: one meshd's part in a mesh of daemons over the etcd coordinator.

Every node replays the same event log (`daemon.eventlog`) through its own engine, so every node holds the
whole mesh's state (`mesh ls` on any node shows every job) and carries out the actions that touch its own
GPUs. Nodes never decide alone: what happens here (a submit, an exit, a report, a cancel) is *proposed*; the
leader copies proposals into the log in one order, in batches (one etcd transaction fenced by its term puts a
batch's entries and deletes their proposals; its own reach its batches without a put: `LocalProposals`), and
arms the engine's timer. A new leader needs no rebuild: it has applied the same log. Local-first: while the
leader is gone, jobs keep running, proposals wait in an outbox (a file, `mesh-outbox.jsonl`, written before a
proposal is acknowledged, taken back by the next meshd: a SIGKILL loses none), and everything flows once there
is a leader again. The leader declares a node lost (the engine requeues its jobs) once its member entry has
been gone for `node_grace` seconds; a node that etcd has not seen alive for `ttl - retry_timeout` seconds fences itself
before that (stops its ranks, checkpointing where it can) and follows the log once it is back. Every `snapshot_entries` entries or `snapshot_bytes` bytes of log the leader writes a
snapshot (`snapshots/{index}`: the engine's state and meshd's beside it) and deletes the log entries up to the
previous snapshot and every snapshot older than that, then compacts etcd's history to the snapshot's
revision (a watch from before it lists again); a starting node loads the newest snapshot that decodes
(one it cannot read is refused in one line and the next older tried) and replays only the entries after it; a
running node that finds the log compacted past its position restarts itself in place to do the same (`_lagged`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from meshsched.daemon.config import CoordinatorConfig
from meshsched.daemon.coordinator import (
    ChangeKind,
    Coordinator,
    CoordinatorError,
    Member,
    StaleTerm,
    WatchCompacted,
)
from meshsched.daemon.eventlog import (
    SNAPSHOT_PARTS,
    SNAPSHOTS,
    Entry,
    LogError,
    Snapshot,
    index_of,
    install_model,
    join_snapshots,
    load_newest,
    log_key,
    part_key,
    snapshot_key,
    split_snapshot,
    with_model,
)
from meshsched.daemon.mesh_batch import LocalProposals, log_entries, take_batch, trace
from meshsched.daemon.mesh_node import MeshReplica
from meshsched.daemon.mesh_outbox import OutboxFile

from meshsched import events as ev
from meshsched.state import Node

LOG = logging.getLogger("meshd.mesh")
LEADER_ONLY = (ev.NodeLost, ev.Tick)  # the leader's proposals: kept in memory only (see `propose`)


@dataclass(frozen=True, slots=True)
class LinkContext:
    """What MeshLink uses of its node."""

    node: str  # this node's name
    address: str  # where its ranks are reached (its NodeJoined entry says it)
    gpu_names: tuple[str, ...]  # its GPUs, as its member entry lists them
    applied: int  # the log index up to which this node's journal has carried out the actions
    nodes: Callable[[], dict[str, Node]]  # the engine's nodes (the leader declares the missing ones lost)
    addresses: dict[str, str]  # node -> where its ranks are reached (filled from the log's NodeJoined entries)
    outbox: Path | None = None  # the durable outbox (default: the replica's `outbox_path`; none: memory only)
    restart: Callable[[str], None] | None = None  # restart meshd (the reason): the log was compacted past this node


class MeshLink:
    def __init__(self, ctx: LinkContext, replica: MeshReplica, coordinator: Coordinator, config: CoordinatorConfig,
                 node_grace: float) -> None:
        self.ctx = ctx
        self.replica = replica  # the node's side of the log: applies its entries
        self.coord = coordinator
        self.config = config
        self.node = ctx.node
        self.node_grace = node_grace
        self.position = 0  # the engine has applied the log up to here
        self.head = 0  # the newest log entry a listing or the watch showed (inf: unknown, since a fence)
        self.durable = ctx.applied  # actions carried out up to here (journaled)
        self.synced = False  # the log has been replayed since this meshd started
        self.lagged = False  # the log was compacted past this running node: it waits for its restart (`_lagged`)
        self.term: int | None = None
        self.leader: str | None = None
        self.leaderships = 0  # times this node became leader
        self.led_since: float | None = None  # when this node's current leadership began
        self.first_decision: float | None = None  # when this leadership first appended an entry
        self._last_seq: dict[str, str] = {}  # node -> newest proposal applied (a failover may copy one twice)
        self._outbox: deque[tuple[str, str]] = deque()
        self._local = LocalProposals()  # while this node leads: its own proposals go straight to its sequencer
        self._wake = asyncio.Event()
        self._seq = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_action = None  # the engine's latest ScheduleTimer: the leader arms it
        self._last_error = ""
        self.addresses = ctx.addresses  # node -> where its ranks are reached (from its NodeJoined entry)
        self.snapshot_index = 0  # the newest snapshot this node loaded or wrote
        self.snapshots_written = 0
        self.history_compacted = 0  # the etcd revision this leader last compacted the history to
        self._since_snapshot = [0, 0]  # entries and bytes applied since the newest snapshot
        self._snapshot_off = False  # the stack cannot be snapshotted (said once)
        self.fenced_at: float | None = None  # (UNIX time) this node fenced itself: etcd has not seen it alive
        self.fences = 0  # times this node fenced itself
        self.probe_interval = min(1.0, config.loop_wait)  # seconds between reads of the members (`_prove_alive`)
        self._alive_at = time.monotonic()  # when the newest read that found this node's member entry was sent
        self._outbox_file = OutboxFile(ctx.outbox or getattr(replica, "outbox_path", None))
        self._open_outbox()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._spawn(self._run())

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._disarm()
        self._outbox_file.close()
        try:
            await self.coord.close(release=True)
        except CoordinatorError as exc:
            LOG.warning("mesh: closing the coordinator: %s", exc)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            LOG.error("mesh: %s failed: %r", task.get_coro().__name__, task.exception(), exc_info=task.exception())

    def _say_once(self, message: str) -> None:
        if message != self._last_error:
            self._last_error = message
            LOG.error("mesh: %s (jobs here keep running; retrying every %g s)", message, self.config.loop_wait)

    async def _retry(self, what):
        """Run `what()` until the store answers (local-first: nothing here waits on the mesh but the mesh)."""
        while True:
            try:
                result = await what()
                self._last_error = ""
                return result
            except CoordinatorError as exc:
                self._say_once(str(exc))
                await asyncio.sleep(self.config.loop_wait)

    async def _run(self) -> None:
        await self._retry(self.coord.start)
        self._spawn(self._prove_alive())
        await self._retry(self._register)
        revision = await self._retry(self._catch_up)
        self.synced = True
        self.replica.synced()
        self._spawn(self._flush())
        if self.config.fence:
            self._spawn(self._fence_watch())  # once the log is replayed: the runs it stops are the log's
        self._spawn(self._follow(revision))
        self._spawn(self._lead())
        LOG.info("mesh: node %s joined (log at %d)", self.node, self.position)

    async def _register(self) -> None:
        sent = time.monotonic()
        await self.coord.register(Member(self.node, self.ctx.address, self.ctx.gpu_names))
        self._alive_at = max(self._alive_at, sent)  # the member entry is there: a proof of life (`_prove_alive`)

    # ---------------------------------------------------------------- the log

    async def _catch_up(self) -> int:
        """Apply what the log holds past this node's position; at start, from the newest snapshot that loads. The
        log is listed first: compaction deletes only entries up to a snapshot older than the newest."""
        listing = await self.coord.list("log/")
        if self.position == 0 and not self.synced:  # (a running node loads one only by restarting: `_lagged`)
            await self._load_snapshot()
        keys = sorted((k for k in listing.items if index_of(k) > self.position), key=index_of)
        self.head = max(map(index_of, listing.items), default=self.position)
        if keys and index_of(keys[0]) > self.position + 1 and self._lagged(index_of(keys[0])):
            return listing.revision
        for key in keys:
            self._apply_text(index_of(key), listing.items[key])
        return listing.revision

    def _lagged(self, first: int) -> bool:
        """The log starts at `first`, past this node's position: the leader compacted it while this node lagged (a
        stall or a partition shorter than node_grace, across two snapshots). A running node stops applying (the
        entries after the gap would act on a state they do not follow) and holds its launches; meshd restarts
        itself (`ctx.restart`), loads the newest snapshot and reconciles its runs with it, as after any restart.
        At start (no snapshot loads, so a restart would find the same) the entries after the gap are applied."""
        restart = self.synced and self.ctx.restart is not None
        LOG.error("mesh: the log starts at entry %d, past this node's position %d (compacted while this node lagged): "
                  "%s", first, self.position, "restarting meshd to load the newest snapshot" if restart else
                  "restart meshd to load the newest snapshot")
        if restart and not self.lagged:
            self.lagged = self.replica.holding = True
            self.ctx.restart(f"the mesh's log was compacted past this node's position {self.position}")
        return restart

    async def _load_snapshot(self) -> None:
        heads = await self.coord.list(SNAPSHOTS)
        if not heads.items:
            return
        texts = join_snapshots(heads.items, (await self.coord.list(SNAPSHOT_PARTS)).items)
        found = load_newest(texts, lambda snap: self.replica.load_snapshot(snap, self.durable),
                            lambda line: LOG.error("mesh: %s", line))
        if found is None:
            LOG.error("mesh: no snapshot loads: replaying the whole log")
            return
        snap = found[0]
        self.position = self.snapshot_index = snap.index
        self._last_seq.update(snap.last_seq)
        self.addresses.update(snap.addresses)
        LOG.info("mesh: loaded the snapshot at log entry %d", snap.index)
        install_model(snap, self.replica, lambda line: LOG.error("mesh: %s", line))  # Lazer's model, not refitted

    async def _follow(self, revision: int) -> None:
        while not self.lagged:
            try:
                async for change in self.coord.watch("log/", since=revision):
                    revision = change.revision
                    if change.kind is ChangeKind.PUT:
                        index = index_of(change.key)
                        self.head = max(self.head, index)
                        if index > self.position + 1:  # a gap: fill it from a listing
                            revision = await self._retry(self._catch_up)
                            break
                        self._apply_text(index, change.value)
                return
            except WatchCompacted as exc:  # the leader compacted etcd's history past this watch (after a snapshot)
                LOG.info("mesh: %s: listing the log again", exc)
                revision = await self._retry(self._catch_up)
            except CoordinatorError as exc:
                self._say_once(f"following the log: {exc}")
                revision = await self._retry(self._catch_up)

    def _apply_text(self, index: int, text: str) -> None:
        if index <= self.position or self.lagged:  # (lagged: a listing found the log compacted past this node)
            return
        self._since_snapshot[0] += 1  # every entry the log holds counts (a second copy, an unreadable one too):
        self._since_snapshot[1] += len(text)  # each takes a key and a joining node's replay
        self._hold(index)
        self._apply_one(index, text)
        self._hold(index, after=True)
        if self.term is not None and self._snapshot_due():
            self._take_snapshot(self.term)

    def _hold(self, index: int, after: bool = False) -> None:
        """Launches here wait while this node is fenced or behind the log's head: entries past `index` may move the
        job (requeued once this node was declared lost, started elsewhere). After the head entry, the held ones the
        engine still places here start (`MeshReplica.release_held`); at the head nothing waits."""
        release = getattr(self.replica, "release_held", None)  # (a benchmark's double runs no processes)
        if release is not None:
            self.replica.holding = behind = self.fenced_at is not None or index < self.head or self.lagged
            if after and not behind:
                release()

    async def _relist(self) -> None:
        """After a fence: the log's head from a listing; what was held starts once this node has applied it."""
        await self._retry(self._catch_up)
        self._hold(self.position, after=True)

    def _apply_one(self, index: int, text: str) -> None:
        try:
            entry = Entry.from_json(text)
        except LogError as exc:
            LOG.error("mesh: log entry %d skipped: %s", index, exc)
            self.position = index
            return
        node, _, seq = entry.proposal.rpartition("/")
        self._local.seen(f"proposals/{entry.proposal}")
        if seq and seq <= self._last_seq.get(node, ""):
            self.position = index  # a second copy of a proposal (appended again after a failover)
            return
        if seq:
            self._last_seq[node] = seq
        self.position = index
        if isinstance(entry.event, ev.NodeJoined) and entry.event.node.address:
            self.addresses[entry.event.node.name] = entry.event.node.address
        trace("apply", entry.proposal, str(index))
        self.replica.apply_entry(entry, index, act=index > self.durable)
        self.durable = max(self.durable, index)
        trace("applied", entry.proposal, str(index))

    # ---------------------------------------------------------------- snapshots (leader only)

    def _snapshot_due(self) -> bool:
        entries, size = self.config.snapshot_entries, self.config.snapshot_bytes
        return not self._snapshot_off and (0 < entries <= self._since_snapshot[0] or 0 < size <= self._since_snapshot[1])

    def _take_snapshot(self, term: int) -> None:
        """The engine as it stands after entry `position` (taken now, between two entries), then written and the
        log compacted in the background."""
        try:
            snap = with_model(self.replica.snapshot(self.position, self._last_seq, self.addresses), self.replica)
        except ValueError as exc:  # SnapshotError: a stack that cannot be snapshotted keeps the full log
            self._snapshot_off = True
            LOG.warning("mesh: no snapshots: %s", exc)
            return
        self._since_snapshot = [0, 0]
        self._spawn(self._store_snapshot(term, snap, self.snapshot_index))

    async def _store_snapshot(self, term: int, snap: Snapshot, previous: int) -> None:
        """Write the snapshot, fenced by `term`; then delete the log up to the previous snapshot and the snapshots
        older than it (`eventlog.compactable`'s rule: a node that cannot read the newest falls back to the
        previous one and still finds every entry after it)."""
        try:
            parts, head = split_snapshot(snap)
            for key, text in parts.items():
                await self.coord.put(key, text, term=term)
            revision = await self.coord.put(snapshot_key(snap.index), head, term=term)
            self.snapshots_written += 1  # only a written one is the next one's `previous`
            self.snapshot_index = max(self.snapshot_index, snap.index)
            if previous > 0:
                dropped = await self.coord.delete_range(log_key(0), log_key(previous + 1), term=term)
                await self.coord.delete_range(snapshot_key(0), snapshot_key(previous), term=term)
                await self.coord.delete_range(part_key(0, 0), part_key(previous, 0), term=term)
                LOG.info("mesh: snapshot at entry %d written; %d log entries up to %d compacted", snap.index,
                         dropped, previous)
            await self.coord.compact(revision)  # etcd's history up to this snapshot: what the deletes freed
            self.history_compacted = revision  # (defragment, an admin step, hands the space back to the disk)
        except CoordinatorError as exc:  # StaleTerm included: the next leader writes the next one
            LOG.warning("mesh: writing the snapshot at entry %d: %s", snap.index, exc)
            entries, size = self.config.snapshot_entries, self.config.snapshot_bytes  # (a busy etcd timed out):
            self._since_snapshot = [max(self._since_snapshot[0], entries - entries // 10),  # tried again a tenth
                                    max(self._since_snapshot[1], size - size // 10)]  # of an interval later

    # ---------------------------------------------------------------- proposals

    def propose(self, event: ev.Event, run: int | None = None, record: dict | None = None) -> None:
        """Hand `event` to the leader (it waits in the outbox while there is no leader or no etcd). The outbox is
        written to its file before this returns (before the caller answers): a restarted meshd proposes again
        what it held, under the same key, and the log applies a proposal once (`_last_seq`)."""
        seq = f"{time.time_ns():020d}{next(self._seq) % 1000:03d}"  # grows across restarts of this node
        key, value = f"proposals/{self.node}/{seq}", Entry(event, self.node, run=run, record=record).to_json()
        if not isinstance(event, LEADER_ONLY):  # a next leader decides those again; stale later, never replayed
            self._outbox_file.write({"key": key, "value": value})
        trace("propose", key, event=event)
        self._outbox.append((key, value))
        self._wake.set()

    def _open_outbox(self) -> None:
        """Take back the proposals a previous meshd left in the outbox file, in their order."""
        pending = self._outbox_file.take_back()
        self._outbox.extend(pending.items())
        if pending:
            self._wake.set()
            LOG.info("mesh: %d proposal(s) from the outbox of the last meshd proposed again", len(pending))
        self._outbox_file.rewrite(self._outbox)

    async def _flush(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._outbox:
                key, value = self._outbox[0]
                try:
                    if await self._local.hand(key, value):  # (this node leads: appended without a put)
                        trace("handed", key)
                    else:
                        self._local.unseen = key  # (set first: a put that fails may have reached etcd)
                        await self.coord.put(key, value)
                        trace("put", key)
                except CoordinatorError as exc:
                    self._say_once(f"proposing: {exc}")
                    await asyncio.sleep(self.config.loop_wait)
                    continue
                self._outbox.popleft()
                if self._outbox:
                    self._outbox_file.write({"done": key})
                else:
                    self._outbox_file.rewrite(self._outbox)

    # ---------------------------------------------------------------- fencing

    async def _prove_alive(self) -> None:
        """Read the members every loop round; one that lists this node proves its entry was there when the read
        was sent. The leader counts a node missing only once its entry is gone, and declares it lost node_grace
        (> ttl) later: so the node is lost no earlier than node_grace after the newest such read."""
        while True:
            await self._seen()
            await asyncio.sleep(self.probe_interval)

    async def _seen(self) -> None:
        """One read of the members: where it lists this node, it proves the entry was there when it was sent."""
        sent = time.monotonic()
        try:
            if any(m.name == self.node for m in await self.coord.members()):
                self._alive_at = max(self._alive_at, sent)
        except CoordinatorError:
            pass

    async def _fence_watch(self) -> None:
        """Fence: once no read has shown this node alive for `ttl - retry_timeout` seconds (the leader key's rule:
        a keepalive round may fail once), stop this node's ranks; the leader cannot declare it lost before
        node_grace has passed since that read. Its jobs then follow the log: started again where the log says.
        Before it fences, one more read (at most retry_timeout / 2): a loop held busy past the limit (a long
        replay, a loaded machine) has a stale proof, not necessarily a missing entry."""
        limit = self.config.ttl - self.config.retry_timeout
        fence, unfence = getattr(self.replica, "fence", None), getattr(self.replica, "unfence", None)
        if fence is None or unfence is None:
            return  # a replica without processes (a benchmark's double): nothing to stop
        while True:
            await asyncio.sleep(min(0.25, limit / 4))
            quiet = time.monotonic() - self._alive_at
            if quiet > limit and self.fenced_at is None:  # a loop held busy (a replay, a loaded machine) has not
                with contextlib.suppress(asyncio.TimeoutError):  # read for a while: a read now may show the entry
                    await asyncio.wait_for(self._seen(), self.config.retry_timeout / 2)
                quiet = time.monotonic() - self._alive_at
            if quiet > limit:
                if self.fenced_at is None:
                    self.fenced_at, self.fences, self.head = time.time(), self.fences + 1, float("inf")
                    LOG.error("mesh: etcd has not seen this node for %.1f s: fencing (stopping its jobs; the leader "
                              "may declare it lost in %.0f s)", quiet, self.node_grace - quiet)
                fence(self.node_grace - quiet)  # again each round: a launch that came late stops too
            elif self.fenced_at is not None:
                LOG.warning("mesh: etcd sees this node again after %.1f s fenced; following the log",
                            time.time() - self.fenced_at)
                self.fenced_at = None
                unfence()
                self._spawn(self._relist())

    # ---------------------------------------------------------------- leadership

    async def _lead(self) -> None:
        while True:
            term = await self.coord.acquire_leadership()
            if term is None:
                who = await self._leader_name()
                self.leader = who
                await self.coord.wait_leader_change(self.config.loop_wait)
                continue
            self.term, self.leader = term, self.node
            self.leaderships += 1
            self.first_decision, self.led_since = None, time.time()
            LOG.info("mesh: %s leads (term %d)", self.node, term)
            self.replica.leadership_changed(self.leader)
            sequencer = self._spawn(self._sequence(term))
            watcher = self._spawn(self._watch_members(term))
            try:
                while self.coord.term == term and not sequencer.done():
                    await asyncio.sleep(min(1.0, self.config.loop_wait))
                    if await self.coord.renew_leadership() != term:
                        break
            finally:
                sequencer.cancel()
                watcher.cancel()
                self._disarm()
                self.term, self.leader = None, None
                LOG.warning("mesh: %s no longer leads (term %d)", self.node, term)
                self.replica.leadership_changed(self.leader)

    async def _leader_name(self) -> str | None:
        try:
            who = await self.coord.leader()
        except CoordinatorError:
            return None
        return None if who is None else who.name

    async def _sequence(self, term: int) -> None:
        """Copy proposals into the log, in order, in batches: one etcd transaction per batch, fenced by `term`."""
        try:
            listing = await self.coord.list("log/")
            following = max((index_of(k) for k in listing.items), default=self.snapshot_index)
            while self.position < following:  # apply what the last leader wrote before deciding anything
                await asyncio.sleep(0.01)
            self.rearm()
            while True:  # a listing of the proposals, then their watch; listed again if etcd compacted past it
                following = await self._sequence_listed(term, following)
        except StaleTerm as exc:
            LOG.warning("mesh: %s", exc)
        except CoordinatorError as exc:
            LOG.warning("mesh: sequencing stopped: %s", exc)

    async def _sequence_listed(self, term: int, following: int) -> int:
        """The proposals listed, then watched (a feeder queues them as they come, while a batch is written):
        every batch takes what is queued. Returns the log's end when the watch was compacted past."""
        props = await self.coord.list("proposals/")
        queue: asyncio.Queue = asyncio.Queue()
        for key in sorted(props.items):
            queue.put_nowait((key, props.items[key]))
        feeder = self._spawn(self._feed(queue, props.revision))
        self._local.open(queue)  # after the listing: a proposal this node put before is queued ahead of its next
        try:
            while True:
                batch, error = await take_batch(queue)
                if batch:
                    following = await self._append(term, following, batch)
                if isinstance(error, WatchCompacted):
                    LOG.info("mesh: %s: listing the proposals again", error)
                    return following
                if error is not None:
                    raise error
        finally:
            self._local.close()
            feeder.cancel()

    async def _feed(self, queue: asyncio.Queue, revision: int) -> None:
        try:
            async for change in self.coord.watch("proposals/", since=revision):
                if change.kind is ChangeKind.PUT:
                    trace("heard", change.key)
                    queue.put_nowait((change.key, change.value))
            queue.put_nowait(CoordinatorError("the proposals' watch ended (the coordinator closed)"))
        except Exception as exc:  # noqa: BLE001 - handed to the sequencer, which raises it (it must not wait on)
            queue.put_nowait(exc)

    async def _append(self, term: int, last: int, batch: list[tuple[str, str]]) -> int:
        """The batch's entries at last+1, ... and their proposals' deletes in ONE transaction fenced by `term`:
        an entry and its proposal's delete commit together, so a failover mid-batch neither loses nor doubles
        one (the next leader finds exactly the proposals not yet in the log)."""
        puts, deletes = log_entries(batch, last)
        await self.coord.append(term, puts, deletes)
        self._local.committed(key for key, _ in batch)
        trace("appended", *deletes)
        if puts and self.first_decision is None:
            self.first_decision = time.time()
        return last + len(puts)

    async def _watch_members(self, term: int) -> None:
        """Declare a node lost once its member entry has been gone for node_grace seconds."""
        missing: dict[str, float] = {}
        while True:
            await asyncio.sleep(min(1.0, self.config.loop_wait))
            try:
                present = {m.name for m in await self.coord.members()}
            except CoordinatorError:
                continue
            now = time.monotonic()
            for name, node in self.ctx.nodes().items():
                if not node.alive or name in present:
                    missing.pop(name, None)
                    continue
                since = missing.setdefault(name, now)
                if now - since >= self.node_grace:
                    LOG.warning("mesh: node %s gone for %.0f s: lost", name, now - since)
                    self.propose(ev.NodeLost(f"lost-{name}-{int(time.time())}", name))
                    missing[name] = now + 3600  # once; it is no longer alive when the entry applies

    # ---------------------------------------------------------------- the engine's timer (leader only)

    def timer_set(self, action) -> None:
        self._timer_action = action
        self.rearm()

    def rearm(self) -> None:
        self._disarm()
        action = self._timer_action
        if action is None or self.term is None:
            return
        delay = max(0.0, action.at - time.time())
        self._timer = asyncio.get_running_loop().call_later(
            delay, lambda: self.propose(ev.Tick(f"tick-{self.node}-{action.key}", action.key)))

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def view(self) -> dict:
        return {"backend": self.config.backend, "leader": self.leader, "term": self.term, "synced": self.synced,
                "log_position": self.position, "outbox": len(self._outbox), "leaderships": self.leaderships,
                "led_since": self.led_since, "first_decision": self.first_decision,
                "snapshot_index": self.snapshot_index, "snapshots_written": self.snapshots_written,
                "history_compacted": self.history_compacted,
                "fenced_at": self.fenced_at, "fences": self.fences}

