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
timed --array-repeat times the same way, and the distinct task ids each answer names are counted; then the same
array's accept and its cancel at meshd (request sent on its socket to answer read, --daemon-repeat times, p50), and
--parallel single `mesh submit`s from --shells shells at once (wall time, CPU per submit). Where `sbatch` is on PATH
(SLURM_CONF, else /tmp/local-slurm's: /work/shared/slurm/start), Slurm's figures are taken the same way after meshd
stops, its GPUs held by one job so that every submit queues as ours do (the fill's blocker holds meshd's); else
they are reported absent (`"slurm": null`). Beside the parallel submits, `python -c pass` (the interpreter `mesh`
runs on) is run --parallel times from the same shells right after them (`python_floor`): the start-up every
`mesh` process pays, whatever it does, under the same load; Slurm's `sbatch` is C (5 ms CPU each).
With --wheel, the `mesh` timed is a regular (non-editable) install of this checkout, as scripts/install-system
installs it: its wheel is built into a temporary venv of the same base interpreter that reaches this
environment's packages (dependencies) through a .pth line. A default editable install (`pip install -e .`)
loads setuptools' path finder at every interpreter start (it imports pathlib, re, urllib.parse, ipaddress: 14-25 ms
CPU here), which a user's install does not, nor the compat-mode editable install .ci/run and scripts/demo make.

    .venv/bin/python benchmarks/cli_speed.py --jobs 4 --repeat 3 --json    # the bulk figures, quickly
Everything started is stopped at the end (the jobs are cancelled, then meshd).
"""

from __future__ import annotations

import argparse
import getpass
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


def start_meshd(tmp: Path, gpus: int, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Client]:
    """A meshd on `gpus` fake GPUs with its state under `tmp` (`env`: its environment, e.g. a PYTHONPATH that
    imports another checkout), once it answers /v1/health."""
    argv = [sys.executable, "-m", "meshsched.daemon.main", "--state-dir", str(tmp / "state"),
            "--runtime-dir", str(tmp / "run"), "--fake-gpus", str(gpus), "--kill-grace", "1"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=open(tmp / "meshd.log", "wb"),  # noqa: SIM115
                            env=env, cwd="/")
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


def array_body(script: str, cwd: str, tasks: int) -> dict:
    """The body `mesh submit --array 0-(tasks-1) SCRIPT` POSTs (its exported environment included)."""
    return {"command": [sys.executable, script], "cwd": cwd, "env": dict(os.environ), "export": "ALL", "gpus": 1,
            "array": f"0-{tasks - 1}", "tasks": tasks}


def time_array_at_daemon(client: Client, body: dict, repeat: int, pid: int | None = None) -> dict:  # body["tasks"]
    """The array's submit and its cancel as meshd answers them (request sent to answer read, on its socket):
    `repeat` times each, every array cancelled before the next is submitted; with meshd's `pid`, also the CPU time
    meshd spent on each (user + system, /proc/PID/stat; steadier than wall time on a busy machine), mean ms."""
    accept, cancel, cpu = [], [], {"accept": [], "cancel": []}
    for _ in range(repeat):
        c0, t0 = _cpu_of(pid), time.perf_counter()
        answer = client.call("POST", "/v1/jobs", {k: v for k, v in body.items() if k != "tasks"})
        accept.append(time.perf_counter() - t0)
        c1, t0 = _cpu_of(pid), time.perf_counter()
        client.call("POST", f"/v1/jobs/{answer['array_id']}/cancel")
        cancel.append(time.perf_counter() - t0)
        cpu["accept"].append(c1 - c0)
        cpu["cancel"].append(_cpu_of(pid) - c1)
    ms = lambda ts: {"p50_ms": round(statistics.median(ts) * 1e3, 1), "min_ms": round(min(ts) * 1e3, 1),
                     "max_ms": round(max(ts) * 1e3, 1)}  # fmt: skip
    out = {"tasks": body["tasks"], "repeat": repeat, "accept": ms(accept), "cancel": ms(cancel)}
    if pid is not None:
        out |= {f"{k}_cpu_ms": round(statistics.mean(v) * 1e3, 1) for k, v in cpu.items()}
    return out


def _cpu_of(pid: int | None) -> float:
    """Seconds of CPU (user + system) process `pid` has used so far (0.0 without a pid)."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parallel_submits(argv: list[str], count: int, shells: int, env: dict[str, str]) -> dict:
    """`count` runs of `argv` from `shells` shells at once (each runs its share one after the other): the wall
    time until the last returned, and the CPU time per run (user + system of the reaped processes)."""
    from concurrent.futures import ThreadPoolExecutor

    shares = [count // shells + (i < count % shells) for i in range(shells)]

    def shell(n: int) -> list[int]:
        return [subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=False).returncode
                for _ in range(n)]

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(shells) as pool:
        codes = [c for share in pool.map(shell, shares) for c in share]
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"submits": count, "shells": shells, "wall_s": round(wall, 2), "cpu_ms_per_submit": round(cpu / count * 1e3, 1),
            "exit_codes": sorted(set(codes))}


def wheel_mesh(tmp: Path) -> Path:
    """This checkout built as a wheel and installed into a fresh venv under `tmp` (made from the base interpreter
    of this one; this environment's site-packages reachable through a .pth line for the dependencies): its `mesh`."""
    import sysconfig
    import venv

    repo, wheels, env = Path(__file__).resolve().parent.parent, tmp / "wheel", tmp / "venv"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(repo)], check=True,
                   stdin=subprocess.DEVNULL)
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "zz_meshsched_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", *map(str, wheels.glob("*.whl"))],
                   check=True, stdin=subprocess.DEVNULL)
    return env / "bin" / "mesh"


