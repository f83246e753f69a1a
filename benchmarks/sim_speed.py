"""Simulator speed: jobs and events replayed per second on the full Philly trace.

    python benchmarks/sim_speed.py [--policies sjf,srtf] [--jobs N] [--nodes 64] [--gpus-per-node 8]

Prints one line per policy: wall seconds, jobs/s, events/s (and the trace load time). Targets on a
2-core machine: the full trace (82,247 jobs) under SJF in < 20 s, under SRTF in < 60 s.
"""

from __future__ import annotations

import argparse
import time

from meshsched.perf import DEFAULT_GPU_TYPE, load_perf_model
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.sim.traces import TraceOptions, load_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="philly")
    ap.add_argument("--policies", default="sjf,srtf")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1, help="runs per policy; the best is reported")
    args = ap.parse_args()

    perf = load_perf_model()
    t0 = time.perf_counter()
    trace = load_trace(
        args.trace, perf, TraceOptions(DEFAULT_GPU_TYPE, args.gpus_per_node, seed=1, first_n=args.jobs)
    )
    print(f"trace {trace.name}: {len(trace.jobs)} jobs loaded in {time.perf_counter() - t0:.2f} s")
    cluster = ClusterSpec(args.nodes, args.gpus_per_node, DEFAULT_GPU_TYPE, perf.gpu_memory_mb(DEFAULT_GPU_TYPE))
    for name in args.policies.split(","):
        best = None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            r = simulate(trace.jobs, make_policy(name), perf, cluster)
            wall = time.perf_counter() - t0
            if best is None or wall < best[0]:
                best = (wall, r.events)
        wall, events = best
        print(
            f"{name:10s} {wall:7.1f} s  {len(trace.jobs) / wall:9.0f} jobs/s  {events / wall:9.0f} events/s"
            f"  ({events} events)"
        )


if __name__ == "__main__":
    main()
