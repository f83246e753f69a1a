"""Starting, watching, stopping and re-adopting job supervisors (one per job, in its own session).

A supervisor is spawned with posix_spawn(setsid) -- no shell, no fork of the daemon's Python state -- and
watched through a pidfd registered with the event loop, so an exit is noticed without polling, both for
supervisors this meshd started and for ones it re-adopted after a restart. PID reuse is guarded by the
process start time in /proc/PID/stat.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from meshsched.daemon.supervisor import LaunchSpec


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a supervisor ended, from its result.json (status "lost" when it left none)."""

    status: str  # completed | failed | terminated | preempted | lost
    reason: str


def proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot), or None when PID is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode()
    except OSError:
        return None
    rest = data[data.rfind(")") + 2 :].split()
    if rest[0] == "Z":  # zombie: exited, not yet reaped
        return None
    return rest[19]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_outcome(job_dir: Path) -> Outcome:
    try:
        data = json.loads((job_dir / "result.json").read_text())
        return Outcome(str(data["status"]), str(data.get("reason") or ""))
    except (OSError, ValueError, KeyError):
        return Outcome("lost", "the job's supervisor exited without a result")


class Launcher:
    """Owns the pidfds of live supervisors; calls `on_exit(job_id, outcome)` when one ends."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[str, Outcome], None], systemd_run: str | None = None
    ) -> None:
        self._loop = loop
        self._systemd_run = systemd_run  # path of systemd-run: each job gets its own transient scope
        self._on_exit = on_exit
        self._watched: dict[str, tuple[int, int, Path]] = {}  # job_id -> (pid, pidfd, job_dir)
        self._kill_timers: dict[str, asyncio.TimerHandle] = {}

    @property
    def sessions(self) -> dict[int, str]:
        """Session id (= supervisor pid) -> job id, for mapping a socket peer to its job."""
        return {pid: job_id for job_id, (pid, _, _) in self._watched.items()}

    def workers(self, job_id: str) -> list[int]:
        """The job's rank processes in rank order (the supervisor's children, from /proc)."""
        entry = self._watched.get(job_id)
        if entry is None:
            return []
        pid = entry[0]
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as fh:
                return [int(x) for x in fh.read().split()]
        except OSError:
            return []

    def spawn(self, job_dir: Path, spec: LaunchSpec) -> tuple[int, str]:
        """Start the job's supervisor; returns (pid, start time)."""
        job_dir.mkdir(parents=True, exist_ok=True)
        (job_dir / "result.json").unlink(missing_ok=True)
        tmp = job_dir / "launch.json.tmp"
        tmp.write_text(json.dumps(asdict(spec)))
        os.replace(tmp, job_dir / "launch.json")
        log = str(job_dir / "supervisor.log")
        argv = [sys.executable, "-m", "meshsched.daemon.supervisor", str(job_dir)]
        if self._systemd_run:  # systemd-run --scope execs the command in place: same pid, own cgroup
            unit = f"mesh-job-{spec.job_id}-{spec.restart}.scope"
            argv = [self._systemd_run, "--scope", "--quiet", "--collect", f"--unit={unit}", "--", *argv]
        pid = os.posix_spawn(
            argv[0], argv, spec.env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ],
            setsid=True,
        )
        start = proc_start_time(pid) or ""
        (job_dir / "supervisor.pid").write_text(f"{pid} {start}\n")  # finds an orphan after a crash
        self.watch(spec.job_id, pid, job_dir)
        return pid, start

    def reap_orphan(self, job_dir: Path) -> int | None:
        """SIGKILL the session of a supervisor that runs although the journal says its job is queued
        (meshd crashed between spawning it and committing the launch); returns its pid if there was one."""
        try:
            pid_text, _, start = (job_dir / "supervisor.pid").read_text().strip().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        (job_dir / "supervisor.pid").unlink(missing_ok=True)
        if not start or proc_start_time(pid) != start:
            return None
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return pid

    def adopt(self, job_id: str, pid: int, start: str, job_dir: Path) -> bool:
        """Watch a supervisor a previous meshd started; False when it is gone (or the PID was reused)."""
        if not pid or proc_start_time(pid) != start:
            return False
        try:
            self.watch(job_id, pid, job_dir)
        except ProcessLookupError:
            return False
        return True

    def watch(self, job_id: str, pid: int, job_dir: Path) -> None:
        fd = os.pidfd_open(pid)
        self._watched[job_id] = (pid, fd, job_dir)
        self._loop.add_reader(fd, self._exited, job_id)

    def stop(self, job_id: str, grace: float) -> None:
        """SIGTERM the supervisor (it stops its ranks); SIGKILL the whole session if still alive later."""
        entry = self._watched.get(job_id)
        if entry is None:
            return
        pid = entry[0]
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        self._kill_timers[job_id] = self._loop.call_later(grace + 5.0, self._kill_session, job_id)

    def _kill_session(self, job_id: str) -> None:
        self._kill_timers.pop(job_id, None)
        entry = self._watched.get(job_id)
        if entry is not None:
            try:
                os.killpg(entry[0], signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _exited(self, job_id: str) -> None:
        pid, fd, job_dir = self._watched.pop(job_id)
        self._loop.remove_reader(fd)
        os.close(fd)
        (job_dir / "supervisor.pid").unlink(missing_ok=True)
        timer = self._kill_timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it when it is our child
        except ChildProcessError:
            pass
        self._on_exit(job_id, read_outcome(job_dir))

    def close(self) -> None:
        """Stop watching (the jobs keep running; the next meshd re-adopts them)."""
        for job_id, (_, fd, _) in list(self._watched.items()):
            self._loop.remove_reader(fd)
            os.close(fd)
        self._watched.clear()
        for timer in self._kill_timers.values():
            timer.cancel()
        self._kill_timers.clear()
