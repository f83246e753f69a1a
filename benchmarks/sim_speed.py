"""Simulator speed: jobs and events replayed per second on the Philly trace (64 x 8 V100, seed 1).

    python benchmarks/sim_speed.py [--policies sjf,srtf,castor] [--load 2] [--jobs N] [--nodes 64] [--json]

Prints one line per policy: wall seconds, CPU seconds (the process's own; on a shared machine the wall time also
counts waiting for a core), jobs/s, events/s, and the mean JCT (so a speed-up that moved results shows).
Targets on a 2-core machine: the full trace (82,247 jobs) under SJF in < 20 s, under SRTF in < 60 s, under
Castor at load 2x in < 2 min (issue 9).
"""

from __future__ import annotations

import argparse
import json
import time

from meshsched.perf import DEFAULT_GPU_TYPE
from meshsched.loaders.profiles import load_perf_model
from meshsched.loaders.profiles import installed_handle
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.sim.metrics import summarise
from meshsched.loaders.traces import TraceOptions, load_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="philly")
    ap.add_argument("--policies", default="sjf,srtf")
    ap.add_argument("--load", type=float, default=1.0, help="arrival-rate multiplier (default 1)")
    ap.add_argument("--jobs", type=int, default=None, help="first N jobs only")
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1, help="runs per policy; the best is reported")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()

    perf = load_perf_model()
    t0 = time.perf_counter()
    trace = load_trace(args.trace, perf, TraceOptions(DEFAULT_GPU_TYPE, args.gpus_per_node, seed=1, first_n=args.jobs,
                                                       load=args.load))
    loaded = time.perf_counter() - t0
    if not args.json:
        print(f"trace {trace.name}: {len(trace.jobs)} jobs at load {args.load:g} loaded in {loaded:.2f} s")
    cluster = ClusterSpec(args.nodes, args.gpus_per_node, DEFAULT_GPU_TYPE, perf.gpu_memory_mb(DEFAULT_GPU_TYPE))
    rows = []
    if not args.json:
        print(f"{'policy':10s} {'wall s':>7s} {'CPU s':>7s} {'jobs/s':>7s} {'events/s':>8s} {'events':>8s} {'JCT mean h':>10s}")
    for name in args.policies.split(","):
        best = None
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            r = simulate(trace.jobs, make_policy(name, installed_handle()), perf, cluster)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if best is None or wall < best[0]:
                best = (wall, cpu, r)
        wall, cpu, r = best
        row = {"policy": name, "jobs": len(trace.jobs), "load": args.load, "wall_s": round(wall, 1),
               "cpu_s": round(cpu, 1), "jobs_per_s": round(len(trace.jobs) / wall), "events": r.events,
               "events_per_s": round(r.events / wall), "jct_mean_h": summarise(r, name).jct_mean_h}
        rows.append(row)
        if not args.json:
            print(f"{name:10s} {wall:7.1f} {cpu:7.1f} {row['jobs_per_s']:7d} {row['events_per_s']:8d} {r.events:8d} "
                  f"{row['jct_mean_h']:10.4f}", flush=True)
    if args.json:
        print(json.dumps({"trace": trace.name, "trace_load_s": round(loaded, 2), "results": rows}, indent=1))


if __name__ == "__main__":
    main()
