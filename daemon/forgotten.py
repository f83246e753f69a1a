"""What the journal forgot: job processes a previous meshd started that no record re-adopted, found at start and
stopped before any GPU is given out.

meshd's advice for an unusable journal is to move it aside; a journal can also come back empty (0 bytes), cut
short (a truncated WAL) or older than the processes (a restored copy). Its jobs' processes still run on their
GPUs, and a new job placed there would share them. Recovery therefore looks, after every record was re-adopted
or requeued, for job processes of this meshd that are not watched:

* `jobs/<id>/supervisor.pid` (pid and start time, as the launcher writes it): the supervisor counts only when its
  start time is the one recorded, its command line is the supervisor's on that directory and its environment
  holds the job's marker (`MESH_JOB_ID=<id>`), so a reused pid is never taken for it; then every process of its
  session (and systemd scope) with the marker;
* this meshd's job cgroups (`daemon/confine.py`, under a parent named for its state dir): every process in one;
* processes whose environment holds `MESH_SOCKET=<this meshd's job socket>` and a job marker (the ranks of a job
  whose supervisor is gone, or that left their session), with what carries the marker in their session. A job id
  is common to every meshd on a machine; the socket is this one's, so another meshd's job is never taken.

Such a job is stopped as meshd stops a job: SIGTERM to its supervisor (it stops its ranks within its grace), and
SIGKILL of every process left of it once the supervisor is gone or `kill_grace` + 5 s have passed. Start waits
until none is left, so the first scheduling pass never sees those GPUs as free. They are stopped, not adopted:
the journal's record (the submitter, user id, iterations, dependencies, restarts, checkpoint) cannot be rebuilt
from launch.json, and the queue the operator asked for is empty.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from meshsched.daemon.launcher import job_marker, proc_start_time
from meshsched.daemon.procs import (cgroup_dir_members, cgroup_of, has_env, job_processes, kill_all, marked_jobs,
                                    session_of)

LOG = logging.getLogger("meshd")
KILL_WAIT = 10.0  # seconds SIGKILLed processes get to be gone before start goes on (and says so)
POLL = 0.05


@dataclass(slots=True)
class Forgotten:
    """One job's processes that no journal record accounts for."""

    job_id: str
    sid: int = 0  # its supervisor's pid, which is its session id (0: not known)
    start: str = ""  # the supervisor's start time when it still runs ("": it is gone)
    scope: str | None = None  # the supervisor's systemd scope, if any
    cgroups: list[Path] = field(default_factory=list)  # this meshd's job cgroups of it
    seen: dict[int, str] = field(default_factory=dict)  # pid -> start time of processes known to be the job's
    socket_entry: bytes = b""  # MESH_SOCKET=<job socket>: without a known supervisor, what a member must carry
    found_by: list[str] = field(default_factory=list)

    def processes(self) -> set[int]:
        """Every process of the job still alive. Its session is looked at only while a process known to be the job's
        is alive: a session id in use is never given out again, one whose processes all ended may be."""
        pids = {p for p, start in self.seen.items() if proc_start_time(p) == start}
        if self.sid and pids:
            for pid in job_processes(self.sid, self.scope, job_marker(self.job_id)):
                if not self.start and pid != self.sid and not has_env(pid, self.socket_entry):
                    continue  # a session reached from a rank: only this meshd's ranks (and its leader) count
                if (start := proc_start_time(pid)) is not None:
                    self.seen.setdefault(pid, start)
                    pids.add(pid)
        for path in self.cgroups:
            pids |= set(cgroup_dir_members(path))
        pids.discard(os.getpid())
        return pids

    def supervisor_alive(self) -> bool:
        return bool(self.start) and proc_start_time(self.sid) == self.start


def find_forgotten(jobs_dir: Path, job_socket: Path, cgroup_parent: Path | None,
                   known: Callable[[str], bool]) -> list[Forgotten]:
    """The jobs with live processes that `known` (the launcher watches it) does not account for."""
    found: dict[str, Forgotten] = {}

    def entry(job_id: str, how: str) -> Forgotten:
        if "/" in job_id or job_id in ("", ".", ".."):  # (from a process's environment) not a job directory's name
            return Forgotten(job_id)  # looked at, never kept
        f = found.setdefault(job_id, Forgotten(job_id))
        if how not in f.found_by:
            f.found_by.append(how)
        return f

    _by_pid_files(jobs_dir, known, entry)
    if cgroup_parent is not None:
        _by_cgroups(cgroup_parent, known, entry)
    _by_environment(job_socket, known, entry)
    return [f for f in found.values() if f.processes()]


