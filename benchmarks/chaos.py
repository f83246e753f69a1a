"""Chaos: a real meshd on fake GPUs runs short real jobs while meshd, job supervisors and single ranks are
SIGKILLed at random moments; then it counts what went wrong.

    python benchmarks/chaos.py [--quick] [--json] [--seed N]
    python benchmarks/chaos.py --storage [storage_chaos.py's options]   (the state disk and the journal: see there)

Every rank of the fake job writes a ledger file (job, restart, rank, GPU, pid, start time) and touches it every
50 ms while it runs, so [start, last touch] is when that process surely held its GPU (a SIGKILLed process is
under-counted by at most 50 ms). Some jobs also leave a background child behind. Reported:

  jobs_lost                jobs submitted that meshd forgot or never brought to an end state
  ran_twice                jobs with two runs (restarts) whose processes were alive at the same time
  double_held_gpu_seconds  seconds during which processes of two different jobs held one GPU (no colocation
                           sets here: the policy is sjf)
  left_behind              processes of the run (found by an environment marker) alive once every job ended

Targets: all four zero. Killing a rank or a supervisor fails that job (FAILED): that is the expected outcome,
not a loss; killing meshd must lose nothing (jobs are re-adopted or requeued).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from meshsched.cli.client import ApiError, Client, DaemonUnavailable

GPUS = 4
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
JOB_SCRIPT = """\
import os, subprocess, sys, time
ledger, seconds = sys.argv[1], float(sys.argv[2])
job, restart, rank = os.environ["MESH_JOB_ID"], os.environ["MESH_RESTART_COUNT"], os.environ["RANK"]
path = os.path.join(ledger, f"{job}-{restart}-{rank}-{os.getpid()}")
with open(path, "w") as f:
    f.write(f"{job} {restart} {rank} {os.environ['CUDA_VISIBLE_DEVICES']} {os.getpid()} {time.time()}\\n")
if int(job) % 3 == 0:
    subprocess.Popen(["sleep", "600"])  # a background child the script never waits for
ck = os.path.join(os.environ["MESH_CHECKPOINT_DIR"], "done")
try:
    done = float(open(ck).read())
except (OSError, ValueError):
    done = 0.0
while done < seconds:
    time.sleep(0.05)
    done += 0.05
    os.utime(path)
    if rank == "0":
        with open(ck + ".tmp", "w") as f:
            f.write(str(done))
        os.replace(ck + ".tmp", ck)
os.utime(path)
"""


@dataclass(frozen=True, slots=True)
class Interval:
    job: str
    restart: int
    rank: int
    gpu: int
    pid: int
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Result:
    jobs: int
    kills: dict[str, int]
    jobs_lost: int
    ran_twice: int
    double_held_gpu_seconds: float
    left_behind: int
    completed: int
    failed: int
    wall_seconds: float
    targets_met: bool
    overlaps: list[str]  # what ran twice or shared a GPU, for diagnosis (empty when the targets are met)


class Meshd:
    def __init__(self, root: Path, runtime: Path, env: dict[str, str]) -> None:
        self.root, self.runtime, self.env = root, runtime, env
        self.client = Client(runtime / "api.sock", timeout=5.0)
        self.proc: subprocess.Popen | None = None
        self.log = open(root / "meshd.log", "ab")

    def start(self) -> None:
        argv = [sys.executable, "-m", "meshsched.daemon.main", "--state-dir", str(self.root / "state"),
                "--runtime-dir", str(self.runtime), "--fake-gpus", str(GPUS), "--kill-grace", "1",
                "--node-name", "chaos", "--policy", "sjf"]
        self.proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.client.call("GET", "/v1/health")["status"] == "running":
                    return
            except (DaemonUnavailable, ApiError, OSError):
                pass
            if self.proc.poll() is not None:
                raise SystemExit(f"chaos: meshd exited with {self.proc.returncode}; see {self.root / 'meshd.log'}")
            time.sleep(0.05)
        raise SystemExit("chaos: meshd did not start within 30 s")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)
        self.log.close()

    def call(self, method: str, url: str, body=None, patience: float = 60.0):
        """An API call that waits out a meshd restart."""
        deadline = time.monotonic() + patience
        while True:
            try:
                return self.client.call(method, url, body)
            except (DaemonUnavailable, ConnectionError, OSError, ApiError) as exc:
                if isinstance(exc, ApiError) and exc.status < 500:
                    raise
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _is_rank(pid: int) -> bool:
    try:
        return b"chaos_job.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def marked_processes(marker: bytes) -> list[int]:
    """Live processes whose environment holds `marker` (this run's), zombies excluded."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker not in Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0"):
                continue
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] != "Z":
            out.append(int(entry.name))
    return out


