"""The mesh at scale across network namespaces: N meshd (fake GPUs, 8 each) + etcd, each in its own namespace
(tests/support/netns.py), short jobs while the leader is SIGKILLed and single nodes are cut off longer than
node_grace.

    python benchmarks/mesh_scale.py [--nodes 32] [--jobs 5000] [--kills 5] [--partitions 2] [--json]

The measuring code is benchmarks/failover.py's (its Bench drives the NetnsMesh unchanged): phase 1 times
submit-to-RUNNING through a node that does not lead; phase 2 submits `--jobs` fake jobs (1-2 GPUs, 1-4 s, each
rank writing a ledger file with its start, node, supervisor, a touch every 50 ms and its end) through random live
nodes over `--duration` seconds while the leader is SIGKILLed `--kills` times (restarted 1-2 s later) and, from a
second thread, `--partitions` times a random node that does not lead has its link taken down for ttl + node_grace
+ 2 s (its meshd and ranks run on). Reported: jobs lost (acknowledged, never COMPLETED), jobs live on two nodes at once
(overlapping rank-0 ledger intervals of two processes; `twice_detail` names each copy's node, supervisor, start and
end in seconds from the start of phase 2, with the kills, restarts and cuts around them), failover p50/p95,
submit-to-RUNNING p50/p95, etcd's database file at the end (and per job), and a new node's join time (started in a
spare namespace after the run: launch to alive in its own view at the leader's log position; it loads the newest
snapshot), the machine's 1-minute load average around phase 1 and every 30 s after, and the wall time.
`--logs DIR` keeps every meshd's log. A meshd task that dies (`mesh: _follow failed: ...` in its log: that node
applies no more of the log) stops the run in one line, exit 1, instead of a wait for ever.
Needs root, iproute2 and the `etcd` binary. Progress on stderr.
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import itertools
import json
import os
import random
import re
import shutil
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshsched.cli.client import ApiError, DaemonUnavailable

from benchmarks.failover import Bench, hops, pct
from tests.support.netns import Fabric, NetnsMesh, NetnsUnavailable


TASK_DIED = re.compile(r"mesh: (\w+) failed: (.*)")  # MeshLink._done: a meshd task ended by an exception
STOPPED: list[str] = []  # why the watcher stopped the run (it interrupts the main thread)


def task_death(text: str) -> str | None:
    """The first line of a meshd log chunk saying one of MeshLink's tasks died (its `_follow`: that node applies
    no more of the log; on every node: the mesh stands still and the run would wait for ever)."""
    found = TASK_DIED.search(text)
    return None if found is None else f"{found.group(1)} failed: {found.group(2).strip()}"


class ScaleBench(Bench):
    def __init__(self, args, fabric: Fabric) -> None:
        super().__init__(args)
        self.fabric = fabric
        self.mesh = NetnsMesh(self.root, nodes=args.nodes, gpus=args.gpus, ttl=args.ttl,
                              node_grace=args.node_grace, fabric=fabric)
        self.partitioned: list[dict] = []
        self.load: list[float] = []  # 1-minute load averages, every 30 s from phase 2 on
        self.watching = True  # watch_logs stops the run if a meshd task dies (until the run stops the mesh)
        self.events: list[tuple[float, str, str]] = []  # (wall clock, what, node): kills, restarts, cuts
        kill, launch = self.mesh.kill, self.mesh.launch

        def logged_kill(node) -> None:
            self.events.append((time.time(), "kill", node.name))
            kill(node)

        def logged_launch(node) -> None:
            self.events.append((time.time(), "launch", node.name))
            launch(node)

        self.mesh.kill, self.mesh.launch = logged_kill, logged_launch

    def cut_s(self) -> float:
        """How long a partition lasts: the member lease (ttl) runs out, then node_grace passes, plus a margin."""
        return self.args.ttl + self.args.node_grace + 2

    def partitions(self, t0: float) -> None:
        """Cut single non-leading nodes off for ttl + node_grace + 2 s at random moments of the chaos phase."""
        rng = random.Random(self.args.seed + 1)
        at = sorted(rng.uniform(5, self.args.duration) for _ in range(self.args.partitions))
        for moment in at:
            time.sleep(max(0.0, moment - (time.monotonic() - t0)))
            leader = self.mesh.leader()
            node = rng.choice([n for n in self.live() if n is not leader])
            self.fabric.link_down(self.mesh.index(node))
            self.events.append((time.time(), "cut", node.name))
            print(f"  partition: {node.name} cut off for {self.cut_s():g} s", file=sys.stderr)
            time.sleep(self.cut_s())
            self.fabric.link_up(self.mesh.index(node))
            self.events.append((time.time(), "heal", node.name))
            self.partitioned.append({"node": node.name, "at_s": round(moment, 1), "for_s": self.cut_s()})

    def node_of(self) -> dict[str, str]:
        """A job's ledger names its network namespace ("net:[inode]"): which node that is."""
        out = {}
        for node in self.mesh.members:
            with contextlib.suppress(OSError):
                ino = os.stat(f"/run/netns/{self.fabric.ns(self.mesh.index(node))}").st_ino
                out[f"net:[{ino}]"] = node.name
        return out

    def twice_detail(self, t0: float) -> list[dict]:
        """Every pair of overlapping rank-0 copies: the nodes, the supervisors, start and end (seconds from t0;
        end null where the copy was stopped before its time, its last touch then), and the events around them."""
        where = self.node_of()
        runs: dict[str, list[dict]] = {}
        for f in self.ledger.iterdir():
            job, rank, pid = f.name.split("~")
            lines = f.read_text().split()
            if rank != "0" or len(lines) < 3:
                continue
            runs.setdefault(job, []).append({
                "pid": int(pid), "node": where.get(lines[1], lines[1]), "supervisor": int(lines[2]),
                "start": float(lines[0]), "end": float(lines[3]) if len(lines) > 3 else None,
                "last_touch": f.stat().st_mtime})
        out = []
        for job, copies in sorted(runs.items()):
            copies.sort(key=lambda c: c["start"])
            for a, b in itertools.pairwise(copies):
                if b["start"] < a["last_touch"] - 0.06:
                    lo, hi = a["start"] - 15, max(a["last_touch"], b["last_touch"]) + 1
                    near = [f"{w - t0:.2f} {what} {n}" for w, what, n in self.events if lo <= w <= hi]
                    out.append({"job": job, "copies": [
                        {**c, "start": round(c["start"] - t0, 2), "last_touch": round(c["last_touch"] - t0, 2),
                         "end": None if c["end"] is None else round(c["end"] - t0, 2)} for c in (a, b)],
                        "events": near})
        return out

    def watch_logs(self) -> None:
        """Every 10 s, the new complete lines of each meshd's log: a task that died stops the run in one line."""
        offsets: dict[str, int] = {}
        while self.watching:
            time.sleep(10)
            for node in list(self.mesh.members):
                try:
                    with open(node.config.parent / "meshd.log", "rb") as f:
                        f.seek(offsets.get(node.name, 0))
                        chunk = f.read()
                except OSError:
                    continue
                chunk = chunk[:chunk.rfind(b"\n") + 1]  # a line still being written: read it whole next time
                offsets[node.name] = offsets.get(node.name, 0) + len(chunk)
                died = task_death(chunk.decode(errors="replace"))
                if died is not None and self.watching:  # not once the run stops the mesh itself
                    self.watching = False
                    STOPPED.append(f"meshd {node.name}: {died}")
                    _thread.interrupt_main()
                    return

    def sample_load(self) -> None:
        """The machine's 1-minute load average every 30 s from phase 2 on (the figures depend on it)."""
        while True:
            self.load.append(round(os.getloadavg()[0], 2))
            time.sleep(30)

    def join_time(self) -> dict:
        """A new node started after the run: seconds from launch to alive, at the leader's log position."""
        i = self.args.nodes + 1
        node = self.mesh.make_node(i)
        self.mesh.members.append(node)
        leader = self.wait_leader()[0]
        t0 = time.monotonic()
        self.mesh.launch(node)
        self.mesh.wait_up(node, timeout=120)
        while time.monotonic() - t0 < 120:
            try:
                own = self.mesh.nodes_view(node)[0]
                target = self.mesh.nodes_view(leader)[0]["mesh"]["log_position"]
            except (DaemonUnavailable, ApiError, OSError, KeyError, IndexError):
                time.sleep(0.05)
                continue
            if own["alive"] and own["mesh"]["synced"] and own["mesh"]["log_position"] >= target:
                return {"join_s": round(time.monotonic() - t0, 2), "snapshot_index": own["mesh"]["snapshot_index"],
                        "log_position": own["mesh"]["log_position"]}
            time.sleep(0.05)
        return {"join_s": None}


