"""Sim-vs-daemon parity: one Philly slice through `simulate()` and through a real meshd with fake GPUs.

    .venv/bin/python benchmarks/parity.py [--jobs 50] [--gpus 8] [--policies sjf,srtf,castor] [--json]

The workload: the first --jobs jobs of the Philly trace that fit on one node of --gpus fake V100s (models,
batches and iterations from meshsched.loaders.traces, seed --seed). It is time-compressed by C (chosen so the
longest simulated makespan takes --target-seconds of wall time, or given with --compress): a job arrives at
submit / C and each of its steps stands for C trace iterations, so it is submitted to meshd with
round(iterations / C) steps (the simulator replays the same jobs with round(iterations / C) x C iterations).
A step of examples/fake_train.py then takes the model's step time in wall seconds: the engine inside meshd
compares its perf model's step times with the step times jobs report (Castor's t_A), so the two must be in
the same unit. Load and pause times are divided by C. Interference: fake_train.py looks up who trains on
its fake GPUs in a registry directory and applies the same interference model the simulator uses.

Per policy: the simulator's and meshd's mean JCT in trace seconds (meshd's wall JCT x C), their relative
difference, whether jobs started in the same order (jobs started in the same scheduling pass form one
group), the per-job differences, the preemptions and shared starts, double runs found in fake_train's
per-process records, and what time compression cannot scale down: meshd's launch latency (launch ->
training start: supervisor and interpreter start-up, imports) and pause latency (preemption decided -> GPUs
free: directive, checkpoint, every rank's exit), both in trace seconds. As a diagnosis (not a target) the
simulator is run again with every load time set to the measured launch latency ("vs sim(L=lat.)").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from meshsched.cli.client import Client, DaemonUnavailable
from meshsched.loaders.profiles import installed_handle
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.loaders.traces import TraceOptions, load_trace
from meshsched.state import JobSpec

ROOT = Path(__file__).resolve().parents[1]
FAKE_TRAIN = ROOT / "examples" / "fake_train.py"
GPU_TYPE = "v100"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


@dataclass(frozen=True)
class Workload:
    jobs: tuple[JobSpec, ...]  # trace seconds, iterations = steps x compress
    steps: tuple[int, ...]  # what meshd runs per job
    compress: int


def trace_jobs(n: int, gpus: int, seed: int, perf) -> list[JobSpec]:
    tr = load_trace("philly", perf, TraceOptions(gpu_type=GPU_TYPE, gpus_per_node=gpus, seed=seed, first_n=4 * n))
    jobs = [j for j in tr.jobs if j.gpus <= gpus][:n]
    if len(jobs) < n:
        raise SystemExit(f"parity: only {len(jobs)} of the first {4 * n} trace jobs fit on {gpus} GPUs")
    return jobs


def compressed(jobs: list[JobSpec], compress: int) -> Workload:
    out, steps = [], []
    for j in jobs:
        s = max(1, round(j.iterations / compress))
        steps.append(s)
        out.append(JobSpec(j.job_id, j.gpus, j.model, j.batch_size, s * compress, j.submit_time, j.name or j.job_id))
    return Workload(tuple(out), tuple(steps), compress)


class _LoadTime:
    """The performance model with every model's load time replaced (the simulator's truth, for the diagnosis)."""

    def __init__(self, perf, load_s: float) -> None:
        self._perf, self._load = perf, load_s

    def load_time(self, model: str) -> float:
        return self._load

    def __getattr__(self, name: str):
        return getattr(self._perf, name)


def run_sim(w: Workload, policy: str, gpus: int, handle, load_s: float | None = None) -> dict:
    cluster = ClusterSpec(1, gpus, GPU_TYPE, handle.perf.gpu_memory_mb(GPU_TYPE))
    perf = handle.perf if load_s is None else _LoadTime(handle.perf, load_s)
    r = simulate(list(w.jobs), make_policy(policy, handle), perf, cluster)
    jobs = {}
    for j in r.engine.state.jobs.values():
        jobs[j.job_id] = {"state": j.state.value, "start": j.acct.first_start, "end": j.acct.finish_time,
                          "jct": (j.acct.finish_time - j.spec.submit_time) if j.acct.finish_time is not None else None,
                          "preemptions": j.acct.preemptions}
    shares = len(getattr(r.engine.policy.placement, "share_log", {}))
    return {"jobs": jobs, "shared_starts": shares}


class Meshd:
    """A real meshd process on fake GPUs in a temporary directory."""

    def __init__(self, root: Path, policy: str, gpus: int) -> None:
        self.state = root / "state"
        self.runtime = Path(tempfile.mkdtemp(prefix="par", dir="/tmp"))  # Unix socket paths stay short
        argv = [sys.executable, "-m", "meshsched.daemon.main", "--state-dir", str(self.state), "--runtime-dir",
                str(self.runtime), "--fake-gpus", str(gpus), "--policy", policy, "--kill-grace", "2",
                "--preempt-grace", "30", "--node-name", "parity"]
        env = dict(os.environ, MESHD_SYSTEMD_SCOPE="no", MESHD_GPU_TYPE=GPU_TYPE)
        self.log = open(root / "meshd.log", "w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.client = Client(self.runtime / "api.sock")
        deadline = time.monotonic() + 60
        while True:
            try:
                self.client.call("GET", "/v1/health")
                break
            except DaemonUnavailable:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"parity: meshd did not start (see {root / 'meshd.log'})") from None
                time.sleep(0.05)

    def close(self) -> None:
        pids = []
        try:
            pids = [j["supervisor_pid"] for j in self.client.call("GET", "/v1/jobs")]
        except (DaemonUnavailable, OSError):
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(15)
        for pid in pids:
            if pid:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.log.close()
        shutil.rmtree(self.runtime, ignore_errors=True)


def run_daemon(w: Workload, policy: str, gpus: int, root: Path, poll: float) -> dict:
    root.mkdir(parents=True)
    gpu_dir, records = root / "fakegpus", root / "records.jsonl"
    meshd = Meshd(root, policy, gpus)
    try:
        c = w.compress
        env = {"MESH_FAKE_GPU_DIR": str(gpu_dir), "MESH_FAKE_RECORDS": str(records), "MESH_REPORT_INTERVAL": "0.05",
               "MESH_FAKE_COMPRESS": str(c), "MESH_FAKE_ITERS_PER_STEP": str(c), "MESH_FAKE_GPU_TYPE": GPU_TYPE}
        ids: dict[str, str] = {}  # meshd id -> trace id
        t0 = time.time()
        for j, steps in zip(w.jobs, w.steps):
            delay = t0 + j.submit_time / c - time.time()
            if delay > 0:
                time.sleep(delay)
            cmd = [sys.executable, str(FAKE_TRAIN), "--model", j.model, "--batch-size", str(j.batch_size),
                   "--iterations", str(steps), "--poll", str(poll)]
            body = {"command": cmd, "cwd": str(root), "gpus": j.gpus, "model": j.model, "batch_size": j.batch_size,
                    "iterations": steps, "name": j.job_id, "env": env}
            ids[meshd.client.call("POST", "/v1/jobs", body)["job_id"]] = j.job_id
        while True:
            listed = meshd.client.call("GET", "/v1/jobs?all=1")
            if all(x["state"] in TERMINAL for x in listed):
                break
            time.sleep(0.2)
        wall = time.time() - t0
        explain = {i: meshd.client.call("GET", f"/v1/jobs/{i}/explain") for i in ids}
        history = {i: meshd.client.call("GET", f"/v1/jobs/{i}")["history"] for i in ids}
    finally:
        meshd.close()
    jobs = {}
    for x in listed:
        tid = ids[x["job_id"]]
        end, start = x.get("end_time"), x.get("start_time")
        jobs[tid] = {"state": x["state"], "start": None if start is None else (start - t0) * c,
                     "end": None if end is None else (end - t0) * c,
                     "jct": None if end is None else (end - x["submit_time"]) * c, "restarts": x["restarts"],
                     "shared": any("share with" in e["message"] for e in explain[x["job_id"]])}
    runs = _runs(records, ids)
    runs_check = _overlaps(runs)
    pauses = [(b[0] - a[0]) * c for h in history.values() for a, b in zip(h, h[1:]) if a[1] == "PAUSING"]
    return {"jobs": jobs, "wall_seconds": wall, "double_runs": runs_check["overlapping"],
            "runs_without_stop_record": runs_check["no_stop_record"],
            "launch_latency": _latency(runs, listed, ids, c), "preemptions": len(pauses),
            "pause_latency": {"median": statistics.median(pauses), "max": max(pauses)} if pauses else {}, "shared_starts": sum(v["shared"] for v in jobs.values()),
            "dir": str(root)}


def _runs(records: Path, ids: dict[str, str]) -> dict[str, list[dict]]:
    """Rank 0's processes per trace job, from fake_train's records (start and stop lines joined by pid)."""
    starts, stops = {}, {}
    if records.exists():
        for line in records.read_text().splitlines():
            r = json.loads(line)
            if r["rank"] == 0 and r["job"] in ids:
                (starts if r["event"] == "start" else stops)[r["pid"]] = r
    out: dict[str, list[dict]] = {}
    for pid, s in starts.items():
        out.setdefault(ids[s["job"]], []).append({**s, **stops.get(pid, {})})
    return out


def _overlaps(runs: dict[str, list[dict]]) -> dict:
    """Pairs of one job's processes alive at the same time (a double run), and processes that left no stop
    record (SIGKILLed: their end is unknown, so they are not counted as overlapping)."""
    n = unknown = 0
    for rs in runs.values():
        rs = sorted(rs, key=lambda r: r["start"])
        unknown += sum(1 for r in rs if "stop" not in r)
        n += sum(1 for a, b in zip(rs, rs[1:]) if "stop" in a and b["start"] < a["stop"])
    return {"overlapping": n, "no_stop_record": unknown}


def _latency(runs, listed, ids, c) -> dict:
    """First launch (meshd's start_time) -> training start of that first run, in trace seconds."""
    first = {ids[x["job_id"]]: x["start_time"] for x in listed if x.get("start_time")}
    lat = []
    for j, rs in runs.items():
        r0 = min(rs, key=lambda r: r["start"])
        if j in first and "train_start" in r0:
            lat.append((r0["train_start"] - first[j]) * c)
    return {"median": statistics.median(lat), "max": max(lat), "n": len(lat)} if lat else {}


def start_groups(jobs: dict[str, dict]) -> list[list[str]]:
    """Job ids by first start; jobs started by one scheduling pass (the same start time) form one sorted group."""
    groups: dict[float, list[str]] = {}
    for k, v in jobs.items():
        if v["start"] is not None:
            groups.setdefault(v["start"], []).append(k)
    return [sorted(groups[t]) for t in sorted(groups)]


def compare(policy: str, sim: dict, dmn: dict, calibrated: dict) -> dict:
    ids = list(sim["jobs"])
    per_job, rel = [], []
    for k in ids:
        s, d = sim["jobs"][k], dmn["jobs"].get(k, {})
        if s["jct"] is None or d.get("jct") is None:
            continue
        r = (d["jct"] - s["jct"]) / s["jct"]
        rel.append(r)
        per_job.append({"job": k, "sim_jct": round(s["jct"]), "meshd_jct": round(d["jct"]), "rel_diff": round(r, 4),
                        "sim_start": round(s["start"]), "meshd_start": round(d["start"])})
    sim_mean = statistics.mean(v["jct"] for v in sim["jobs"].values() if v["jct"] is not None)
    done = [v["jct"] for v in dmn["jobs"].values() if v.get("jct") is not None and v["state"] == "COMPLETED"]
    dmn_mean = statistics.mean(done) if done else math.nan
    sim_order = start_groups(sim["jobs"])
    dmn_order = start_groups(dmn["jobs"])
    cal_mean = statistics.mean(v["jct"] for v in calibrated["jobs"].values() if v["jct"] is not None)
    return {
        "policy": policy, "jobs": len(ids), "jobs_completed": len(done),
        "sim_mean_jct": round(sim_mean), "meshd_mean_jct": round(dmn_mean), "mean_jct_rel_diff": round(dmn_mean / sim_mean - 1, 4),
        "same_start_order": sim_order == dmn_order,
        # the simulator again, told that loading takes what meshd's launches took (not a target: a diagnosis)
        "sim_launch_calibrated_mean_jct": round(cal_mean), "calibrated_rel_diff": round(dmn_mean / cal_mean - 1, 4),
        "calibrated_same_start_order": start_groups(calibrated["jobs"]) == dmn_order,
        "first_order_difference": next(({"index": i, "sim": a, "meshd": b} for i, (a, b) in
                                        enumerate(zip(sim_order, dmn_order)) if a != b), None),
        "per_job_abs_rel_diff_mean": round(statistics.mean(abs(r) for r in rel), 4) if rel else None,
        "per_job_abs_rel_diff_max": round(max(abs(r) for r in rel), 4) if rel else None,
        "sim_preemptions": sum(v["preemptions"] for v in sim["jobs"].values()),
        "meshd_preemptions": dmn["preemptions"],
        "pause_latency_trace_s": dmn["pause_latency"],  # preemption decided -> GPUs free (the sim: pause time)
        "sim_shared_starts": sim["shared_starts"], "meshd_shared_starts": dmn["shared_starts"],
        "double_runs": dmn["double_runs"], "runs_without_stop_record": dmn["runs_without_stop_record"], "launch_latency_trace_s": dmn["launch_latency"],
        "meshd_wall_seconds": round(dmn["wall_seconds"], 1), "per_job": per_job, "dir": dmn["dir"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=50, help="trace jobs (the first that fit on the node)")
    p.add_argument("--gpus", type=int, default=8, help="fake GPUs of the one node")
    p.add_argument("--policies", default="sjf,srtf,castor")
    p.add_argument("--seed", type=int, default=1, help="the trace's model/batch draw")
    p.add_argument("--target-seconds", type=float, default=180.0, help="wall seconds of the longest replay")
    p.add_argument("--compress", type=int, default=0, help="time-compression factor C (default: from --target-seconds)")
    p.add_argument("--poll", type=float, default=0.02, help="fake_train.py's look at its GPUs' occupants, seconds")
    p.add_argument("--keep", action="store_true", help="keep meshd's state directories (printed)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.jobs < 1 or args.gpus < 1 or args.target_seconds <= 0 or args.compress < 0:
        p.error("--jobs, --gpus and --target-seconds must be positive")
    policies = [x.strip() for x in args.policies.split(",") if x.strip()]
    handle = installed_handle()
    jobs = trace_jobs(args.jobs, args.gpus, args.seed, handle.perf)
    c = args.compress
    if not c:  # from the uncompressed replay's longest makespan
        probe = compressed(jobs, 1)
        span = max(max(v["end"] for v in run_sim(probe, pol, args.gpus, handle)["jobs"].values()) for pol in policies)
        c = max(1, math.ceil(span / args.target_seconds))
    w = compressed(jobs, c)
    tmp = Path(tempfile.mkdtemp(prefix="parity-"))
    results = []
    try:
        for pol in policies:
            sim = run_sim(w, pol, args.gpus, handle)
            dmn = run_daemon(w, pol, args.gpus, tmp / pol.replace("+", "_"), args.poll)
            lat = dmn["launch_latency"].get("median")
            calibrated = run_sim(w, pol, args.gpus, handle, lat) if lat is not None else sim
            results.append(compare(pol, sim, dmn, calibrated))
            if not args.json:
                print(f"  {pol}: meshd took {dmn['wall_seconds']:.0f} s", file=sys.stderr)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    report = {"trace": "philly", "jobs": len(jobs), "gpus": args.gpus, "gpu_type": GPU_TYPE, "seed": args.seed,
              "compress": c, "policies": results}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"Philly, first {len(jobs)} jobs that fit on 1 x {args.gpus} fake {GPU_TYPE}, time compressed {c}x; "
          "JCTs in trace seconds")
    head = f"{'policy':<8} {'sim mean JCT':>13} {'meshd mean JCT':>15} {'diff':>7} {'same start order':>17} " \
           f"{'|job diff| mean/max':>20} {'preempt sim/meshd':>18} {'shared sim/meshd':>17} {'double runs':>12} " \
           f"{'launch lat.':>12} {'pause lat.':>11} {'vs sim(L=lat.)':>15}"
    print(head)
    for r in results:
        lat = r["launch_latency_trace_s"].get("median", math.nan)
        print(f"{r['policy']:<8} {r['sim_mean_jct']:>13,} {r['meshd_mean_jct']:>15,} {r['mean_jct_rel_diff']:>+7.2%} "
              f"{'yes' if r['same_start_order'] else 'no':>17} "
              f"{r['per_job_abs_rel_diff_mean']:>9.2%}/{r['per_job_abs_rel_diff_max']:>9.2%} "
              f"{r['sim_preemptions']:>8}/{r['meshd_preemptions']:<9} {r['sim_shared_starts']:>8}/{r['meshd_shared_starts']:<8} "
              f"{r['double_runs']:>12} {lat:>12,.0f} {r['pause_latency_trace_s'].get('median', 0):>11,.0f} "
              f"{r['calibrated_rel_diff']:>+8.2%} "
              f"{'same' if r['calibrated_same_start_order'] else 'other':>6}")
        if r["first_order_difference"]:
            print(f"         first start-order difference: {r['first_order_difference']}")
    if args.keep:
        print(f"state kept in {tmp}")


if __name__ == "__main__":
    main()
