"""Snapshot size and encode/decode time at 1,000 and 10,000 jobs, and a node's catch-up from a snapshot vs a full
replay of the log (meshsched.snapshot, daemon.eventlog.Snapshot).

The workload is tests/support/workload.py's (submits, starts, reports, checkpoints, pauses, exits, cancels, holds,
dependencies, a throttled array, time limits, a drain, a lost node). The snapshot is taken after 90% of the
events; catch-up is what a joining node's engine does: decode the snapshot's JSON and apply the 10% after it,
against applying every event from the first. Times are the engine's alone (etcd reads are not in them).

    .venv/bin/python benchmarks/mesh_snapshot.py --json [--jobs 1000 10000] [--policy fifo]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshsched.daemon.eventlog import Entry, Snapshot

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--policy", default="fifo")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
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