def run(args, fabric: Fabric) -> dict:
    bench = ScaleBench(args, fabric)
    try:
        bench.mesh.start()
        if args.etcd_nice:  # etcd on its own machines, as docs/coordinator.md advises: here it shares 2 cores
            os.setpriority(os.PRIO_PROCESS, bench.mesh.etcd.proc.pid, args.etcd_nice)
        threading.Thread(target=bench.watch_logs, daemon=True).start()
        for node in bench.mesh.members:
            bench.mesh.wait_up(node, timeout=120)
        bench.wait_joined(timeout=180)
        print("phase 1: submit-to-RUNNING through a non-leader", file=sys.stderr)
        load1 = os.getloadavg()
        lat = bench.latency()
        hop = hops({n.name: bench.mesh.log(n) for n in bench.mesh.members}) if args.hops else None
        load1 = {"before": [round(x, 2) for x in load1], "after": [round(x, 2) for x in os.getloadavg()]}
        sampler = threading.Thread(target=bench.sample_load, daemon=True)
        sampler.start()
        t_start = time.time()
        print(f"phase 2: {args.jobs} jobs, {args.kills} leader kills, {args.partitions} partitions", file=sys.stderr)
        cutter = threading.Thread(target=bench.partitions, args=(time.monotonic(),), daemon=True)
        cutter.start()
        failovers = bench.chaos()
        cutter.join()
        print("waiting for every job to end", file=sys.stderr)
        states = bench.final_states(timeout=args.settle)
        lost = sorted(j for j in bench.acked if states.get(j) != "COMPLETED")
        twice = bench.twice()
        detail = bench.twice_detail(t_start)
        db = bench.mesh.etcd.db.stat().st_size
        print("a new node joins", file=sys.stderr)
        join = bench.join_time()
        position = bench.mesh.nodes_view(bench.wait_leader()[0])[0]["mesh"]
    finally:
        bench.watching = False
        bench.mesh.stop()
        if args.logs:
            Path(args.logs).mkdir(parents=True, exist_ok=True)
            for n in bench.mesh.members:
                with contextlib.suppress(OSError):
                    shutil.copy(n.config.parent / "meshd.log", Path(args.logs) / f"{n.name}.log")
        for d in (bench.root, *(n.config.parent for n in bench.mesh.members)):
            shutil.rmtree(d, ignore_errors=True)
    acked = len(bench.acked)
    return {
        "nodes": args.nodes, "gpus_per_node": args.gpus, "jobs_acked": acked, "kills": len(failovers),
        "partitions": bench.partitioned, "ttl_s": args.ttl, "node_grace_s": args.node_grace,
        "jobs_lost": len(lost), "lost_ids": lost,
        "lost_by_state": dict(Counter(states.get(j, "UNKNOWN") for j in lost)),  # UNKNOWN: not in the mesh's list
        "etcd_nice": args.etcd_nice, "jobs_twice": len(twice), "twice_ids": twice,
        "twice_detail": detail,
        "failover_s": [round(f, 3) for f in failovers], "failover_p50_s": round(pct(failovers, 0.5), 3),
        "failover_p95_s": round(pct(failovers, 0.95), 3),
        "submit_to_running_ms_p50": round(pct(lat, 0.5), 1), "submit_to_running_ms_p95": round(pct(lat, 0.95), 1),
        "etcd_db_bytes": db, "etcd_db_bytes_per_job": round(db / max(acked, 1)),
        "log_position": position.get("log_position"), "snapshot_index": position.get("snapshot_index"),
        "snapshots_written": position.get("snapshots_written"), "new_node": join,
        "load_avg_phase1": load1, "load_avg_1min_every_30s": bench.load,
    } | ({"hops_ms": hop} if hop is not None else {})