def read_ledger(folder: Path) -> list[Interval]:
    out = []
    for f in folder.iterdir():
        try:
            job, restart, rank, gpu, pid, start = f.read_text().split()[:6]
            end = f.stat().st_mtime
        except (OSError, ValueError):
            continue
        out.append(Interval(job, int(restart), int(rank), int(gpu), int(pid), float(start), max(float(start), end)))
    return out


def overlap(a: Interval, b: Interval) -> float:
    return max(0.0, min(a.end, b.end) - max(a.start, b.start))


def measure(intervals: list[Interval]) -> tuple[int, float, list[str]]:
    """(jobs with two runs alive at once, GPU-seconds two different jobs held one GPU, what overlapped)."""
    twice: set[str] = set()
    shared = 0.0
    what: list[str] = []
    for i, a in enumerate(intervals):
        for b in intervals[i + 1 :]:
            o = overlap(a, b)
            if o <= 0:
                continue
            if a.job == b.job and a.restart != b.restart:
                twice.add(a.job)
                what.append(f"job {a.job} runs {a.restart} and {b.restart} overlapped {o:.3f} s")
            if a.job != b.job and a.gpu == b.gpu:
                shared += o
                what.append(f"GPU {a.gpu}: job {a.job}.{a.restart} (pid {a.pid}, {a.start:.3f}-{a.end:.3f}) and "
                            f"job {b.job}.{b.restart} (pid {b.pid}, {b.start:.3f}-{b.end:.3f}) overlapped {o:.3f} s")
    return len(twice), shared, what


def watch_sharing(meshd: Meshd, seen: list[str]) -> None:
    """Note (once per pair) a GPU meshd's engine gives to two jobs at once, with their decision logs."""
    try:
        node = meshd.client.call("GET", "/v1/nodes")[0]
    except (DaemonUnavailable, ApiError, OSError):
        return
    for g in node["gpus"]:
        if len(g["jobs"]) > 1:
            key = f"engine put jobs {g['jobs']} on GPU {g['index']}"
            if not any(x.startswith(key) for x in seen):
                logs = []
                for j in g["jobs"]:
                    try:
                        logs += [f"{j}: {e['message']}" for e in meshd.client.call("GET", f"/v1/jobs/{j}/explain")]
                    except (DaemonUnavailable, ApiError, OSError):
                        pass
                seen.append(key + " | " + " ; ".join(logs[-12:]))


