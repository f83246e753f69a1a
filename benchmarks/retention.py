"""meshd's memory and `mesh ls` time as finished jobs pile up, with retention on (and off, for comparison).

    .venv/bin/python benchmarks/retention.py [--sizes 1000,5000,10000,20000] [--repeat 5] [--json]

For each size N a fresh state dir gets N finished jobs written straight into its journal (records and their
transitions, as meshd writes them; faster than running N jobs): N - RECENT ended two days ago and RECENT (200)
in the last hour, 1-4 GPUs each. Then a real meshd (8 fake GPUs) starts on it with `--keep-finished 86400`
(retention on: the first sweep, a second after start, forgets the N - RECENT old ones through the engine) or
`--keep-finished 0` (off: it keeps all N). Once the sweep is done (`mesh ls --all --json` lists RECENT jobs) the
figures are taken: meshd's RSS (VmRSS), and the median wall time of `mesh ls` and `mesh ls --all` run as whole
processes (`--repeat` times each, output read through a pipe), plus how long the sweep took, the journal's size and
the accounting rows (`mesh acct --summary --json`'s job count: the records written here have none, so the sweep
writes one for each job it forgets, N - RECENT; off, none).
Then meshd is started again on what the sweep left and its RSS and `ls --all` time taken once more ("again"): a
meshd whose sweeps kept up never held the N records at once, while the first start read them all (and CPython keeps
the memory it once took). With retention on, `ls` and `ls --all` stay flat from 1,000 to 20,000, and so does the
RSS "again"; off, `ls --all` and the RSS grow with N.
The scripted day of 200 jobs whose `mesh acct --summary` equals their own start/end records before and after
retention is tests/daemon/test_accounting.py (a fake clock, meshd's own EngineLoop, journal and accounting).
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
from meshsched.daemon.journal import JobRecord, Journal

RECENT = 200
MESH = [sys.executable, "-m", "meshsched.cli.main"]


def fill(state: Path, n: int, now: float) -> None:
    """`n` finished job records (and their transitions) in a new journal under `state`."""
    journal = Journal(state / "journal.sqlite")
    with journal.batch():
        for i in range(1, n + 1):
            end = now - (3600 * (i % 50) / 50 if i > n - RECENT else 2 * 86400 + i)
            start, gpus = end - 600 - i % 300, 1 + i % 4
            rec = JobRecord(job_id=str(i), seq=i, gpus=gpus, model="custom", batch_size=32, iterations=100,
                            submit_time=start - 30, name=f"bench-{i}", user="bench" if i % 2 else "other",
                            deadline=None, guaranteed=False, command=["/bin/true"], cwd="/", env={},
                            job_dir=str(state / "jobs" / str(i)), state="COMPLETED", assigned=list(range(gpus)),
                            restarts=1, done_iterations=100.0, start_time=start, end_time=end, exit_code=0)
            rec.ran = end - start
            journal.put(rec)
            for t, s in ((start - 30, "PENDING"), (start, "LOADING"), (start + 1, "RUNNING"), (end, "COMPLETED")):
                journal.transition(rec.job_id, t, s, "")
    journal.next_seq(n + 1)
    journal.close()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def timed(argv: list[str], env: dict, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(n: int, keep: float, repeat: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="mdret", dir="/tmp"))
    state, run = tmp / "state", tmp / "run"
    state.mkdir()
    fill(state, n, time.time())
    argv = [sys.executable, "-m", "meshsched.daemon.main", "--state-dir", str(state), "--runtime-dir", str(run),
            "--fake-gpus", "8", "--keep-finished", str(keep), "--keep-job-dirs", "0"]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=open(tmp / "meshd.log", "wb"))
    env = dict(os.environ, MESH_API_SOCKET=str(run / "api.sock"))
    client = Client(run / "api.sock", timeout=60.0)
    try:
        want = RECENT if keep else n
        deadline = time.monotonic() + 300
        while True:
            try:
                if len(client.call("GET", "/v1/jobs?all=1")) == want:
                    break
            except DaemonUnavailable:
                if proc.poll() is not None:
                    raise SystemExit(f"meshd exited: {(tmp / 'meshd.log').read_text()}") from None
            if time.monotonic() > deadline:
                raise SystemExit(f"meshd did not list {want} jobs within 300 s")
            time.sleep(0.1)
        ready = time.monotonic() - t0
        acct = client.call("GET", "/v1/acct?summary=1")["total"]["jobs"]
        out = {"finished": n, "retention": bool(keep), "listed": want, "ready_s": round(ready, 2),
               "rss_mb": round(rss_kb(proc.pid) / 1024, 1),
               "ls_s": round(timed(MESH + ["ls"], env, repeat), 3),
               "ls_all_s": round(timed(MESH + ["ls", "--all"], env, repeat), 3),
               "acct_rows": acct,
               "journal_mb": round(sum(p.stat().st_size for p in state.glob("journal.sqlite*")) / 2**20, 2)}
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        # meshd started again on what the sweep left: the memory of a meshd whose sweeps kept up (the first start
        # read all N records, and Python keeps the memory it once took)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=open(tmp / "meshd2.log", "wb"))
        while True:
            try:
                if len(client.call("GET", "/v1/jobs?all=1")) == want:
                    break
            except DaemonUnavailable:
                if proc.poll() is not None:
                    raise SystemExit(f"meshd exited: {(tmp / 'meshd2.log').read_text()}") from None
            time.sleep(0.1)
        out["rss_restarted_mb"] = round(rss_kb(proc.pid) / 1024, 1)
        out["ls_all_restarted_s"] = round(timed(MESH + ["ls", "--all"], env, repeat), 3)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,5000,10000,20000")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--no-compare", action="store_true", help="retention on only (skip the runs with it off)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        for keep in (86400.0,) if args.no_compare else (86400.0, 0.0):
            rows.append(measure(n, keep, args.repeat))
            if not args.json:
                print(f"measured {n} ({'on' if keep else 'off'})", file=sys.stderr)
    if args.json:
        print(json.dumps(rows))
        return
    head = ("FINISHED", "RETENTION", "LISTED", "RSS MB", "LS s", "LS --ALL s", "ACCT ROWS", "JOURNAL MB", "READY s",
            "RSS AGAIN", "LS --ALL AGAIN")
    print("  ".join(f"{h:>10}" for h in head))
    for r in rows:
        cells = (r["finished"], "on" if r["retention"] else "off", r["listed"], r["rss_mb"], r["ls_s"], r["ls_all_s"],
                 r["acct_rows"], r["journal_mb"], r["ready_s"], r["rss_restarted_mb"], r["ls_all_restarted_s"])
        print("  ".join(f"{c:>10}" for c in cells))


if __name__ == "__main__":
    main()
