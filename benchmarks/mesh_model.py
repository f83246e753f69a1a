"""A model of a mesh of `--servers` servers where the node side is light: figures for 1,000 servers on one machine.

ONE real leader: daemon.mesh.MeshLink (its proposal sequencing, batched log appends fenced by term, its own log
following, member watch and snapshots every snapshot_entries / snapshot_bytes with compaction) over the real etcd client
(daemon.etcd.EtcdCoordinator) and a real etcd the benchmark starts in a temp dir; the engine is the real one (FIFO
stack, tests/support/workload.engine). Only meshd's replica is a double (`ModelReplica`: it applies each entry to the
engine, keeps the record payloads the submits carry and builds the same Snapshot as daemon.mesh_node.MeshReplica,
with no journal, launcher or processes).

The servers are fake nodes in this process (`Fleet`): each has its own lease and member entry in etcd (renewed
every loop_wait), joins with a NodeJoined proposal, submits jobs (`NODE.SEQ` ids, each submit entry carrying a
job record), and, for the jobs the log places on it, proposes JobStarted, one IterationReport per REPORT_GAP
(meshd's ReportGate) and JobFinished, each as `proposals/{node}/{seq}` in order per node, as MeshLink.propose
writes them. What the model leaves out: each node's own engine replaying the log (the leader's applies stand for
all of them: the actions it gives route to the fake nodes) and 1,000 log/leader watch streams (etcd fans each
entry out to every watcher; here one watches).

Measured over the job phase (after every server joined): the leader's decision latency (a proposal's arrival on
its watch to its log entry written), propose-to-applied (a node's put to the entry applied at the leader), etcd
writes (counted per client call and as etcd's own committed raft proposals) per job and per second, log bytes per
job and per entry kind, the snapshots written, the final snapshot's size and time (encode + write), a new node's
catch-up (start to synced at the leader's position, from the newest snapshot and the log after it), etcd's db size
before and after a compaction + defragment (etcd is started without auto-compaction, as etcd_local does; the
leader compacts its history after each snapshot), and the append transactions (entries per one).

    .venv/bin/python benchmarks/mesh_model.py --servers 1000 --gpus-per-server 8 --jobs 2000 --json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import random
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshsched.daemon.config import CoordinatorConfig
from meshsched.daemon.coordinator import ChangeKind, Member
from meshsched.daemon.etcd import EtcdCoordinator, Gateway
from meshsched.daemon.eventlog import Entry, Snapshot, snapshot_key, split_snapshot
from meshsched.daemon.journal import JobRecord
from meshsched.daemon.mesh import LinkContext, MeshLink
from meshsched.daemon.mesh_node import REPORT_GAP, record_payload

from meshsched import events as ev
from meshsched import snapshot
from meshsched.actions import Launch, ScheduleTimer
from meshsched.state import JobSpec, NodeSpec
from tests.support.workload import MODELS
from tests.support.workload import engine as make_engine

PROPOSAL = re.compile(r'"p":"([^"]*)"}$')
KINDS = {"JobSubmitted": "submit", "JobStarted": "start", "IterationReport": "report", "JobFinished": "finish",
         "NodeJoined": "join"}


class Stats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls: Counter = Counter()  # etcd write calls by kind (put:proposals, txn:log, compact, ...)
        self.log_bytes: Counter = Counter()  # log entry bytes by event kind
        self.log_entries: Counter = Counter()
        self.arrived: dict[str, float] = {}  # proposal -> when the leader's watch saw it
        self.put_at: dict[str, float] = {}  # proposal -> when its node put it
        self.decision: list[float] = []
        self.to_applied: list[float] = []
        self.snapshot_bytes: list[int] = []
        self.apply: list[float] = []  # the leader's engine.handle per entry
        self.batch: list[int] = []  # log entries per append transaction


class TimedCoordinator(EtcdCoordinator):
    """The real etcd client, counting its writes and timing the leader's proposal-to-log path."""

    def __init__(self, config: CoordinatorConfig, name: str, stats: Stats) -> None:
        super().__init__(config, name)
        self.stats = stats

    async def put(self, key: str, value: str, term: int | None = None) -> int:
        revision = await super().put(key, value, term)
        if term is None:  # (a fenced put is one transaction: `append` counts it)
            self._count(key, value, "put")
        return revision

    async def append(self, term: int, puts: list[tuple[str, str]], deletes: list[str]) -> int:
        revision = await super().append(term, puts, deletes)
        if len(puts) == 1 and not deletes:
            self._count(*puts[0], "put")
            return revision
        self.stats.calls[f"txn:{(puts[0][0] if puts else deletes[0]).split('/', 1)[0]}"] += 1
        self.stats.batch.append(len(puts))
        for key, value in puts:
            self._count(key, value, None)
        return revision

    def _count(self, key: str, value: str, call: str | None) -> None:
        family = key.split("/", 1)[0]
        if call:
            self.stats.calls[f"{call}:{family}"] += 1
        if family == "log":
            found = PROPOSAL.search(value)
            if found:
                t0 = self.stats.arrived.pop(found.group(1), None)
                if t0 is not None:
                    self.stats.decision.append(time.perf_counter() - t0)
                start = value.find('"type":"') + 8
                kind = KINDS.get(value[start:value.find('"', start)], "other")
                self.stats.log_bytes[kind] += len(value)
                self.stats.log_entries[kind] += 1
        elif family in ("snapshots", "snapshot-parts"):
            self.stats.snapshot_bytes.append(len(value))

    async def compact(self, revision: int) -> None:
        self.stats.calls["compact"] += 1
        await super().compact(revision)

    async def delete(self, key: str, term: int | None = None) -> bool:
        self.stats.calls[f"delete:{key.split('/', 1)[0]}"] += 1
        return await super().delete(key, term)

    async def delete_range(self, start: str, end: str, term: int | None = None) -> int:
        self.stats.calls[f"delete_range:{start.split('/', 1)[0]}"] += 1
        return await super().delete_range(start, end, term)

    async def watch(self, prefix: str = "", since: int | None = None):
        async for change in super().watch(prefix, since):
            if prefix == "proposals/" and change.kind is ChangeKind.PUT:
                self.stats.arrived[change.key.removeprefix("proposals/")] = time.perf_counter()
            yield change


