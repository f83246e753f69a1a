"""Storage chaos: a real meshd whose state dir is a small tmpfs runs short real jobs while the disk is filled to
ENOSPC at random moments, meshd is SIGKILLed, and between restarts its journal is moved aside, emptied,
corrupted or its WAL cut short; then it counts what went wrong.

    python benchmarks/storage_chaos.py [--seed N] [--jobs N] [--json]     (also: benchmarks/chaos.py --storage)

Needs to mount a tmpfs (root or CAP_SYS_ADMIN); says so in one line and exits 0 where it cannot.

Each job writes its own ground truth outside the state dir: an append-only file per job name with a `start` line
per run (job id, restart, pid; by rank 0) and an `end` line per rank with the exit code it really returned (jobs whose index is 3 mod
4 exit 3, the others 0); every rank also keeps a ledger interval as in benchmarks/chaos.py. The submitter acts as
a pipeline and an operator would: when meshd refuses to start on a damaged journal it moves the journal aside (as
meshd's one line advises) and starts it again; a job the damaged journal no longer knows (404) and that it never
saw end is submitted again under the same name. Reported:

  jobs_lost                job names none of whose meshd jobs was seen in an end state (at the finish, or by the
                           pipeline before a damaged journal dropped it)
  ran_twice                job names whose runs (any id, any restart) were alive at the same time, plus meshd jobs
                           that ran again after a run of theirs really ended (a `start` after an `end` of one job id)
  double_held_gpu_seconds  seconds during which processes of two different jobs held one GPU
  left_behind              processes of the run (found by an environment marker) alive once every job ended
  wrong_ends               meshd jobs whose recorded end differs from the ground truth: COMPLETED without an exit
                           0, FAILED with another code, an end with no `end` line, or one id given to two names
  redone_after_discard     (not a target) names resubmitted after a damaged journal dropped them that had in fact
                           already ended: the record of that end went with the journal the operator discarded

Targets: the first five zero.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos import TERMINAL, Interval, Meshd, marked_processes, overlap
from meshsched.cli.client import ApiError, DaemonUnavailable

TMPFS_MB = 8
DAMAGES = ("none", "none", "moved-aside", "emptied", "wal-cut", "corrupted")
JOB_SCRIPT = """\
import os, subprocess, sys, time
ledger, name, seconds, code = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
job, restart, rank = os.environ["MESH_JOB_ID"], os.environ["MESH_RESTART_COUNT"], os.environ["RANK"]
truth = os.path.join(ledger, "truth-" + name)
def say(line):
    fd = os.open(truth, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (line + "\\n").encode())
    os.close(fd)
path = os.path.join(ledger, f"{job}-{restart}-{rank}-{os.getpid()}")
with open(path, "w") as f:
    f.write(f"{job} {restart} {rank} {os.environ['CUDA_VISIBLE_DEVICES']} {os.getpid()} {time.time()} {name}\\n")
if rank == "0":
    say(f"start {job} {restart} {os.getpid()} {time.time()}")
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
        try:  # the checkpoint is on meshd's state disk, which may be full: a missed checkpoint is only progress lost
            with open(ck + ".tmp", "w") as f:
                f.write(str(done))
            os.replace(ck + ".tmp", ck)
        except OSError:
            pass
