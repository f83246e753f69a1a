"""Failover: 4 meshd + a real etcd on loopback; 50 short jobs while the leader is SIGKILLed 5 times.

    python benchmarks/failover.py [--json] [--seed N] [--jobs 50] [--kills 5] [--nodes 4]

Phase 1 (latency): jobs submitted through a node that does not lead, timed from the submit call to the
moment that node's API shows the job RUNNING (polled every 5 ms).
Phase 2 (failover): `--jobs` fake jobs (1-2 GPUs, 1-4 s) are submitted through random live nodes while the
leader is SIGKILLed `--kills` times at random moments; each killed meshd is started again 1-2 s later (as
systemd's Restart= would); right after each kill one probe job is submitted through a surviving node.
Every rank of a fake job writes a ledger file (job, pid, start, its network namespace (the node where each meshd
has one), its supervisor's pid, a touch every 50 ms, and its end if it ran its full time). Reported:

  failover_s     per kill: the dead leader's SIGKILL to the next leader's first decision (log append)
  jobs_lost      acknowledged submits that never reached COMPLETED
  jobs_twice     jobs with two live copies at once (overlapping ledger intervals of different pids, rank 0)

Targets (issue 11): 0 lost, 0 twice, failover p95 < 10 s, submit-to-RUNNING via a non-leader p50 < 100 ms.
`--hops`: every meshd traces its proposals (MESHSCHED_MESH_TRACE=1, DEBUG lines in its log) and phase 1's
submit-to-RUNNING is split into hops, p50 ms each (`hops_ms`; see `hops`).
Needs the `etcd` binary (`apt-get install etcd-server`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from meshsched.cli.client import ApiError, DaemonUnavailable
from meshsched.daemon.etcd_local import ETCD, NO_ETCD
from meshsched.cli.mesh_local import LocalMesh, MeshNode

JOB_SCRIPT = """\
import os, sys, time
ledger, seconds = sys.argv[1], float(sys.argv[2])
job, rank = os.environ["MESH_JOB_ID"], os.environ["RANK"]
path = os.path.join(ledger, f"{job}~{rank}~{os.getpid()}")
start = time.time()
where = os.readlink("/proc/self/ns/net")  # the node, where each meshd has a network namespace of its own
with open(path, "w") as f:
    f.write(f"{start}\\n{where}\\n{os.getppid()}\\n")
while time.time() - start < seconds:
    time.sleep(0.05)
    os.utime(path)
with open(path, "a") as f:
    f.write(f"{time.time()}\\n")  # the end: a copy stopped before its time leaves no fourth line
