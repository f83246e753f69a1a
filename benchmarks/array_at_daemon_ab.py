"""A 300-task array's accept and cancel at meshd, before and after a change, in one run (issue 22 point 8).

    .venv/bin/python benchmarks/array_at_daemon_ab.py --before /tmp/base-shim [--repeat 9] [--json]

Starts two meshds on fake GPUs: one on another checkout (`--before`: a PYTHONPATH under which `meshsched`,
`meshsched.daemon` and `meshsched.cli` import from that checkout, e.g. a sitecustomize that points the editable
finder's MAPPING there) and one on this one; fills each with --jobs jobs (one holding every GPU, the rest queued
behind it: cli_speed.py's fill), then times them alternately, round after round, so that a drift in the machine's
speed hits both alike: `--array 0-(N-1)` POSTed with the body `mesh submit` sends (cli_speed.array_body: this
shell's whole environment exported) and its cancel, each from request sent to answer read on meshd's socket, and
the CPU time meshd spent on each (user + system, /proc/PID/stat). The first round warms up and is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from meshsched.cli.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cli_speed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="PYTHONPATH that makes meshsched import the other checkout")
    p.add_argument("--repeat", type=int, default=9, help="counted rounds (default 9)")
    p.add_argument("--jobs", type=int, default=300, help="jobs in each meshd before the rounds (default 300)")
    p.add_argument("--tasks", type=int, default=300, help="tasks of the array (default 300)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args()
    trees = {"before": dict(os.environ, PYTHONPATH=args.before), "after": dict(os.environ)}
    trees["after"].pop("PYTHONPATH", None)
    served: dict[str, tuple[subprocess.Popen, Client]] = {}
    times = {k: {"accept": [], "cancel": [], "accept_cpu": [], "cancel_cpu": []} for k in trees}
    with tempfile.TemporaryDirectory(prefix="mab", dir="/tmp") as name:
        try:
            for k, env in trees.items():
                (Path(name) / k).mkdir()
                served[k] = cli_speed.start_meshd(Path(name) / k, 4, env)
                cli_speed.fill(served[k][1], args.jobs, 4, name)
            script = Path(name, "trivial.py")
            script.write_text("pass\n")
            body = cli_speed.array_body(str(script), name, args.tasks)
            body.pop("tasks")
            for r in range(args.repeat + 1):
                for k, (proc, client) in served.items():
                    got = cli_speed.time_array_at_daemon(client, {**body, "tasks": args.tasks}, 1, proc.pid)
                    if r:  # the first round warms up
                        for what in ("accept", "cancel"):
                            times[k][what].append(got[what]["p50_ms"])
                            times[k][f"{what}_cpu"].append(got[f"{what}_cpu_ms"])
        finally:
            for proc, _ in served.values():
                proc.send_signal(signal.SIGTERM)
            for proc, _ in served.values():
                proc.wait(30)
    ms = lambda ts: {"p50_ms": round(statistics.median(ts), 1), "min_ms": round(min(ts), 1),
                     "max_ms": round(max(ts), 1)}  # fmt: skip
    report = {"tasks": args.tasks, "jobs": args.jobs, "repeat": args.repeat,
              "load_average_after": [round(x, 2) for x in os.getloadavg()]}
    for k, v in times.items():
        report[k] = {"accept": ms(v["accept"]), "cancel": ms(v["cancel"]),
                     "accept_cpu_ms_mean": round(statistics.mean(v["accept_cpu"]), 1),
                     "cancel_cpu_ms_mean": round(statistics.mean(v["cancel_cpu"]), 1)}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for k in trees:
        r = report[k]
        print(f"{k:<7} accept p50 {r['accept']['p50_ms']:6.1f} ms (min {r['accept']['min_ms']:.1f}, max "
              f"{r['accept']['max_ms']:.1f}; meshd CPU {r['accept_cpu_ms_mean']:.1f} ms)   cancel p50 "
              f"{r['cancel']['p50_ms']:6.1f} ms (min {r['cancel']['min_ms']:.1f}, max {r['cancel']['max_ms']:.1f}; "
              f"meshd CPU {r['cancel_cpu_ms_mean']:.1f} ms)")


if __name__ == "__main__":
    main()
