"""meshd speed figures (printed, never asserted): submit-to-RUNNING latency, job-socket round trip, `mesh ls`.

    .venv/bin/python benchmarks/daemon_bench.py [--submits 100] [--pings 5000] [--jobs 1000]

1. submit -> RUNNING on an idle node: wall time of POST /v1/jobs over the Unix socket to a real meshd
   process until the job is RUNNING (the reply already says so: the supervisor is spawned and the
   transition journalled before meshd answers). The job's own start-up (interpreter, imports) is excluded.
2. job-socket round trip: a job process sends `ping` frames over MESH_SOCKET and times each reply.
3. `mesh ls` with N jobs in the journal: the state dir is seeded with N finished job records before meshd
   starts (a benchmark fixture, not something meshd's users do); timed end to end as a subprocess, and
   the API call alone.
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
import time
from pathlib import Path

from meshsched.cli.client import Client, DaemonUnavailable
from meshsched.daemon.journal import Journal, JobRecord


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def start_meshd(state: Path, runtime: Path) -> tuple[subprocess.Popen, Client]:
    argv = [sys.executable, "-m", "meshsched.daemon.main", "--state-dir", str(state), "--runtime-dir", str(runtime),
            "--fake-gpus", "8", "--kill-grace", "1"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = Client(runtime / "api.sock")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            client.call("GET", "/v1/health")
            return proc, client
        except DaemonUnavailable:
            time.sleep(0.05)
    raise SystemExit("meshd did not start")


def wait_done(client: Client, job_id: str) -> None:
    while client.call("GET", f"/v1/jobs/{job_id}")["state"] not in ("COMPLETED", "FAILED", "CANCELLED"):
        time.sleep(0.01)


def bench_submit(client: Client, n: int) -> None:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        job = client.call("POST", "/v1/jobs", {"command": ["/bin/true"], "cwd": "/tmp", "gpus": 1})
        lat.append((time.perf_counter() - t0) * 1e3)
        assert job["state"] == "RUNNING", job["state"]
        wait_done(client, job["job_id"])
    print(f"submit -> RUNNING (idle node, n={n}): p50 {pct(lat, 50):.2f} ms  p99 {pct(lat, 99):.2f} ms  "
          f"max {max(lat):.2f} ms   (target p50 < 50 ms)")


PINGER = """
import json, time
from meshsched.job.client import JobClient
c = JobClient.from_env()
for _ in range(200):
    c.request({"type": "ping"})
lat = []
for _ in range(N):
    t0 = time.perf_counter()
    c.request({"type": "ping"})
    lat.append((time.perf_counter() - t0) * 1e6)
print(json.dumps(lat))
"""


def bench_socket(client: Client, n: int, state: Path) -> None:
    job = client.call("POST", "/v1/jobs", {"command": [sys.executable, "-c", PINGER.replace("N", str(n))],
                                           "cwd": "/tmp", "gpus": 1})
    wait_done(client, job["job_id"])
    lat = json.loads((state / "jobs" / job["job_id"] / "logs" / "rank0.log").read_text())
    print(f"job-socket round trip (ping, n={n}): p50 {pct(lat, 50):.0f} us  p99 {pct(lat, 99):.0f} us  "
          f"mean {statistics.mean(lat):.0f} us   (target p99 < 1 ms)")


def seed(state: Path, n: int) -> None:
    journal = Journal(state / "journal.sqlite")
    now = time.time()
    with journal.batch():
        for i in range(1, n + 1):
            journal.put(JobRecord(
                job_id=str(i), seq=i, gpus=1 + i % 4, model="custom", batch_size=32, iterations=100,
                submit_time=now - 3600, name=f"job{i}", user="bench", deadline=None, guaranteed=False,
                command=["python", "train.py"], cwd="/tmp", env={}, job_dir=str(state / "jobs" / str(i)),
                state="COMPLETED", start_time=now - 3000, end_time=now - 2000, assigned=[0],
            ))
            journal.transition(str(i), now, "COMPLETED", "")
    for _ in range(n):
        journal.next_seq()
    journal.close()


def bench_ls(client: Client, runtime: Path, n: int) -> None:
    env = dict(os.environ, MESH_API_SOCKET=str(runtime / "api.sock"),
               PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))  # the venv active
    for args in (["ls"], ["ls", "--all"], ["ls", "--all", "--json"]):
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "meshsched.cli.main", *args], env=env, capture_output=True)
            times.append((time.perf_counter() - t0) * 1e3)
            assert out.returncode == 0, out.stderr
        print(f"mesh {' '.join(args):<16} ({n} jobs in the journal): median {statistics.median(times):.0f} ms "
              "(end to end, incl. interpreter start)   (target < 300 ms)")
    api = []
    for _ in range(20):
        t0 = time.perf_counter()
        client.call("GET", "/v1/jobs?all=1")
        api.append((time.perf_counter() - t0) * 1e3)
    print(f"GET /v1/jobs?all=1 ({n} jobs): median {statistics.median(api):.1f} ms")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import meshsched.cli.main"], check=True)
    print(f"  for scale: `import meshsched.cli.main` alone takes {(time.perf_counter() - t0) * 1e3:.0f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--submits", type=int, default=100)
    p.add_argument("--pings", type=int, default=5000)
    p.add_argument("--jobs", type=int, default=1000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="mdb", dir="/tmp") as tmp:
        state, runtime = Path(tmp) / "s", Path(tmp) / "r"
        state.mkdir()
        seed(state, args.jobs)
        proc, client = start_meshd(state, runtime)
        try:
            bench_submit(client, args.submits)
            bench_socket(client, args.pings, state)
            bench_ls(client, runtime, args.jobs + args.submits + 1)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)


if __name__ == "__main__":
    main()