def _by_pid_files(jobs_dir: Path, known: Callable[[str], bool], entry: Callable[[str, str], Forgotten]) -> None:
    try:
        dirs = [d for d in os.scandir(jobs_dir) if d.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for d in dirs:
        if known(d.name):
            continue
        try:  # most job directories have none (a supervisor removes it when it ends)
            fd = os.open(f"{d.path}/supervisor.pid", os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        pid_file = Path(d.path) / "supervisor.pid"
        with open(fd) as fh:
            pid_text, _, start = fh.read().strip().partition(" ")
        if not pid_text.isdigit() or int(pid_text) <= 1:
            continue
        pid = int(pid_text)
        if start and proc_start_time(pid) == start and _is_supervisor(pid, d.name, d.path):
            f = entry(d.name, "supervisor.pid")
            f.sid, f.start, f.scope = pid, start, cgroup_of(pid)
            f.seen[pid] = start
        else:  # the supervisor is gone (its pid may be another's now): ranks it left are found by their environment
            pid_file.unlink(missing_ok=True)


def supervisor_of(job_id: str, job_dir: Path) -> tuple[int, str]:
    """(pid, start time) of the job's supervisor: as `supervisor.pid` names it or, where that file is missing (a
    full disk refused it right after the spawn), the live supervisor of `job_dir` found in /proc -- its command
    line, its job marker, its own session -- so that a run whose launch only a killed meshd's memory held is
    adopted, never taken for a forgotten job and killed while it hands its result over. (0, "") when none."""
    try:
        pid_text, _, start = (job_dir / "supervisor.pid").read_text().strip().partition(" ")
        return int(pid_text), start
    except (OSError, ValueError):
        pass
    try:
        pids = [int(d.name) for d in os.scandir("/proc") if d.name.isdigit()]
    except OSError:
        return 0, ""
    for pid in pids:
        if _is_supervisor(pid, job_id, str(job_dir)) and session_of(pid) == pid:
            start = proc_start_time(pid)
            if start is not None:
                return pid, start
    return 0, ""


def _is_supervisor(pid: int, job_id: str, job_dir: str) -> bool:
    """`pid` is the supervisor of `job_id` in `job_dir`: its command line names both, its environment the job."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"meshsched.daemon.supervisor" in argv and job_dir.encode() in argv and job_marker(job_id) in env


def _by_cgroups(parent: Path, known: Callable[[str], bool], entry: Callable[[str, str], Forgotten]) -> None:
    try:
        paths = list(parent.glob("mesh-job-*"))
    except OSError:
        return
    for path in paths:
        job_id = path.name.removeprefix("mesh-job-").rpartition("-")[0]  # mesh-job-ID-RUN
        if job_id and not known(job_id) and cgroup_dir_members(path):
            entry(job_id, "its cgroup").cgroups.append(path)


def _by_environment(job_socket: Path, known: Callable[[str], bool], entry: Callable[[str, str], Forgotten]) -> None:
    socket_entry = f"MESH_SOCKET={job_socket}".encode()
    for job_id, pids in marked_jobs(socket_entry).items():
        if known(job_id):
            continue
        f = entry(job_id, "its environment")
        f.socket_entry = socket_entry
        for pid in pids:
            if (start := proc_start_time(pid)) is not None:
                f.seen[pid] = start
            if not f.sid:
                f.sid = session_of(pid)


def gpus_of(job_dir: Path) -> str:
    """The GPUs its launch.json gave the job's local ranks, for the log ('?' when it cannot be read)."""
    try:
        with open(job_dir / "launch.json", opener=lambda p, fl: os.open(p, fl | os.O_NOFOLLOW)) as fh:
            gpus = json.load(fh)["local_gpus"]
        return ",".join(str(int(g)) for g in gpus) or "none"
    except (OSError, ValueError, KeyError, TypeError):
        return "?"


def stop_forgotten(found: list[Forgotten], jobs_dir: Path, grace: float) -> list[str]:
    """Stop every process of each forgotten job (one log line each) and wait until they are gone; returns the ids of
    jobs something of which could not be killed within KILL_WAIT (logged)."""
    for f in found:
        LOG.warning("job %s: its processes run but the journal does not know it (found by %s; supervisor %s; "
                    "GPUs %s): stopping them before any GPU is given out", f.job_id, ", ".join(f.found_by),
                    f"pid {f.sid}" if f.supervisor_alive() else "gone", gpus_of(jobs_dir / f.job_id))
        if f.supervisor_alive():
            kill_all([f.sid], signal.SIGTERM)  # it stops its ranks, as `mesh cancel` has it do
    term_until = time.monotonic() + grace + 5.0
    kill_until = term_until + KILL_WAIT
    left = list(found)
    while left:
        now = time.monotonic()
        still = []
        for f in left:
            pids = f.processes()
            if not pids:
                continue
            still.append(f)
            if now > term_until or not f.supervisor_alive():
                kill_all(sorted(pids))
        left = still
        if left and now > kill_until:
            for f in left:
                LOG.warning("job %s: processes %s survive SIGKILL; its GPUs may be in use", f.job_id,
                            ",".join(map(str, sorted(f.processes()))))
            break
        if left:
            time.sleep(POLL)
    for f in found:
        if f not in left:
            (jobs_dir / f.job_id / "supervisor.pid").unlink(missing_ok=True)
    return [f.job_id for f in left]