class ModelReplica:
    """meshd's MeshReplica without a journal, launcher or processes: the engine, the records, the Snapshot."""

    def __init__(self, stats: Stats, on_actions=None) -> None:
        self.engine = make_engine("fifo")
        self.records: dict[str, dict] = {}
        self.stats = stats
        self.on_actions = on_actions
        self.snapshot_s: list[float] = []

    def apply_entry(self, entry: Entry, index: int, act: bool) -> None:
        if isinstance(entry.event, ev.JobSubmitted) and entry.record is not None:
            self.records[entry.event.spec.job_id] = entry.record
        t0 = time.perf_counter()
        actions = self.engine.handle(entry.event, entry.time)
        self.stats.apply.append(time.perf_counter() - t0)
        t0 = self.stats.put_at.pop(entry.proposal, None) if self.on_actions else None
        if t0 is not None:
            self.stats.to_applied.append(time.perf_counter() - t0)
        if act and self.on_actions is not None:
            self.on_actions(entry, actions)

    def synced(self) -> None:
        pass

    def leadership_changed(self, leader: str | None) -> None:
        pass

    def snapshot(self, index: int, last_seq: dict, addresses: dict) -> Snapshot:
        t0 = time.perf_counter()
        records = {j: self.records[j] for j in self.engine.state.jobs if j in self.records}
        snap = Snapshot(index, snapshot.encode(self.engine), records, dict(last_seq), dict(addresses), {})
        self.snapshot_s.append(time.perf_counter() - t0)
        return snap

    def load_snapshot(self, snap: Snapshot, durable: int) -> None:
        snapshot.decode(snap.engine, self.engine)
        self.records.update(snap.records)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Fleet:
    """The fake servers: leases, member entries, and the proposals a node writes, in order per node."""

    def __init__(self, config: CoordinatorConfig, stats: Stats, servers: int, gpus: int, seed: int) -> None:
        self.config, self.stats, self.gpus = config, stats, gpus
        self.names = [f"s{i:04d}" for i in range(servers)]
        self.rng = random.Random(seed)
        self.coords = [TimedCoordinator(config, f"fleet{k}", stats) for k in range(4)]
        self.gateway = Gateway(config.endpoints, config.retry_timeout, idle=config.ttl)
        self.leases: list[int] = []
        self.locks = {n: asyncio.Lock() for n in self.names}
        self.seqs = {n: 0 for n in self.names}
        self.tasks: set[asyncio.Task] = set()
        self.keepalives = 0
        self.done: set[str] = set()
        self.durations: dict[str, float] = {}
        self.submitted = 0

    async def start(self) -> None:
        for c in self.coords:
            await c.start()
        await self.gateway.open()
        sem = asyncio.Semaphore(32)

        async def join(name: str) -> None:
            async with sem:
                lease = int((await self.gateway.call("/v3/lease/grant", {"TTL": str(self.config.ttl)}))["ID"])
                self.leases.append(lease)
                member = Member(name, name, tuple(f"{name}-gpu{g}" for g in range(self.gpus)))
                await self.gateway.call("/v3/kv/put", {"key": _b64(f"{self.config.prefix}/members/{name}"),
                                                       "value": _b64(member.to_json()), "lease": str(lease)})
                await self.propose(name, ev.NodeJoined(f"join-{name}", NodeSpec(name, self.gpus, "v100", 16384,
                                                                                 address=name)))
        await asyncio.gather(*(join(n) for n in self.names))
        self.spawn(self._keep_alive())

    def spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _keep_alive(self) -> None:
        sem = asyncio.Semaphore(32)

        async def one(lease: int) -> None:
            async with sem:
                await self.gateway.call("/v3/lease/keepalive", {"ID": str(lease)})
                self.keepalives += 1
        while True:
            await asyncio.sleep(self.config.loop_wait)
            await asyncio.gather(*(one(lease) for lease in list(self.leases)))

    async def propose(self, node: str, event: ev.Event, run: int | None = None, record: dict | None = None) -> None:
        """As MeshLink.propose + _flush: `proposals/{node}/{seq}`, one at a time per node (seq grows)."""
        async with self.locks[node]:
            seq = f"{time.time_ns():020d}{self.seqs[node] % 1000:03d}"
            self.seqs[node] += 1
            proposal = f"{node}/{seq}"
            self.stats.put_at[proposal] = time.perf_counter()
            await self.coords[hash(node) % len(self.coords)].put(
                f"proposals/{proposal}", Entry(event, node, run=run, record=record).to_json())

    async def submit(self, i: int, duration: tuple[float, float]) -> None:
        node = self.rng.choice(self.names)
        gpus = self.rng.choice((1, 1, 2, 4, 8))
        job_id = f"{node}.{i}"
        spec = JobSpec(job_id, gpus, self.rng.choice(MODELS), 32 * gpus, 1000, submit_time=time.time(),
                       user=self.rng.choice(("ann", "bob", "cho")))
        rec = JobRecord(job_id, i, gpus, spec.model, spec.batch_size, spec.iterations, spec.submit_time, "train",
                        spec.user, None, False, ["python", "train.py", "--epochs", "90"], "/home/ann/proj",
                        {"PATH": "/usr/bin:/bin", "WANDB_PROJECT": "model"}, f"/var/lib/meshd/jobs/{job_id}")
        self.durations[job_id] = self.rng.uniform(*duration)
        self.submitted += 1
        await self.propose(node, ev.JobSubmitted(f"submit-{job_id}", spec), record=record_payload(rec))

    def on_actions(self, engine, entry: Entry, actions: list) -> None:
        if isinstance(entry.event, ev.JobFinished):
            self.done.add(entry.event.job_id)
        for a in actions:
            if isinstance(a, Launch):
                node = engine.state.gpus[a.gpus[0]].node
                self.spawn(self._run(node, a.job_id, a.restart, self.durations.get(a.job_id, 5.0)))

    async def _run(self, node: str, job_id: str, run: int, duration: float) -> None:
        await asyncio.sleep(0.2)  # the supervisor starts the ranks
        await self.propose(node, ev.JobStarted(f"start-{job_id}-{run}", job_id), run=run)
        t0, n = time.monotonic(), 0
        while time.monotonic() - t0 + REPORT_GAP < duration:
            await asyncio.sleep(REPORT_GAP)
            n += 1
            await self.propose(node, ev.IterationReport(f"rep-{job_id}-{run}-{n}", job_id, 10.0 * n, 0.1), run=run)
        await asyncio.sleep(max(0.0, duration - (time.monotonic() - t0)))
        await self.propose(node, ev.JobFinished(f"fin-{job_id}-{run}", job_id), run=run)

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for c in self.coords:
            await c.close(release=True)
        await self.gateway.close()


