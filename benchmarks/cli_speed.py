"""How fast the common `mesh` commands are, end to end, against the interpreter's own start-up.

    .venv/bin/python benchmarks/cli_speed.py [--jobs 1000] [--repeat 15] [--json]

Starts a meshd with fake GPUs in a temporary directory, fills it with `--jobs` unfinished jobs through the
API (one running job holding every GPU, the rest PENDING behind it), then times each command as a whole
process (interpreter start, imports, the request, the output read through a pipe) in interleaved rounds:
every round runs `python -c pass` (the same interpreter the `mesh` script runs on) and each command once,
so a drift in the machine's speed hits all of them alike. They run as from a user's shell: without
PYTHONDONTWRITEBYTECODE / PYTHONUNBUFFERED, after one untimed warm-up round (bytecode cached). Reported: the
median wall time of each, the median over rounds of its time divided by the same round's `python -c pass`, and
the median CPU time (user + system of the reaped process; steadier than wall time on a busy machine) with its
ratio to `python -c pass`'s.
If `squeue` is on PATH, it is timed the same way beside ours (against whatever Slurm it talks to).
After the rounds, `mesh submit --array 0-(N-1) --json` (N = --array-tasks, one request for the whole array) is
timed --array-repeat times the same way, and the distinct task ids each answer names are counted.
Everything started is stopped at the end (the jobs are cancelled, then meshd).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from meshsched.cli.client import Client, DaemonUnavailable


def start_meshd(tmp: Path, gpus: int) -> tuple[subprocess.Popen, Client]:
    argv = [sys.executable, "-m", "meshsched.daemon.main", "--state-dir", str(tmp / "state"),
            "--runtime-dir", str(tmp / "run"), "--fake-gpus", str(gpus), "--kill-grace", "1"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=open(tmp / "meshd.log", "wb"))
    client = Client(tmp / "run" / "api.sock")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            client.call("GET", "/v1/health")
            return proc, client
        except DaemonUnavailable:
            if proc.poll() is not None:
                raise SystemExit(f"meshd exited: {(tmp / 'meshd.log').read_text()}")
            time.sleep(0.05)
    raise SystemExit("meshd did not start within 60 s")


def fill(client: Client, n: int, gpus: int, cwd: str) -> list[str]:
    """One job holding every GPU, then n - 1 one-GPU jobs that wait behind it; returns their ids."""
    ids = [client.call("POST", "/v1/jobs", {"command": ["sleep", "3600"], "cwd": cwd, "gpus": gpus,
                                            "name": "blocker"})["job_id"]]
    for i in range(n - 1):
        ids.append(client.call("POST", "/v1/jobs", {"command": ["true"], "cwd": cwd, "gpus": 1,
                                                    "name": f"queued-{i}"})["job_id"])
    return ids


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system, the OS's accounting of the reaped child) and exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.returncode


def time_array(mesh: list[str], script: str, tasks: int, repeat: int, env: dict[str, str]) -> dict:
    """`mesh submit --array 0-(tasks-1) --json`, end to end, `repeat` times; the distinct ids each answer names."""
    times, distinct, codes = [], [], set()
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run([*mesh, "submit", "--array", f"0-{tasks - 1}", "--json", script], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, check=False)
        times.append(time.perf_counter() - t0)
        codes.add(proc.returncode)
        try:
            distinct.append(len(set(json.loads(proc.stdout)["job_ids"])))
        except (ValueError, KeyError):
            distinct.append(0)
    return {"tasks": tasks, "repeat": repeat, "median_ms": round(statistics.median(times) * 1e3, 1),
            "min_ms": round(min(times) * 1e3, 1), "max_ms": round(max(times) * 1e3, 1), "distinct_ids": distinct,
            "exit_codes": sorted(codes)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=1000, help="unfinished jobs in meshd while timing (default 1000)")
    p.add_argument("--repeat", type=int, default=15, help="rounds (each runs every command once)")
    p.add_argument("--gpus", type=int, default=4, help="fake GPUs")
    p.add_argument("--mesh", type=Path, default=Path(sys.executable).parent / "mesh",
                   help="the `mesh` script to time (default: the one beside this interpreter); `python -c pass` "
                        "runs on the interpreter its first line names")
    p.add_argument("--array-tasks", type=int, default=300, help="tasks of the timed `mesh submit --array` (default 300)")
    p.add_argument("--array-repeat", type=int, default=3, help="times the array submit is timed (default 3)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args()
    if args.jobs < 2 or args.repeat < 1:
        raise SystemExit("cli_speed: --jobs must be >= 2 and --repeat >= 1")
    if args.mesh.exists():
        mesh = [str(args.mesh)]
        python = args.mesh.read_text().splitlines()[0].removeprefix("#!").strip()
    else:
        mesh, python = [sys.executable, "-m", "meshsched.cli.main"], sys.executable
    with tempfile.TemporaryDirectory(prefix="mcs", dir="/tmp") as name:
        tmp = Path(name)
        trivial = tmp / "trivial.py"
        trivial.write_text("pass\n")
        proc, client = start_meshd(tmp, args.gpus)
        try:
            t0 = time.perf_counter()
            ids = fill(client, args.jobs, args.gpus, name)
            fill_s = time.perf_counter() - t0
            victims = iter(ids[1 : args.repeat + 1])  # `mesh cancel` cancels a different pending job each round
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")}
            env["MESH_API_SOCKET"] = str(tmp / "run" / "api.sock")
            mid = ids[len(ids) // 2]
            commands: dict[str, object] = {
                "python -c pass": [python, "-c", "pass"],
                f"mesh ls ({args.jobs} jobs)": [*mesh, "ls"],
                f"mesh ls --json ({args.jobs} jobs)": [*mesh, "ls", "--json"],
                "mesh submit": [*mesh, "submit", str(trivial)],
                "mesh show": [*mesh, "show", mid],
                "mesh cancel (a pending job)": lambda: [*mesh, "cancel", next(victims)],
                "mesh logs": [*mesh, "logs", ids[0]],
                "mesh nodes": [*mesh, "nodes"],
                "mesh --help (typer)": [*mesh, "--help"],
            }
            squeue = shutil.which("squeue")
            if squeue:
                commands["squeue (Slurm)"] = [squeue]
            times: dict[str, list[float]] = {k: [] for k in commands}
            cpus: dict[str, list[float]] = {k: [] for k in commands}
            codes: dict[str, set[int]] = {k: set() for k in commands}
            for label, argv in commands.items():  # warm-up, not timed: writes the bytecode caches
                if not callable(argv):
                    run_once(argv, env)
            for _ in range(args.repeat):
                for label, argv in commands.items():
                    dt, cpu, rc = run_once(argv() if callable(argv) else argv, env)
                    times[label].append(dt)
                    cpus[label].append(cpu)
                    codes[label].add(rc)
            array = time_array(mesh, str(trivial), args.array_tasks, args.array_repeat, env)
        finally:
            for job in client.call("GET", "/v1/jobs?all=0"):
                if job["state"] in ("LOADING", "RUNNING", "PAUSING"):
                    client.call("POST", f"/v1/jobs/{job['job_id']}/cancel")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and any(
                j["supervisor_pid"] for j in client.call("GET", "/v1/jobs?all=1")
            ):  # fmt: skip
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
    base, base_cpu = times["python -c pass"], statistics.median(cpus["python -c pass"])
    rows = []
    for label, ts in times.items():
        ratios = [t / b for t, b in zip(ts, base)]
        cpu = statistics.median(cpus[label])
        rows.append({"command": label, "median_ms": round(statistics.median(ts) * 1e3, 1),
                     "min_ms": round(min(ts) * 1e3, 1), "max_ms": round(max(ts) * 1e3, 1),
                     "ratio_to_python": round(statistics.median(ratios), 2), "cpu_ms": round(cpu * 1e3, 1),
                     "cpu_ratio_to_python": round(cpu / base_cpu, 2) if base_cpu else None,
                     "exit_codes": sorted(codes[label])})
    report = {"jobs": args.jobs, "rounds": args.repeat, "fill_seconds": round(fill_s, 2), "python": python,
              "mesh": " ".join(mesh), "squeue": squeue or None, "commands": rows, "array_submit": array}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.jobs} unfinished jobs (filled through the API in {fill_s:.1f} s); {args.repeat} interleaved rounds;"
          f" times end to end, output read through a pipe")
    print(f"{'command':<32} {'wall ms':>8} {'min':>6} {'max':>6} {'x python':>8} {'cpu ms':>7} {'x python':>8}  exit")
    for r in rows:
        cpu_ratio = f"{r['cpu_ratio_to_python']:.2f}" if r["cpu_ratio_to_python"] else "-"
        print(f"{r['command']:<32} {r['median_ms']:>8.1f} {r['min_ms']:>6.1f} {r['max_ms']:>6.1f} "
              f"{r['ratio_to_python']:>8.2f} {r['cpu_ms']:>7.1f} {cpu_ratio:>8}  {','.join(map(str, r['exit_codes']))}")
    print(f"mesh submit --array 0-{array['tasks'] - 1} (one request): median {array['median_ms']:.1f} ms, min "
          f"{array['min_ms']:.1f}, max {array['max_ms']:.1f} over {array['repeat']}; distinct task ids per answer: "
          f"{','.join(map(str, array['distinct_ids']))}; exit {','.join(map(str, array['exit_codes']))}")
    if not squeue:
        print("squeue: not on this machine (Slurm's figures are printed beside ours when it is)")


if __name__ == "__main__":
    main()