def table(out: dict) -> str:
    by_state = ", ".join(f"{k} {v}" for k, v in sorted(out["lost_by_state"].items()))
    rows = [("jobs lost", f"{out['jobs_lost']} of {out['jobs_acked']}" + (f" ({by_state})" if by_state else ""), "0"),
            ("jobs live on two nodes at once", str(out["jobs_twice"]), "0"),
            ("failover p50 / p95 (s)", f"{out['failover_p50_s']} / {out['failover_p95_s']}", "p95 < 10"),
            ("submit->RUNNING via non-leader p50 / p95 (ms)",
             f"{out['submit_to_running_ms_p50']} / {out['submit_to_running_ms_p95']}", "p50 < 100"),
            ("etcd db at the end (MB) / per job (KB)",
             f"{out['etcd_db_bytes'] / 1e6:.1f} / {out['etcd_db_bytes_per_job'] / 1e3:.1f}", "printed"),
            ("new node joins (s) from snapshot at",
             (f"{out['new_node'].get('join_s')} / {out['new_node'].get('snapshot_index')}"), "< 5")]
    width = max(len(r[0]) for r in rows)
    lines = [f"{'figure':<{width}}  {'measured':<16}  target"]
    lines += [f"{name:<{width}}  {value:<16}  {target}" for name, value, target in rows]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--gpus", type=int, default=8, help="fake GPUs per node")
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--probes", type=int, default=20, help="submit-to-RUNNING samples through a non-leader")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds over which submits, kills and partitions spread (default: jobs / 4)")
    p.add_argument("--ttl", type=int, default=3, help="coordinator ttl (failover is bounded by it)")
    p.add_argument("--node-grace", type=float, default=6.0,
                   help="meshd node_grace; partitions last ttl + node_grace + 2 s")
    p.add_argument("--logs", default=None, help="copy each meshd's log into this folder after the run")
    p.add_argument("--etcd-nice", type=int, default=0,
                   help="etcd's scheduling priority (e.g. -10: etcd ahead of the 32 meshd, as on its own machine)")
    p.add_argument("--hops", action="store_true", help="split phase 1's submit-to-RUNNING into hops (every meshd "
                   "traces its log: two DEBUG lines per entry and node, for the whole run)")
    p.add_argument("--settle", type=float, default=300.0, help="seconds to wait for every job to end")
    args = p.parse_args()
    if args.hops:
        os.environ["MESHSCHED_MESH_TRACE"] = "1"  # every meshd started from here (benchmarks/failover.py hops)
    args.duration = args.duration or max(30.0, args.jobs / 4)
    started = time.monotonic()
    try:
        with Fabric(args.nodes + 2) as fabric:  # etcd, the nodes, and a spare for the joining node
            out = run(args, fabric)
        out["wall_s"] = round(time.monotonic() - started)
    except NetnsUnavailable as e:
        print(f"mesh_scale: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if not STOPPED:
            raise
        print(f"mesh_scale: stopped, the mesh no longer follows its log ({STOPPED[0]}); no figures (--logs keeps "
              "every meshd's log)", file=sys.stderr)
        return 1
    print(json.dumps(out, indent=2) if args.json else table(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