def slurm_figures(count: int, shells: int, tasks: int, repeat: int) -> dict | None:
    """The same bulk figures for Slurm (sbatch / scancel on PATH, SLURM_CONF or /tmp/local-slurm's config), its
    GPUs held by one job so that every submit queues, as ours do; None when sbatch is not on this machine."""
    sbatch, scancel = shutil.which("sbatch"), shutil.which("scancel")
    if not sbatch or not scancel:
        return None
    env = dict(os.environ)
    if "SLURM_CONF" not in env and Path("/tmp/local-slurm/etc/slurm.conf").exists():
        env["SLURM_CONF"] = "/tmp/local-slurm/etc/slurm.conf"

    def run(*argv: str) -> tuple[float, str]:
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        return time.perf_counter() - t0, proc.stdout.strip()

    with tempfile.TemporaryDirectory(prefix="mcs-slurm", dir="/tmp") as out:
        _, blocker = run(sbatch, "--parsable", "--gres=gpu:4", "-o", "/dev/null", "--wrap", "sleep 3600")
        try:
            accept, cancel = [], []
            for _ in range(repeat):
                dt, array = run(sbatch, "--parsable", f"--array=0-{tasks - 1}", "--gres=gpu:1", "-o", f"{out}/%A_%a",
                                "--wrap", "true")
                accept.append(dt)
                cancel.append(run(scancel, array.split(";")[0])[0])
            many = parallel_submits([sbatch, "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true"], count, shells, env)
        finally:
            run(scancel, "-u", getpass.getuser())
    return {"array_accept_end_to_end_ms": round(statistics.median(accept) * 1e3, 1),
            "array_cancel_end_to_end_ms": round(statistics.median(cancel) * 1e3, 1), "parallel": many,
            "blocker": blocker}


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
    p.add_argument("--daemon-repeat", type=int, default=9,
                   help="times the array's accept and cancel are timed at meshd's socket (default 9; p50 reported)")
    p.add_argument("--parallel", type=int, default=300, help="single submits run from --shells shells (default 300)")
    p.add_argument("--shells", type=int, default=16, help="shells the --parallel submits run from (default 16)")
    p.add_argument("--wheel", action="store_true",
                   help="time a regular (non-editable) install of this checkout, built as a wheel into a temporary "
                        "venv, as scripts/install-system installs it (instead of --mesh)")
    p.add_argument("--no-slurm", action="store_true", help="do not time Slurm even where sbatch is on PATH")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args()
    if args.jobs <= args.repeat or args.repeat < 1:  # `mesh cancel` cancels a different pending job each round
        raise SystemExit("cli_speed: --repeat must be >= 1 and --jobs more than --repeat")
    with tempfile.TemporaryDirectory(prefix="mcs", dir="/tmp") as name:
        tmp = Path(name)
        if args.wheel:
            args.mesh = wheel_mesh(tmp)
        if args.mesh.exists():
            mesh = [str(args.mesh)]
            python = args.mesh.read_text().splitlines()[0].removeprefix("#!").strip()
        else:
            mesh, python = [sys.executable, "-m", "meshsched.cli.main"], sys.executable
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
            array["at_daemon"] = time_array_at_daemon(client, array_body(str(trivial), name, args.array_tasks),
                                                      args.daemon_repeat, proc.pid)
            array["parallel"] = parallel_submits([*mesh, "submit", str(trivial)], args.parallel, args.shells, env)
            array["parallel"]["python_floor"] = parallel_submits([python, "-c", "pass"], args.parallel, args.shells,
                                                                 env)
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
    slurm = None if args.no_slurm else slurm_figures(args.parallel, args.shells, args.array_tasks, args.array_repeat)
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
              "mesh": " ".join(mesh), "wheel": args.wheel, "squeue": squeue or None, "commands": rows, "array_submit": array,
              "slurm": slurm}
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
    bulk_lines(array, slurm)
    if not squeue:
        print("squeue: not on this machine (Slurm's figures are printed beside ours when it is)")


def bulk_lines(array: dict, slurm: dict | None) -> None:
    """The bulk figures, ours and Slurm's beside them."""
    at, par = array["at_daemon"], array["parallel"]
    print(f"--array 0-{at['tasks'] - 1} at meshd (request to answer): accept p50 {at['accept']['p50_ms']:.1f} ms, "
          f"cancel p50 {at['cancel']['p50_ms']:.1f} ms (of {at['repeat']}; meshd CPU {at.get('accept_cpu_ms', '-')} / "
          f"{at.get('cancel_cpu_ms', '-')} ms); end to end (mesh submit) median "
          f"{array['median_ms']:.1f} ms")
    floor = par["python_floor"]
    print(f"{par['submits']} mesh submit from {par['shells']} shells: {par['wall_s']:.2f} s wall, "
          f"{par['cpu_ms_per_submit']:.1f} ms CPU per submit; exit {','.join(map(str, par['exit_codes']))}; "
          f"`python -c pass` the same way just after: {floor['wall_s']:.2f} s, {floor['cpu_ms_per_submit']:.1f} ms CPU")
    if slurm is None:
        print("Slurm: absent (no sbatch on PATH)")
        return
    sp = slurm["parallel"]
    print(f"Slurm: sbatch --array 0-{at['tasks'] - 1} {slurm['array_accept_end_to_end_ms']:.1f} ms, scancel of it "
          f"{slurm['array_cancel_end_to_end_ms']:.1f} ms; {sp['submits']} sbatch from {sp['shells']} shells "
          f"{sp['wall_s']:.2f} s wall ({sp['cpu_ms_per_submit']:.1f} ms CPU each); ours / Slurm's: "
          f"{par['wall_s'] / sp['wall_s']:.2f}x")


if __name__ == "__main__":
    main()