def etcd_metrics(url: str) -> dict:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for name in ("etcd_server_proposals_committed_total", "etcd_mvcc_db_total_size_in_bytes",
                 "etcd_mvcc_db_total_size_in_use_in_bytes", "etcd_debugging_mvcc_keys_total"):
        found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
        out[name] = float(found.group(1)) if found else None
    return out


def etcd_post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read() or b"{}")


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 2)


async def wait_for(check, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(step)
    return check()


async def model(url: str, args: argparse.Namespace) -> dict:
    config = CoordinatorConfig("etcd", (url,), ttl=args.ttl, loop_wait=args.loop_wait,
                               retry_timeout=args.retry_timeout, snapshot_entries=args.snapshot_entries)
    stats = Stats()
    fleet = Fleet(config, stats, args.servers, args.gpus_per_server, args.seed)
    replica = ModelReplica(stats)
    lcoord = TimedCoordinator(config, "leader", stats)
    leader = MeshLink(LinkContext("leader", "leader", (), 0, lambda: replica.engine.state.nodes, {}), replica,
                      lcoord, config, node_grace=args.ttl * 2)

    def act(entry: Entry, actions: list) -> None:
        for a in actions:
            if isinstance(a, ScheduleTimer):
                leader.timer_set(a)
        fleet.on_actions(replica.engine, entry, actions)
    replica.on_actions = act
    leader.start()
    if not await wait_for(lambda: leader.term is not None, 30):
        raise RuntimeError("the leader did not take the leader key in 30 s")
    t0 = time.perf_counter()
    await fleet.start()
    if not await wait_for(lambda: len(replica.engine.state.nodes) >= args.servers, 600):
        raise RuntimeError("not every server joined in 600 s")
    join_s = time.perf_counter() - t0
    join_calls = sum(stats.calls.values())
    stats.reset()
    before = etcd_metrics(url)
    keepalives0, cpu0 = fleet.keepalives, time.process_time()

    t0 = time.perf_counter()
    rng = random.Random(args.seed + 1)
    for i in range(args.jobs):
        fleet.spawn(fleet.submit(i, (args.job_min, args.job_max)))
        await asyncio.sleep(rng.expovariate(args.rate))
    submit_s = time.perf_counter() - t0
    finished = await wait_for(lambda: len(fleet.done) >= args.jobs, args.drain, 0.2)
    run_s = time.perf_counter() - t0
    await wait_for(lambda: not stats.arrived, 10)
    after = etcd_metrics(url)
    cpu_s = time.process_time() - cpu0

    jstats = Stats()
    jrep = ModelReplica(jstats)
    joiner = MeshLink(LinkContext("joiner", "joiner", (), 0, lambda: jrep.engine.state.nodes, {}), jrep,
                      TimedCoordinator(config, "joiner", jstats), config, node_grace=args.ttl * 2)
    target = leader.position
    t1 = time.perf_counter()
    joiner.start()
    caught = await wait_for(lambda: joiner.synced and joiner.position >= target, 300, 0.01)
    catch_up = {"s": round(time.perf_counter() - t1, 3), "caught_up": caught, "from_snapshot": joiner.snapshot_index,
                "tail_entries": target - joiner.snapshot_index, "log_position": target,
                "same_state": snapshot.encode(jrep.engine) == snapshot.encode(replica.engine)}
    await joiner.close()

    t1 = time.perf_counter()
    snap = replica.snapshot(leader.position, {}, dict(leader.addresses))
    parts, head = split_snapshot(snap)
    encode_s = time.perf_counter() - t1
    for key, text in parts.items():
        await lcoord.put(key, text, term=leader.term)
    revision = await lcoord.put(snapshot_key(snap.index), head, term=leader.term)
    final_snapshot = {"index": snap.index, "bytes": len(head) + sum(len(t) for t in parts.values()),
                      "parts": len(parts), "encode_s": round(encode_s, 3),
                      "encode_and_write_s": round(time.perf_counter() - t1, 3)}

    await fleet.close()
    await leader.close()
    db_before = etcd_metrics(url)
    etcd_post(url, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    etcd_post(url, "/v3/maintenance/defragment", {})
    db_after = etcd_metrics(url)

    n = max(1, len(fleet.done))
    writes = sum(stats.calls.values())
    raft = after["etcd_server_proposals_committed_total"] - before["etcd_server_proposals_committed_total"]
    log_bytes, log_entries = sum(stats.log_bytes.values()), sum(stats.log_entries.values())
    return {
        "servers": args.servers, "gpus_per_server": args.gpus_per_server, "jobs": args.jobs,
        "jobs_finished": len(fleet.done), "all_finished": finished, "rate_jobs_per_s": args.rate,
        "job_s": [args.job_min, args.job_max], "report_gap_s": REPORT_GAP, "snapshot_entries": args.snapshot_entries,
        "ttl": args.ttl, "loop_wait": args.loop_wait, "join_phase_s": round(join_s, 2), "join_phase_writes": join_calls,
        "submit_phase_s": round(submit_s, 2), "run_s": round(run_s, 2), "log_entries": log_entries,
        "log_entries_per_s": round(log_entries / run_s, 1),
        "append_txns": len(stats.batch), "entries_per_txn": {"mean": round(sum(stats.batch) / max(1, len(stats.batch)),
                                                                           2), "max": max(stats.batch, default=0)},
        "decision_ms": {"n": len(stats.decision), "p50": pct(stats.decision, 0.5), "p99": pct(stats.decision, 0.99),
                        "max": pct(stats.decision, 1.0)},
        "propose_to_applied_ms": {"n": len(stats.to_applied), "p50": pct(stats.to_applied, 0.5),
                                  "p99": pct(stats.to_applied, 0.99)},
        "engine_apply_ms": {"p50": pct(stats.apply, 0.5), "p99": pct(stats.apply, 0.99),
                            "mean": round(1000 * sum(stats.apply) / max(1, len(stats.apply)), 2)},
        "process_cpu_share": round(cpu_s / run_s, 2),
        "etcd_write_calls": dict(stats.calls), "etcd_write_calls_per_job": round(writes / n, 2),
        "etcd_write_calls_per_s": round(writes / run_s, 1), "etcd_raft_proposals": int(raft),
        "etcd_raft_proposals_per_job": round(raft / n, 2), "etcd_raft_proposals_per_s": round(raft / run_s, 1),
        "lease_keepalives_per_s": round((fleet.keepalives - keepalives0) / run_s, 1),
        "log_bytes": log_bytes, "log_bytes_per_job": round(log_bytes / n),
        "log_bytes_per_entry": {k: round(stats.log_bytes[k] / stats.log_entries[k]) for k in stats.log_entries},
        "log_entries_by_kind": dict(stats.log_entries),
        "snapshots_written": leader.snapshots_written, "snapshot_encode_s_max": round(max(replica.snapshot_s), 3)
        if replica.snapshot_s else None, "snapshot_value_bytes_max": max(stats.snapshot_bytes, default=0),
        "final_snapshot": final_snapshot, "engine_jobs_in_state": len(replica.engine.state.jobs),
        "catch_up": catch_up,
        "etcd_db_bytes": int(db_before["etcd_mvcc_db_total_size_in_bytes"]),
        "etcd_db_in_use_bytes": int(db_before["etcd_mvcc_db_total_size_in_use_in_bytes"]),
        "etcd_db_bytes_after_compact_defrag": int(db_after["etcd_mvcc_db_total_size_in_bytes"]),
        "etcd_keys": int(db_before["etcd_debugging_mvcc_keys_total"] or 0),
    }


def run(args: argparse.Namespace) -> dict:
    from meshsched.daemon.etcd_local import start_etcd

    root = Path(tempfile.mkdtemp(prefix="meshmodel"))
    server = start_etcd(root)
    try:
        return asyncio.run(model(server.url, args))
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def table(r: dict) -> str:
    d, p = r["decision_ms"], r["propose_to_applied_ms"]
    rows = [
        ("servers x GPUs", f"{r['servers']} x {r['gpus_per_server']}"),
        ("jobs finished", f"{r['jobs_finished']} / {r['jobs']} in {r['run_s']} s ({r['rate_jobs_per_s']} jobs/s)"),
        ("log entries", f"{r['log_entries']} ({r['log_entries_per_s']} /s) {r['log_entries_by_kind']}"),
        ("appends", f"{r['append_txns']} transactions, entries per one {r['entries_per_txn']}"),
        ("leader decision p50 / p99", f"{d['p50']} / {d['p99']} ms (n={d['n']})"),
        ("propose-to-applied p50 / p99", f"{p['p50']} / {p['p99']} ms"),
        ("leader engine apply p50 / p99", (f"{r['engine_apply_ms']['p50']} / {r['engine_apply_ms']['p99']} ms "
                                          f"(this process busy {r['process_cpu_share']:.0%} of the run)")),
        ("etcd write calls", f"{r['etcd_write_calls_per_job']} /job, {r['etcd_write_calls_per_s']} /s"),
        ("etcd raft proposals", (f"{r['etcd_raft_proposals_per_job']} /job, {r['etcd_raft_proposals_per_s']} /s "
                                f"(+ {r['lease_keepalives_per_s']} keepalives/s)")),
        ("log bytes", f"{r['log_bytes_per_job']} /job; per entry {r['log_bytes_per_entry']}"),
        ("snapshots during run", f"{r['snapshots_written']} (encode max {r['snapshot_encode_s_max']} s)"),
        ("final snapshot", (f"{r['final_snapshot']['bytes'] / 1e6:.2f} MB, encode {r['final_snapshot']['encode_s']} s,"
                           f" encode+write {r['final_snapshot']['encode_and_write_s']} s")),
        ("new node catch-up", (f"{r['catch_up']['s']} s (snapshot at {r['catch_up']['from_snapshot']}, "
                              f"{r['catch_up']['tail_entries']} entries of tail, same state: "
                              f"{r['catch_up']['same_state']})")),
        ("etcd db", (f"{r['etcd_db_bytes'] / 1e6:.1f} MB ({r['etcd_db_in_use_bytes'] / 1e6:.1f} MB in use); "
                    f"{r['etcd_db_bytes_after_compact_defrag'] / 1e6:.1f} MB after compact+defrag")),
    ]
    return "\n".join(f"{k:<30} {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--gpus-per-server", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=10.0, help="job submits per second (Poisson)")
    parser.add_argument("--job-min", type=float, default=5.0, help="shortest job, seconds")
    parser.add_argument("--job-max", type=float, default=30.0, help="longest job, seconds")
    parser.add_argument("--drain", type=float, default=300.0, help="seconds to wait for the jobs to finish")
    parser.add_argument("--snapshot-entries", type=int, default=1000)
    parser.add_argument("--ttl", type=int, default=30)
    parser.add_argument("--loop-wait", type=float, default=10.0)
    parser.add_argument("--retry-timeout", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    logging.getLogger("meshd").setLevel(logging.ERROR)  # a leader's stop at the end is not news
    if args.servers < 1 or args.jobs < 1 or args.rate <= 0 or args.job_min > args.job_max:
        parser.error("--servers and --jobs must be >= 1, --rate > 0, --job-min <= --job-max")
    try:
        result = run(args)
    except (RuntimeError, OSError) as exc:
        print(f"mesh_model: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text if args.json else table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
