"""Snapshot size and encode/decode time at 1,000 and 10,000 jobs, and a node's catch-up from a snapshot vs a full
replay of the log (meshsched.snapshot, daemon.eventlog.Snapshot).

The workload is tests/support/workload.py's (submits, starts, reports, checkpoints, pauses, exits, cancels, holds,
dependencies, a throttled array, time limits, a drain, a lost node). The snapshot is taken after 90% of the
events; catch-up is what a joining node's engine does: decode the snapshot's JSON and apply the 10% after it,
against applying every event from the first. Times are the engine's alone (etcd reads are not in them).

`--etcd`: the same log written to a real etcd on loopback (`log/{index}` entries and the snapshot, as the mesh's
leader writes them), then a joining node's catch-up timed with the reads: list the snapshots, decode the newest,
list the log and apply the entries after it; against listing and applying the whole log; and once more after the
leader's compaction (the log up to the snapshot deleted). meshd's journal writes are not in these times.

    .venv/bin/python benchmarks/mesh_snapshot.py --json [--jobs 1000 10000] [--policy fifo] [--etcd]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshsched.daemon.eventlog import (
    Entry,
    Snapshot,
    index_of,
    join_snapshots,
    load_newest,
    log_key,
    snapshot_key,
    split_snapshot,
)

from meshsched import snapshot
from tests.support.workload import engine, record


def measure(policy: str, jobs: int, seed: int = 1) -> dict:
    run = record(policy, seed, jobs)
    fed = run.fed
    cut = len(fed) * 9 // 10
    t0 = time.perf_counter()
    full = engine(policy)
    for event, now in fed:
        full.handle(event, now)
    replay_s = time.perf_counter() - t0
    at_cut = engine(policy)
    for event, now in fed[:cut]:
        at_cut.handle(event, now)
    t0 = time.perf_counter()
    data = snapshot.encode(at_cut)
    text = Snapshot(cut, data, {}, {}, {}).to_json()
    encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    loaded = snapshot.decode(Snapshot.from_json(text).engine, engine(policy))
    decode_s = time.perf_counter() - t0
    for event, now in fed[cut:]:
        loaded.handle(event, now)
    catch_up_s = time.perf_counter() - t0
    assert snapshot.encode(loaded) == snapshot.encode(full)
    log_bytes = sum(len(Entry(e, "n0", now).to_json()) for e, now in fed)
    return {"policy": policy, "jobs": jobs, "log_entries": len(fed), "log_bytes": log_bytes, "snapshot_at": cut,
            "snapshot_bytes": len(text), "encode_s": round(encode_s, 4), "decode_s": round(decode_s, 4),
            "catch_up_from_snapshot_s": round(catch_up_s, 4), "catch_up_full_replay_s": round(replay_s, 4)}


async def _over_etcd(url: str, policy: str, jobs: int) -> dict:
    from meshsched.daemon.config import CoordinatorConfig
    from meshsched.daemon.etcd import EtcdCoordinator

    run = record(policy, 1, jobs)
    fed, coord = run.fed, EtcdCoordinator(CoordinatorConfig("etcd", (url,), ttl=30, loop_wait=5, retry_timeout=5), "b")
    await coord.start()
    cut = len(fed) * 9 // 10
    texts = [Entry(e, "n0", now).to_json() for e, now in fed]
    for start in range(0, len(texts), 64):
        await asyncio.gather(*(coord.put(log_key(i + 1), texts[i]) for i in range(start, min(start + 64, len(texts)))))
    at_cut = engine(policy)
    for event, now in fed[:cut]:
        at_cut.handle(event, now)
    parts, head = split_snapshot(Snapshot(cut, snapshot.encode(at_cut), {}, {}, {}))
    for key, text in parts.items():
        await coord.put(key, text)
    await coord.put(snapshot_key(cut), head)

    async def join(from_snapshot: bool) -> tuple[float, object]:
        t0 = time.perf_counter()
        eng, position = engine(policy), 0
        if from_snapshot:
            texts = join_snapshots((await coord.list("snapshots/")).items, (await coord.list("snapshot-parts/")).items)
            found = load_newest(texts,
                                lambda s: snapshot.decode(s.engine, engine(policy)), print)
            position, eng = found[0].index, found[1]
        items = (await coord.list("log/")).items
        for key in sorted(items, key=index_of):
            if index_of(key) > position:
                entry = Entry.from_json(items[key])
                eng.handle(entry.event, entry.time)
        return time.perf_counter() - t0, eng

    full_s, full = await join(False)
    snap_s, loaded = await join(True)
    await coord.delete_range(log_key(0), log_key(cut + 1))
    compacted_s, after = await join(True)
    assert snapshot.encode(loaded) == snapshot.encode(full) == snapshot.encode(after)
    await coord.close(release=True)
    return {"policy": policy, "jobs": jobs, "log_entries": len(fed), "snapshot_at": cut,
            "join_full_log_s": round(full_s, 3), "join_from_snapshot_s": round(snap_s, 3),
            "join_from_snapshot_compacted_s": round(compacted_s, 3)}


def measure_etcd(policy: str, jobs: list[int]) -> list[dict]:
    import shutil
    import tempfile

    from meshsched.daemon.etcd_local import start_etcd

    root = Path(tempfile.mkdtemp(prefix="snapbench"))
    rows = []
    for n in jobs:
        (root / str(n)).mkdir(parents=True)
        server = start_etcd(root / str(n))
        try:
            rows.append(asyncio.run(_over_etcd(server.url, policy, n)))
        finally:
            server.stop()
    shutil.rmtree(root, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--policy", default="fifo")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--etcd", action="store_true", help="a joining node's catch-up through a real etcd")
    args = parser.parse_args(argv)
    if args.etcd:
        rows = measure_etcd(args.policy, args.jobs)
        print(json.dumps(rows, indent=2))
        return 0
    rows = [measure(args.policy, n) for n in args.jobs]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for r in rows:
            print(f"{r['jobs']:>6} jobs: {r['log_entries']} entries ({r['log_bytes'] / 1e6:.1f} MB of log); snapshot "
                  f"{r['snapshot_bytes'] / 1e6:.2f} MB, encode {r['encode_s']:.3f} s, decode {r['decode_s']:.3f} s; "
                  f"catch-up {r['catch_up_from_snapshot_s']:.3f} s from it vs {r['catch_up_full_replay_s']:.3f} s "
                  f"replaying everything")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