"""


HOPS = (  # (name, from, to): a trace point is (what, proposal: "submit" | "start", node: B | P | "any")
    ("submit: proposed at B -> first applied", ("propose", "submit", "B"), ("apply", "submit", "any")),
    ("submit: first applied -> applied at P", ("apply", "submit", "any"), ("apply", "submit", "P")),
    ("launch at P (engine, spawn)", ("apply", "submit", "P"), ("propose", "start", "P")),
    ("start: proposed at P -> first applied", ("propose", "start", "P"), ("apply", "start", "any")),
    ("start: first applied -> applied at B", ("apply", "start", "any"), ("applied", "start", "B")),
    ("total: proposed at B -> applied at B", ("propose", "submit", "B"), ("applied", "start", "B")),
)
TRACE_LINE = re.compile(r"trace (\S+) (\w+) (.*)")


def hops(logs: dict[str, str]) -> dict[str, float]:
    """Per-hop p50 (ms) of phase 1's jobs from the meshd logs' trace lines (`daemon.mesh_batch.trace`): B is the
    node the job was submitted through, P the node it ran on; the rest of the submit-to-RUNNING figure is the
    API's (the submit call, the poll). Clocks: one machine's."""
    seen: dict[tuple[str, str, str], float] = {}  # (what, proposal, node) -> time (the first)
    jobs: dict[str, dict[str, tuple[str, str]]] = {}  # job -> kind -> (proposal, node that proposed it)
    for node, text in logs.items():
        for found in TRACE_LINE.finditer(text):
            t, what, rest = float(found[1]), found[2], found[3].split()
            proposal = rest[0].removeprefix("proposals/")
            seen.setdefault((what, proposal, node), t)
            seen.setdefault((what, proposal, "any"), t)
            seen[(what, proposal, "any")] = min(seen[(what, proposal, "any")], t)
            if what == "propose" and rest[1] in ("JobSubmitted", "JobStarted"):
                jobs.setdefault(rest[2], {})[rest[1]] = (proposal, node)
    out: dict[str, list[float]] = {name: [] for name, _, _ in HOPS}
    placed_on_leader = []
    for kinds in jobs.values():
        if "JobSubmitted" not in kinds or "JobStarted" not in kinds:
            continue
        (sub, b), (start, p) = kinds["JobSubmitted"], kinds["JobStarted"]
        names = {"submit": sub, "start": start}
        where = {"B": b, "P": p, "any": "any"}
        for name, (w1, k1, n1), (w2, k2, n2) in HOPS:
            t1, t2 = seen.get((w1, names[k1], where[n1])), seen.get((w2, names[k2], where[n2]))
            if t1 is not None and t2 is not None:
                out[name].append((t2 - t1) * 1000)
        placed_on_leader.append(float(("handed", start, p) in seen))
    result = {name: round(statistics.median(v), 1) for name, v in out.items() if v}
    if placed_on_leader:
        result["start appended by its own node (the leader), share"] = round(statistics.mean(placed_on_leader), 2)
    return result


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class Bench:
    def __init__(self, args) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.root = Path(tempfile.mkdtemp(prefix="failover"))
        self.ledger = self.root / "ledger"
        self.ledger.mkdir()
        self.script = self.root / "job.py"
        self.script.write_text(JOB_SCRIPT)
        self.mesh = LocalMesh(self.root, nodes=args.nodes, gpus=4, ttl=args.ttl)
        self.acked: list[str] = []

    def live(self) -> list[MeshNode]:
        return [n for n in self.mesh.members if n.proc is not None and n.proc.poll() is None]

    def submit(self, node: MeshNode, seconds: float, gpus: int = 1) -> str | None:
        body = {"command": [sys.executable, str(self.script), str(self.ledger), f"{seconds:g}"], "gpus": gpus,
                "cwd": str(self.root), "env": {}, "name": "fake"}
        try:
            job_id = self.mesh.client(node).call("POST", "/v1/jobs", body)["job_id"]
        except (DaemonUnavailable, ApiError, OSError):
            return None  # not acknowledged: not counted
        self.acked.append(job_id)
        return job_id

    def wait_leader(self, timeout: float = 60.0, not_term: int | None = None) -> tuple[MeshNode, dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in self.live():
                try:
                    mesh = self.mesh.nodes_view(node)[0].get("mesh", {})
                except (DaemonUnavailable, ApiError, OSError):
                    continue
                if mesh.get("term") is not None and mesh["term"] != not_term:
                    return node, mesh
            time.sleep(0.02)
        raise RuntimeError("no leader")

    def wait_joined(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                view = self.mesh.nodes_view(self.mesh.members[0])
            except (DaemonUnavailable, ApiError, OSError):
                view = []
            if sum(1 for n in view if n["alive"]) == len(self.mesh.members):
                return
            time.sleep(0.05)
        raise RuntimeError("the nodes did not all join")

    def latency(self) -> list[float]:
        self.wait_joined()
        leader, _ = self.wait_leader()
        other = next(n for n in self.mesh.members if n is not leader)
        client = self.mesh.client(other)
        out = []
        for _ in range(self.args.probes):
            t0 = time.perf_counter()
            job_id = self.submit(other, 0.3)
            while client.call("GET", f"/v1/jobs/{job_id}")["state"] not in ("RUNNING", "COMPLETED"):
                time.sleep(0.005)
            out.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.35)
        return out

    def chaos(self) -> list[float]:
        a = self.args
        kill_at = sorted(self.rng.uniform(2, a.duration) for _ in range(a.kills))
        submit_at = sorted(self.rng.uniform(0, a.duration) for _ in range(a.jobs))
        t0 = time.monotonic()
        failovers, restarts = [], []
        while submit_at or kill_at or restarts:
            now = time.monotonic() - t0
            if restarts and restarts[0][0] <= now:
                _, node = restarts.pop(0)
                self.mesh.launch(node)
            if kill_at and kill_at[0] <= now:
                kill_at.pop(0)
                leader, mesh = self.wait_leader()
                killed = time.time()
                self.mesh.kill(leader)
                restarts.append((time.monotonic() - t0 + self.rng.uniform(1, 2), leader))
                restarts.sort(key=lambda r: r[0])
                survivor = self.rng.choice(self.live())
                self.submit(survivor, 0.5)  # the probe the next leader must decide
                new, new_mesh = self.wait_leader(not_term=mesh["term"])
                while new_mesh.get("first_decision") is None:
                    time.sleep(0.02)
                    try:
                        new_mesh = self.mesh.nodes_view(new)[0]["mesh"]
                    except (DaemonUnavailable, ApiError, OSError):
                        new, new_mesh = self.wait_leader(not_term=mesh["term"])
                failovers.append(new_mesh["first_decision"] - killed)
                print(f"  kill {len(failovers)}: {leader.name} -> {new.name} in {failovers[-1]:.2f} s",
                      file=sys.stderr)
            if submit_at and submit_at[0] <= now:
                submit_at.pop(0)
                live = self.live()
                if live:
                    self.submit(self.rng.choice(live), self.rng.uniform(1, 4), self.rng.choice((1, 1, 2)))
            time.sleep(0.01)
        for node in self.mesh.members:
            if node.proc is None or node.proc.poll() is not None:
                self.mesh.launch(node)
        for node in self.mesh.members:
            self.mesh.wait_up(node)
        return failovers

    def final_states(self, timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            try:
                node = self.wait_leader()[0]
                states = {j["job_id"]: j["state"] for j in self.mesh.client(node).call("GET", "/v1/jobs")}
            except (DaemonUnavailable, ApiError, OSError, RuntimeError):
                time.sleep(0.5)
                continue
            if all(states.get(j) in ("COMPLETED", "FAILED", "CANCELLED") for j in self.acked):
                break
            time.sleep(0.5)
        return states

    def twice(self) -> list[str]:
        runs: dict[str, list[tuple[float, float]]] = {}
        for f in self.ledger.iterdir():
            job, rank, _pid = f.name.split("~")
            if rank == "0":
                runs.setdefault(job, []).append((float(f.read_text().split()[0]), f.stat().st_mtime))
        bad = []
        for job, spans in runs.items():
            spans.sort()
            if any(b[0] < a[1] - 0.06 for a, b in zip(spans, spans[1:])):
                bad.append(job)
        return sorted(bad)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--jobs", type=int, default=50)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--probes", type=int, default=20, help="submit-to-RUNNING samples through a non-leader")
    p.add_argument("--duration", type=float, default=60.0, help="seconds over which submits and kills spread")
    p.add_argument("--ttl", type=int, default=3, help="coordinator ttl (failover is bounded by it)")
    p.add_argument("--hops", action="store_true", help="split phase 1's submit-to-RUNNING into hops (traces)")
    args = p.parse_args()
    if args.hops:
        os.environ["MESHSCHED_MESH_TRACE"] = "1"  # every meshd started from here
    if ETCD is None:
        sys.exit(f"failover: {NO_ETCD}")
    bench = Bench(args)
    try:
        bench.mesh.start()
        for node in bench.mesh.members:
            bench.mesh.wait_up(node)
        print("phase 1: submit-to-RUNNING through a non-leader", file=sys.stderr)
        lat = bench.latency()
        hop = hops({n.name: bench.mesh.log(n) for n in bench.mesh.members}) if args.hops else None
        print(f"phase 2: {args.jobs} jobs, {args.kills} leader kills", file=sys.stderr)
        failovers = bench.chaos()
        states = bench.final_states(timeout=120)
        lost = sorted(j for j in bench.acked if states.get(j) != "COMPLETED")
        twice = bench.twice()
    finally:
        bench.mesh.stop()
    out = {
        "nodes": args.nodes, "jobs_acked": len(bench.acked), "kills": len(failovers), "ttl_s": args.ttl,
        "failover_s": [round(f, 3) for f in failovers], "failover_p50_s": round(pct(failovers, 0.5), 3),
        "failover_p95_s": round(pct(failovers, 0.95), 3), "jobs_lost": len(lost), "lost_ids": lost,
        "jobs_twice": len(twice), "twice_ids": twice,
        "submit_to_running_ms_p50": round(statistics.median(lat), 1),
        "submit_to_running_ms_p95": round(pct(lat, 0.95), 1),
    }
    if hop is not None:
        out["hops_ms"] = hop
    if args.json:
        print(json.dumps(out, indent=2))
        return
    rows = [("failover p50 / p95 (s)", f"{out['failover_p50_s']} / {out['failover_p95_s']}", "p95 < 10"),
            ("jobs lost", f"{out['jobs_lost']} of {out['jobs_acked']}", "0"),
            ("jobs run twice", str(out["jobs_twice"]), "0"),
            ("submit->RUNNING via non-leader p50 / p95 (ms)",
             f"{out['submit_to_running_ms_p50']} / {out['submit_to_running_ms_p95']}", "p50 < 100")]
    rows += [(f"  {name} (p50 ms)", str(value), "") for name, value in (hop or {}).items()]
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'measured':<14}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:<14}  {target}")


if __name__ == "__main__":
    main()
