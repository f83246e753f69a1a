"""A job's processes as one unit: its session (and its cgroup under systemd), read from /proc.

A supervisor runs in its own session (setsid), so every rank and every child a rank forks shares the session
id = the supervisor's pid, even after the supervisor died. Linux does not hand out a pid while it is still in
use as a session id, so "every process whose session is S" is exactly what is left of that job. A process
that left the session (setsid of a daemonising grandchild) is caught by the supervisor (a child subreaper)
or, under systemd, by the job's scope cgroup.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state is [0], session [3], start time [19])."""
    try:
        data = (PROC / str(pid) / "stat").read_bytes().decode(errors="replace")
    except OSError:
        return None
    return data[data.rfind(")") + 2 :].split()


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is `sid`, the session leader included."""
    out = []
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        f = _stat_fields(int(entry.name))
        if f and f[0] != "Z" and f[3] == str(sid):
            out.append(int(entry.name))
    return out


def children(pid: int) -> list[int]:
    """Direct children of `pid`, all threads' (adopted orphans included when `pid` is a subreaper)."""
    out: list[int] = []
    try:
        tasks = os.listdir(PROC / str(pid) / "task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out += [int(x) for x in (PROC / str(pid) / "task" / tid / "children").read_text().split()]
        except OSError:
            pass
    return out


def cgroup_of(pid: int) -> str | None:
    """The cgroup v2 path of `pid` when it lives in a meshd job scope (mesh-job-*.scope), else None."""
    try:
        text = (PROC / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::") and "/mesh-job-" in line:
            return line[3:]
    return None


def cgroup_members(cgroup: str | None) -> list[int]:
    if not cgroup:
        return []
    try:
        return [int(x) for x in Path("/sys/fs/cgroup", cgroup.lstrip("/"), "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def job_processes(sid: int, cgroup: str | None = None, environ_marker: bytes | None = None) -> list[int]:
    """Every live process of a job: its session, plus its scope cgroup. With `environ_marker` (used after a
    restart, when the session id may have been reused) only processes whose environment holds it count."""
    pids = set(session_members(sid)) | set(cgroup_members(cgroup))
    pids.discard(os.getpid())
    if environ_marker is not None:
        pids = {p for p in pids if _has_marker(p, environ_marker)}
    return sorted(pids)


def _has_marker(pid: int, marker: bytes) -> bool:
    try:
        return marker in (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def kill_all(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def cgroup_dir_members(path: Path) -> list[int]:
    """The processes in the cgroup directory `path` (v2, or a v1 hierarchy's): [] when it is gone."""
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def marked_jobs(entry: bytes) -> dict[str, list[int]]:
    """Live processes whose environment holds `entry` (e.g. `MESH_SOCKET=<this meshd's job socket>`: a job's rank
    of this meshd, not of another on the machine), by the job id of their `MESH_JOB_ID` marker."""
    out: dict[str, list[int]] = {}
    me = os.getpid()
    for proc in os.scandir(PROC):
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            env = (PROC / proc.name / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry not in env:
            continue
        job = next((e[len(b"MESH_JOB_ID="):] for e in env if e.startswith(b"MESH_JOB_ID=")), b"")
        f = _stat_fields(int(proc.name))
        if job and f and f[0] != "Z":
            out.setdefault(job.decode(errors="replace"), []).append(int(proc.name))
    return out


def session_of(pid: int) -> int:
    """The session id of `pid` (0 when it is gone)."""
    try:
        return os.getsid(pid)
    except OSError:
        return 0


def has_env(pid: int, entry: bytes) -> bool:
    """The environment of `pid` holds `entry` (e.g. `MESH_JOB_ID=12`); False when it cannot be read."""
    return _has_marker(pid, entry)