def run(n_jobs: int, n_kills: int, seed: int, budget: float) -> Result:
    rng = random.Random(seed)
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="chaos-"))
    runtime = Path(tempfile.mkdtemp(prefix="ch", dir="/tmp"))
    ledger = root / "ledger"
    ledger.mkdir()
    script = root / "chaos_job.py"
    script.write_text(JOB_SCRIPT)
    marker = f"MESH_CHAOS_RUN={uuid.uuid4().hex}"
    env = dict(os.environ, MESHD_SYSTEMD_SCOPE="no", MESH_CHAOS_RUN=marker.partition("=")[2])
    meshd = Meshd(root, runtime, env)
    meshd.start()
    kinds = ["meshd"] * max(1, n_kills // 4) + ["supervisor"] * (n_kills * 2 // 5)
    kinds += ["rank"] * (n_kills - len(kinds))
    rng.shuffle(kinds)
    kills = {"meshd": 0, "supervisor": 0, "rank": 0}
    names = [f"chaos-{i}" for i in range(n_jobs)]
    try:
        for i, name in enumerate(names):  # all at once: meshd queues them
            body = {"command": [sys.executable, str(script), str(ledger), f"{rng.uniform(0.8, 2.5):.2f}"],
                    "cwd": str(root), "gpus": rng.choice([1, 1, 2, 2, 4]), "iterations": 10 + i, "name": name}
            meshd.call("POST", "/v1/jobs", body)
        # kills at random moments over the stretch the workload is expected to run
        stretch = max(5.0, n_jobs * 0.9)
        at = sorted(rng.uniform(1.0, stretch) for _ in kinds)
        start = time.monotonic()
        shared_seen: list[str] = []
        for when, kind in zip(at, kinds):
            while time.monotonic() < start + when:
                watch_sharing(meshd, shared_seen)
                time.sleep(0.05)
            if kind == "meshd":
                meshd.kill()
                time.sleep(rng.uniform(0.0, 0.5))  # jobs end, supervisors die while meshd is down
                meshd.start()
                kills["meshd"] += 1
                continue
            for _ in range(100):  # find a running job to hit (up to 10 s)
                running = [j for j in meshd.call("GET", "/v1/jobs?all=0")
                           if j["state"] == "RUNNING" and j["supervisor_pid"]]
                targets = []
                for j in running:
                    sup = j["supervisor_pid"]
                    targets += [sup] if kind == "supervisor" else [p for p in _children(sup) if _is_rank(p)]
                if targets:
                    try:
                        os.kill(rng.choice(targets), signal.SIGKILL)
                        kills[kind] += 1
                        break
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)
        # wait for every job to end
        deadline = t0 + budget
        while True:
            watch_sharing(meshd, shared_seen)
            jobs = meshd.call("GET", "/v1/jobs?all=1")
            if all(j["state"] in TERMINAL for j in jobs) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        left = [p for p in marked_processes(marker.encode()) if p != meshd.proc.pid]
        by_name: dict[str, list[dict]] = {}
        for j in jobs:
            by_name.setdefault(j["name"], []).append(j)
        lost = sum(1 for n in names if not any(j["state"] in TERMINAL for j in by_name.get(n, [])))
        twice, shared, what = measure(read_ledger(ledger))
        involved = sorted({w.split()[3].split(".")[0] for w in what if w.startswith("GPU")}
                          | {w.split()[1] for w in what if w.startswith("job")})
        for j in involved[:6]:  # their state history, on the ledger's clock
            hist = meshd.call("GET", f"/v1/jobs/{j}").get("history", [])
            what.append(f"job {j}: " + ", ".join(f"{t:.3f} {st} {why[:50]}" for t, st, why in hist))
        what = shared_seen + what
        completed = sum(1 for j in jobs if j["state"] == "COMPLETED")
        failed = sum(1 for j in jobs if j["state"] == "FAILED")
    finally:
        meshd.stop()
        if os.environ.get("CHAOS_KEEP"):  # keep meshd's log and the state dir to diagnose a failed run
            print(f"chaos: kept {root}", file=sys.stderr)
            root = Path("/nonexistent-kept")
        for pid in marked_processes(marker.encode()):  # leave nothing behind, whatever happened
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(runtime, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    return Result(
        jobs=n_jobs, kills=kills, jobs_lost=lost, ran_twice=twice, double_held_gpu_seconds=round(shared, 3),
        left_behind=len(left), completed=completed, failed=failed, wall_seconds=round(time.monotonic() - t0, 1),
        targets_met=lost == 0 and twice == 0 and shared == 0 and not left, overlaps=what[:20],
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--storage" in argv:  # the storage chaos run (benchmarks/storage_chaos.py), which shares this file's code
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import storage_chaos

        storage_chaos.main([a for a in argv if a != "--storage"])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--storage", action="store_true", help="run benchmarks/storage_chaos.py instead")
    p.add_argument("--quick", action="store_true", help="20 jobs, 8 kills (about a minute)")
    p.add_argument("--jobs", type=int, default=None, help="jobs to run (default 50, quick 20)")
    p.add_argument("--kills", type=int, default=None, help="SIGKILLs in all (default 20, quick 8)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budget", type=float, default=None, help="give up waiting after this many seconds")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    jobs = args.jobs or (20 if args.quick else 50)
    kills = args.kills or (8 if args.quick else 20)
    res = run(jobs, kills, args.seed, args.budget or (120.0 if args.quick else 300.0))
    if args.json:
        print(json.dumps(asdict(res)))
        return
    rows = [("jobs", res.jobs), ("kills (meshd/supervisor/rank)",
                                 f"{res.kills['meshd']}/{res.kills['supervisor']}/{res.kills['rank']}"),
            ("jobs lost", res.jobs_lost), ("jobs that ran twice at once", res.ran_twice),
            ("GPU-seconds held by two jobs", res.double_held_gpu_seconds), ("processes left behind", res.left_behind),
            ("completed / failed", f"{res.completed} / {res.failed}"), ("wall seconds", res.wall_seconds),
            ("all four targets zero", res.targets_met)]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for line in res.overlaps:
        print(f"  {line}")


if __name__ == "__main__":
    main()