os.utime(path)
say(f"end {job} {restart} {code} {time.time()}")  # every rank: a supervisor stops the others when one rank fails
sys.exit(code)
"""


@dataclass(frozen=True, slots=True)
class Result:
    seed: int
    jobs: int
    kills: dict[str, int]  # by what was done to the journal before the restart
    fills: int
    refused_starts: int  # restarts meshd refused (a damaged journal, or a full disk)
    moved_aside: int  # of those, journals moved aside as meshd's line advised
    resubmitted: int
    jobs_lost: int
    ran_twice: int
    double_held_gpu_seconds: float
    left_behind: int
    wrong_ends: int
    redone_after_discard: int
    completed: int
    failed: int
    wall_seconds: float
    targets_met: bool
    problems: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Truth:
    starts: dict[str, list[float]] = field(default_factory=dict)  # job id -> start times of its runs
    ends: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # job id -> (exit code, when)


def read_truth(ledger: Path, name: str) -> Truth:
    t = Truth()
    try:
        lines = (ledger / f"truth-{name}").read_text().splitlines()
    except OSError:
        return t
    for line in lines:
        parts = line.split()
        if len(parts) == 5 and parts[0] == "start":
            t.starts.setdefault(parts[1], []).append(float(parts[4]))
        elif len(parts) == 5 and parts[0] == "end":
            t.ends.setdefault(parts[1], []).append((int(parts[3]), float(parts[4])))
    return t


def read_ledger(folder: Path) -> list[tuple[str, Interval]]:
    """(job name, interval) for every rank run of the ledger."""
    out = []
    for f in folder.iterdir():
        if f.name.startswith("truth-"):
            continue
        try:
            job, restart, rank, gpu, pid, start, name = f.read_text().split()[:7]
            end = f.stat().st_mtime
        except (OSError, ValueError):
            continue
        out.append((name, Interval(job, int(restart), int(rank), int(gpu), int(pid), float(start),
                                   max(float(start), end))))
    return out


class StateDisk:
    """A small tmpfs for meshd's state dir, and a filler file that takes its last byte."""

    def __init__(self, path: Path) -> None:
        self.path, self.filler = path, path / ".filler"

    def mount(self) -> str | None:
        self.path.mkdir(mode=0o700, exist_ok=True)
        try:
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m,mode=0700", "tmpfs", str(self.path)],
                           check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            why = getattr(exc, "stderr", "") or str(exc)
            return f"cannot mount a {TMPFS_MB} MB tmpfs for the state dir (needs root or CAP_SYS_ADMIN): {why.strip()}"
        return None

    def unmount(self) -> None:
        if subprocess.run(["umount", str(self.path)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)

    def fill(self) -> None:
        """Write the filler until the disk says ENOSPC."""
        for size in (65536, 512):  # then the last partial page
            try:
                with open(self.filler, "ab", buffering=0) as f:
                    while f.write(b"\0" * size):
                        pass
            except OSError:
                pass

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def damage(self, how: str) -> None:
        """What is done to the journal while meshd is down."""
        db, wal, shm = (self.path / f"journal.sqlite{s}" for s in ("", "-wal", "-shm"))
        if how == "moved-aside":
            aside = self.path / f"journal-aside-{time.time_ns()}"
            aside.mkdir()
            for p in (db, wal, shm):
                if p.exists():
                    p.rename(aside / p.name)
        elif how == "emptied":
            if db.exists():
                os.truncate(db, 0)
            wal.unlink(missing_ok=True)
            shm.unlink(missing_ok=True)
        elif how == "wal-cut":
            if wal.exists():
                os.truncate(wal, wal.stat().st_size // 2)
        elif how == "corrupted" and db.exists() and db.stat().st_size > 8192:
            with open(db, "r+b") as f:  # a damaged page, not the header
                f.seek(4096 + 100)
                f.write(os.urandom(2000))


class Pipeline:
    """The submitter: what it submitted under each name, and what it saw end."""

    def __init__(self, meshd: Meshd, bodies: dict[str, dict]) -> None:
        self.meshd, self.bodies = meshd, bodies
        self.ids: dict[str, list[str]] = {n: [] for n in bodies}  # name -> job ids, oldest first
        self.name_of: dict[str, str] = {}
        self.seen_end: set[str] = set()  # names
        self.ended: dict[str, dict] = {}  # job id -> its view, as last seen in an end state
        self.resubmitted: list[str] = []
        self.owed: list[str] = []  # names to submit again

    def submit(self, name: str) -> None:
        job_id = str(self.meshd.call("POST", "/v1/jobs", self.bodies[name])["job_id"])
        self.ids[name].append(job_id)
        self.name_of[job_id] = name

    def poll(self) -> list[dict] | None:
        try:
            jobs = self.meshd.client.call("GET", "/v1/jobs?all=1")
        except (DaemonUnavailable, ApiError, OSError):
            return None
        for j in jobs:
            name = self.name_of.get(str(j["job_id"]))
            if name and j["state"] in TERMINAL:
                self.seen_end.add(name)
                self.ended[str(j["job_id"])] = j
        return jobs

    def resubmit_dropped(self) -> None:
        """Submit again each name whose latest job meshd no longer knows and that was never seen to end."""
        jobs = None
        while jobs is None:
            time.sleep(0.05)
            jobs = self.poll()
        known = {str(j["job_id"]) for j in jobs}
        for name, ids in self.ids.items():
            if name not in self.seen_end and ids[-1] not in known and name not in self.owed:
                self.resubmitted.append(name)
                self.owed.append(name)
        self.flush()

    def flush(self) -> None:
        """Submit what is owed; a submit the full disk refuses (507) waits for the next try."""
        while self.owed:
            try:
                job_id = str(self.meshd.client.call("POST", "/v1/jobs", self.bodies[self.owed[0]])["job_id"])
            except (DaemonUnavailable, ApiError, OSError):
                return
            name = self.owed.pop(0)
            self.ids[name].append(job_id)
            self.name_of[job_id] = name


def start_meshd(meshd: Meshd, disk: StateDisk, counts: dict[str, int]) -> None:
    """Start meshd; on a refusal do what its one line says: free space on a full disk, or move a damaged journal
    aside; then start it again."""
    for _ in range(3):
        try:
            meshd.start()
            return
        except SystemExit:
            counts["refused"] += 1
            line = (meshd.root / "meshd.log").read_text(errors="replace").rstrip().rpartition("\n")[2]
            disk.free()
            if "move it aside" in line:
                counts["moved_aside"] += 1
                disk.damage("moved-aside")
    meshd.start()


def run(n_jobs: int, n_kills: int, n_fills: int, seed: int, budget: float) -> Result | str:
    rng = random.Random(seed)
    t0 = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="storage-chaos-"))
    runtime = Path(tempfile.mkdtemp(prefix="sc", dir="/tmp"))
    disk = StateDisk(root / "state")
    why = disk.mount()
    if why:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)
        return why
    ledger = root / "ledger"
    ledger.mkdir()
    script = root / "chaos_job.py"
    script.write_text(JOB_SCRIPT)
    marker = f"MESH_CHAOS_RUN={uuid.uuid4().hex}"
    env = dict(os.environ, MESHD_SYSTEMD_SCOPE="no", MESH_CHAOS_RUN=marker.partition("=")[2])
    meshd = Meshd(root, runtime, env)
    counts = {"refused": 0, "moved_aside": 0}
    kills = {d: 0 for d in DAMAGES}
    bodies = {}
    for i in range(n_jobs):
        name = f"sc-{i}"
        bodies[name] = {"command": [sys.executable, str(script), str(ledger), name, f"{rng.uniform(0.8, 2.0):.2f}",
                                    "3" if i % 4 == 3 else "0"],
                        "cwd": str(root), "gpus": rng.choice([1, 1, 2, 2, 4]), "iterations": 10 + i, "name": name}
    pipe = Pipeline(meshd, bodies)
    try:
        start_meshd(meshd, disk, counts)
        for name in bodies:
            pipe.submit(name)
        stretch = max(5.0, n_jobs * 0.6)
        events = [(rng.uniform(1.0, stretch), "kill", rng.choice(DAMAGES)) for _ in range(n_kills)]
        events += [(rng.uniform(0.5, stretch), "fill", rng.uniform(0.5, 3.0)) for _ in range(n_fills)]
        events.sort()
        start = time.monotonic()
        full_until = None
        for when, kind, arg in events:
            while time.monotonic() < start + when:
                pipe.poll()
                pipe.flush()
                if full_until is not None and time.monotonic() > full_until:
                    disk.free()
                    full_until = None
                time.sleep(0.05)
            if kind == "fill":
                disk.fill()
                full_until = max(full_until or 0.0, time.monotonic() + arg)
                continue
            meshd.kill()
            time.sleep(rng.uniform(0.0, 0.5))  # jobs end, results are written (or refused) while meshd is down
            disk.damage(arg)
            kills[arg] += 1
            start_meshd(meshd, disk, counts)  # the disk may still be full here
            if full_until is not None and time.monotonic() > full_until:
                disk.free()
                full_until = None
            pipe.resubmit_dropped()
        disk.free()
        deadline = t0 + budget
        while True:  # wait for every job to end
            pipe.flush()
            jobs = pipe.poll()
            if jobs is not None and not pipe.owed and all(j["state"] in TERMINAL for j in jobs) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        jobs = meshd.call("GET", "/v1/jobs?all=1")
        left = [p for p in marked_processes(marker.encode()) if p != meshd.proc.pid]
        res = count(pipe, jobs, ledger, left, seed, kills, n_fills, (counts["refused"], counts["moved_aside"]),
                    time.monotonic() - t0)
    finally:
        meshd.stop()
        for pid in marked_processes(marker.encode()):  # leave nothing behind, whatever happened
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        if os.environ.get("CHAOS_KEEP"):  # meshd's log, the ledger and a copy of the state dir, to diagnose a run
            shutil.copytree(disk.path, root / "state-copy", symlinks=True, ignore_dangling_symlinks=True,
                            ignore=shutil.ignore_patterns(".filler", "*.sock"))
            print(f"storage chaos: kept {root}", file=sys.stderr)
        disk.unmount()
        if os.environ.get("CHAOS_KEEP"):
            pass
        else:
            shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)
    return res


def count(pipe: Pipeline, jobs: list[dict], ledger: Path, left: list[int], seed: int, kills: dict[str, int],
          fills: int, refused: tuple[int, int], wall: float) -> Result:
    problems: list[str] = []
    by_id = dict(pipe.ended)  # an end seen before a damaged journal dropped it still counts
    by_id.update((str(j["job_id"]), j) for j in jobs)
    lost = wrong = redone = 0
    twice: set[str] = set()
    for name, ids in pipe.ids.items():
        truth = read_truth(ledger, name)
        ended = [by_id[i] for i in ids if i in by_id and by_id[i]["state"] in TERMINAL]
        if not ended:
            lost += 1
            problems.append(f"{name} (ids {ids}): no end; states {[by_id.get(i, {}).get('state') for i in ids]}")
        for i, ends in truth.ends.items():
            first = min(t for _, t in ends)
            again = [t for t in truth.starts.get(i, []) if t > first]
            if again:
                twice.add(name)
                problems.append(f"{name}: job {i} ran again (started {again}) after its end at {first}")
        for i in ids[:-1]:  # an earlier id dropped with a discarded journal: had it really ended?
            if truth.ends.get(i) and name in pipe.resubmitted:
                redone += 1
                problems.append(f"{name}: job {i} had ended {truth.ends[i]} before its journal was discarded")
        for j in ended:
            i = str(j["job_id"])
            real = truth.ends.get(i)
            code = real[-1][0] if real else None
            ok = (j["state"] == "COMPLETED" and code == 0) or (
                j["state"] == "FAILED" and code not in (None, 0) and j.get("exit_code") == code)
            if not ok:
                wrong += 1
                problems.append(f"{name}: job {i} recorded {j['state']} exit {j.get('exit_code')}, really {real}")
        stray = set(truth.starts) - set(ids)
        if stray:
            wrong += 1
            problems.append(f"{name}: ran under ids {sorted(stray)} that were given to another name")
    intervals = read_ledger(ledger)
    shared = 0.0
    for k, (na, a) in enumerate(intervals):
        for nb, b in intervals[k + 1:]:
            o = overlap(a, b)
            if o <= 0:
                continue
            if na == nb and (a.job, a.restart) != (b.job, b.restart):
                twice.add(na)
                problems.append(f"{na}: runs {a.job}.{a.restart} and {b.job}.{b.restart} overlapped {o:.3f} s")
            if a.job != b.job and a.gpu == b.gpu:
                shared += o
                problems.append(f"GPU {a.gpu}: jobs {a.job} and {b.job} overlapped {o:.3f} s")
    return Result(
        seed=seed, jobs=len(pipe.ids), kills=kills, fills=fills, refused_starts=refused[0], moved_aside=refused[1],
        resubmitted=len(pipe.resubmitted), jobs_lost=lost, ran_twice=len(twice),
        double_held_gpu_seconds=round(shared, 3), left_behind=len(left), wrong_ends=wrong,
        redone_after_discard=redone, completed=sum(1 for j in by_id.values() if j["state"] == "COMPLETED"),
        failed=sum(1 for j in by_id.values() if j["state"] == "FAILED"), wall_seconds=round(wall, 1),
        targets_met=lost == 0 and not twice and shared == 0 and not left and wrong == 0, problems=problems[:20],
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=30, help="jobs to run (default 30)")
    p.add_argument("--kills", type=int, default=8, help="SIGKILLs of meshd (default 8)")
    p.add_argument("--fills", type=int, default=6, help="times the state disk is filled (default 6)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--budget", type=float, default=240.0, help="give up waiting after this many seconds")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    res = run(args.jobs, args.kills, args.fills, args.seed, args.budget)
    if isinstance(res, str):
        print(f"storage chaos: skipped: {res}")
        return
    if args.json:
        print(json.dumps(asdict(res)))
        return
    rows = [("seed", res.seed), ("jobs", res.jobs),
            ("meshd kills, by journal damage", ", ".join(f"{k} {v}" for k, v in res.kills.items() if v)),
            ("disk fills", res.fills), ("starts refused / journal moved aside", f"{res.refused_starts} / {res.moved_aside}"),
            ("jobs resubmitted (dropped by the journal)", res.resubmitted),
            ("jobs lost", res.jobs_lost), ("jobs that ran twice", res.ran_twice),
            ("GPU-seconds held by two jobs", res.double_held_gpu_seconds), ("processes left behind", res.left_behind),
            ("recorded ends wrong", res.wrong_ends), ("redone after a discarded journal", res.redone_after_discard),
            ("completed / failed", f"{res.completed} / {res.failed}"), ("wall seconds", res.wall_seconds),
            ("all five targets zero", res.targets_met)]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for line in res.problems:
        print(f"  {line}")


if __name__ == "__main__":
    main()
