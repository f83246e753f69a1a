"""Starting, watching, stopping and re-adopting job supervisors (one per job, in its own session).

A supervisor is spawned with posix_spawn(setsid) -- no shell, no fork of the daemon's Python state -- and
watched through a pidfd registered with the event loop, so an exit is noticed without polling, both for
supervisors this meshd started and for ones it re-adopted after a restart. PID reuse is guarded by the
process start time in /proc/PID/stat.

A job's GPUs are free only when every process of the job is gone: when a supervisor exits (or is killed),
every process left in its session (and its scope cgroup under systemd) gets SIGKILL, and `on_exit` fires
only once none is left. Stop and the kill timer act on that same set, never on direct children alone.
A supervisor hands its result over twice: result.json, and a `result` frame on the job socket (`told`), which
needs no disk: a job whose result.json a full disk refused still ends as it did.
A job's environment is its own (`job_env`): what its submitter exported (`mesh submit --export`, kept in its
record), over a minimal PATH/HOME/USER/LANG unless that was the submitter's whole environment, plus the variables
the admin lets through from meshd's (`job_env_passthrough`), plus those meshd sets for each rank (supervisor.py's
`rank_env`). Nothing else of meshd's environment reaches a job. It travels to the supervisor in launch.json; the
supervisor itself runs with meshd's environment (never the user's: no PYTHONPATH or LD_PRELOAD of theirs in a
process that may run as root), without meshd's secrets (MESHD_TOKEN*), and the job directory and its files are
private (0700 / 0600).
With many users (daemon/users.py) a job's directory belongs to its submitter (0700) and its supervisor is
told `--as-user`: it works as that user and starts the ranks as them. meshd's own files in that directory
are written by a fresh name and a rename and opened without following links, so a link the user plants
there never redirects a write of root's.
A job's CPUs and memory limit (daemon/confine.py) go on its scope (systemd-run -p AllowedCPUs= -p MemoryMax=)
or into a cgroup made for the run, which the supervisor joins (`--cgroup`); the cgroup is removed once every
process of the job is gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from meshsched.daemon.confine import Confiner, Limits
from meshsched.daemon.procs import cgroup_of, job_processes, kill_all
from meshsched.daemon.supervisor import LaunchSpec
from meshsched.daemon.users import Owner, owner_of, user_env

SECRET_ENV = ("MESHD_TOKEN", "MESHD_TOKEN_FILE")  # never handed to a job
REAP_INTERVAL = 0.05  # seconds between checks that a dead supervisor's session is empty
# What meshd sets in a job's environment (docs/daemon.md): a submitter's own value never reaches the job, even where
# meshd sets it only sometimes (an array task's, MPS's, a multi-node job's)
MESHD_VARS = frozenset(("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
                        "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "MESH_JOB_ID", "MESH_SOCKET",
                        "MESH_CHECKPOINT_DIR", "MESH_RESTART_COUNT", "MESH_MICRO_BATCH", "MESH_ACCUM_STEPS",
                        "MESH_MPS_PERCENTAGE", "MESH_PLAN", *SECRET_ENV,
                        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                        "TORCHELASTIC_USE_AGENT_STORE"))
MESHD_PREFIXES = ("MESH_ARRAY_", "CUDA_MPS_", "TORCHELASTIC_")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # cli/jobs.py's JOB_PATH


def scrub_env(env: dict[str, str]) -> dict[str, str]:
    """The environment without meshd's secrets."""
    return {k: v for k, v in env.items() if k not in SECRET_ENV}


def exported(env: dict[str, str]) -> dict[str, str]:
    """What of a submitter's exported environment the job keeps: all but the variables meshd sets."""
    return {k: v for k, v in env.items() if k not in MESHD_VARS and not k.startswith(MESHD_PREFIXES)}


def minimal_env(uid: int | None) -> dict[str, str]:
    """The environment a job starts from when its submitter did not export all of theirs: PATH, and the HOME, USER,
    LOGNAME, SHELL of its user (`uid`; None: meshd's), LANG."""
    env = {"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"}
    try:
        env.update(user_env(owner_of(os.getuid() if uid is None else uid)))
    except KeyError:  # a uid the password database does not know
        pass
    return env


def job_env(env: dict[str, str], export: str, uid: int | None, passthrough: tuple[str, ...] = (),
            meshd_env: dict[str, str] | None = None) -> dict[str, str]:
    """A job's environment before meshd's per-run variables: the `env` its record keeps, over a minimal one unless
    `export` is ALL, over the `passthrough` variables of meshd's environment (`meshd_env`, default its own)."""
    own = os.environ if meshd_env is None else meshd_env
    out = {} if export == "ALL" else minimal_env(uid)
    out.update(scrub_env({k: own[k] for k in passthrough if k in own}))
    out.update(env)
    return out


def supervisor_env(job_id: str) -> dict[str, str]:
    """A job supervisor's own environment: meshd's without its secrets, marked with the job (`job_marker`)."""
    env = scrub_env(dict(os.environ))
    env["MESH_JOB_ID"] = job_id
    return env


def job_marker(job_id: str) -> bytes:
    """The environment entry every process of a job inherits (tells a job's process after a restart)."""
    return f"MESH_JOB_ID={job_id}".encode()


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a supervisor ended, from its result.json (status "lost" when it left none)."""

    status: str  # completed | failed | terminated | preempted | lost
    reason: str
    exit_code: int | None = None  # a failed rank's exit code (negative: its signal), 0 when completed
    run: int | None = None  # the run it is the result of (its LaunchSpec.restart); None: not known


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


def _write_private(path: Path, text: str) -> None:
    """Write `path` (0600) by a new temporary name and a rename: a link planted at either name is replaced,
    never followed."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with open(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError:  # a full disk: leave no empty file behind
        tmp.unlink(missing_ok=True)
        raise


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _read_json(path: Path) -> dict:
    with open(path, opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as fh:
        data = json.loads(fh.read())
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} holds no object")
    return data


def read_outcome(job_dir: Path) -> Outcome:
    """The job's last result (result.json), with the run it is of: the result says it (`restart`); a result of an
    older supervisor does not, but a launch removes result.json before it writes launch.json, so a result there is
    of the run launch.json describes."""
    try:
        data = _read_json(job_dir / "result.json")
        run = _int(data.get("restart"))
        if run is None:
            try:
                run = _int(_read_json(job_dir / "launch.json").get("restart"))
            except (OSError, ValueError):
                pass
        return Outcome(str(data["status"]), str(data.get("reason") or ""), _int(data.get("exit_code")), run)
    except (OSError, ValueError, KeyError):
        from meshsched.daemon.supervisor import tail

        why = tail(job_dir / "supervisor.log", 1)  # e.g. "cannot write result.json: No space left on device"
        return Outcome("lost", "the job's supervisor exited without a result" + (f" ({why})" if why else ""))


class Launcher:
    """Owns the pidfds of live supervisors; calls `on_exit(job_id, outcome)` when one ends."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[str, Outcome], None], systemd_run: str | None = None,
        log_max_bytes: int | None = None, confiner: Confiner | None = None,
    ) -> None:
        self._loop = loop
        self.confiner = confiner or Confiner((), False, why_not="no confiner")
        self._log_max_bytes = log_max_bytes  # overrides the spec's cap on each rank's log
        self._systemd_run = systemd_run  # path of systemd-run: each job gets its own transient scope
        self._on_exit = on_exit
        self._watched: dict[str, tuple[int, int, Path]] = {}  # job_id -> (pid, pidfd, job_dir)
        self._cgroups: dict[str, str | None] = {}  # job_id -> its scope cgroup (systemd), if any
        self._draining: dict[str, asyncio.TimerHandle] = {}  # supervisor gone, session not yet empty
        self._kill_timers: dict[str, asyncio.TimerHandle] = {}
        self._told: dict[str, Outcome] = {}  # job -> the result its supervisor said over the job socket

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

    def spawn(self, job_dir: Path, spec: LaunchSpec, owner: Owner | None = None,
              limits: Limits = Limits()) -> tuple[int, str, Limits]:
        """Start the job's supervisor (working as `owner`, None: as meshd's user) confined to `limits`; returns
        (pid, start time, the limits in force: a memory limit whose cgroup could not be made is dropped)."""
        env = scrub_env(spec.env)  # the ranks' (launch.json); the supervisor runs with `supervisor_env`
        env["MESH_JOB_ID"] = spec.job_id
        cgroup = None
        if limits.memory_by.startswith("cgroup"):
            cgroup = self.confiner.make_cgroup(spec.job_id, spec.restart, limits)
            if cgroup is None:
                limits = replace(limits, memory_by="")
        spec = replace(spec, env=env, log_max_bytes=self._log_max_bytes or spec.log_max_bytes, cpus=list(limits.cpus),
                       memory_limit_gb=limits.memory_gb if limits.memory_by else None)
        try:
            pid, start = self._start(job_dir, spec, owner, limits, cgroup)
        except OSError:
            self.confiner.remove(spec.job_id)  # the run's cgroup, made for nothing
            raise
        return pid, start, limits

    def _start(self, job_dir: Path, spec: LaunchSpec, owner: Owner | None, limits: Limits,
               cgroup: str | None) -> tuple[int, str]:
        job_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(job_dir, 0o700)
        if owner is not None:
            os.chown(job_dir, owner.uid, owner.gid, follow_symlinks=False)
        (job_dir / "result.json").unlink(missing_ok=True)
        self._told.pop(spec.job_id, None)
        _write_private(job_dir / "launch.json", json.dumps(asdict(spec)))
        log = str(job_dir / "supervisor.log")
        # -P: the job's working directory is not put on sys.path (a checkout of meshsched there would shadow the
        # installed package, and the supervisor would not start)
        argv = [sys.executable, "-P", "-m", "meshsched.daemon.supervisor", str(job_dir)]
        if owner is not None:
            argv += ["--as-user", owner.argument()]
        if cgroup is not None:
            argv += ["--cgroup", cgroup]
        if self._systemd_run:  # systemd-run --scope execs the command in place: same pid, own cgroup
            unit = f"mesh-job-{spec.job_id}-{spec.restart}.scope"
            argv = [self._systemd_run, "--scope", "--quiet", "--collect", f"--unit={unit}",
                    *self.confiner.systemd_properties(limits), "--", *argv]
        pid = os.posix_spawn(
            argv[0], argv, supervisor_env(spec.job_id),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600),
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ],
            setsid=True,
        )
        start = proc_start_time(pid) or ""
        self.watch(spec.job_id, pid, job_dir)  # it runs: watched before anything else can fail
        try:
            _write_private(job_dir / "supervisor.pid", f"{pid} {start}\n")  # finds an orphan after a crash
        except OSError:
            pass  # a full disk: the journaled launch names the supervisor all the same
        return pid, start

    def reap_orphan(self, job_dir: Path, job_id: str = "") -> int | None:
        """SIGKILL what runs of a job although the journal says it is queued (meshd crashed between spawning
        it and committing the launch); returns the supervisor pid if anything was left."""
        try:
            pid_text, _, start = (job_dir / "supervisor.pid").read_text().strip().partition(" ")
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        (job_dir / "supervisor.pid").unlink(missing_ok=True)
        return pid if self.kill_leftovers(job_id, pid) else None

    def kill_leftovers(self, job_id: str, sid: int) -> list[int]:
        """After a restart: SIGKILL every process still in the session of the job's dead supervisor (ranks,
        their children) and wait for them; a process counts only if its environment names the job, since
        the session id may have been reused. Returns the pids that were killed."""
        if not sid:
            return []
        marker = job_marker(job_id) if job_id else None
        pids = job_processes(sid, environ_marker=marker)
        killed = list(pids)
        for _ in range(200):  # at most ~2 s: SIGKILL is not instant
            if not pids:
                break
            kill_all(pids)
            os.sched_yield()
            pids = [p for p in pids if proc_start_time(p) is not None]
            if pids:
                time.sleep(0.01)
        if job_id:
            self.confiner.remove(job_id)
        return killed

    def adopt(self, job_id: str, pid: int, start: str, job_dir: Path) -> bool:
        """Watch a supervisor a previous meshd started; False when it is gone (or the PID was reused)."""
        if not pid or proc_start_time(pid) != start:
            return False
        try:
            self.watch(job_id, pid, job_dir)
        except ProcessLookupError:
            return False
        return True

    def told(self, job_id: str, status: str, reason: str, exit_code: int | None) -> None:
        """The job's supervisor said how the job ended (the job socket: it needs no disk). Used when its
        result.json is missing (a full disk)."""
        if job_id in self._watched:
            self._told[job_id] = Outcome(status, reason, exit_code)

    def watch(self, job_id: str, pid: int, job_dir: Path) -> None:
        fd = os.pidfd_open(pid)
        self._watched[job_id] = (pid, fd, job_dir)
        self._cgroups[job_id] = cgroup_of(pid)
        self._loop.add_reader(fd, self._exited, job_id)

    def signal_workers(self, job_id: str, signum: int) -> int:
        """Send `signum` to each rank of a running job (`mesh cancel --signal`); returns how many got it."""
        sent = 0
        for pid in self.workers(job_id):
            try:
                os.kill(pid, signum)
                sent += 1
            except ProcessLookupError:
                pass
        return sent

    def running(self, job_id: str) -> bool:
        """True while any process of the job may still run (its supervisor, or what it left behind)."""
        return job_id in self._watched or job_id in self._draining

    def stop(self, job_id: str, grace: float) -> None:
        """SIGTERM the supervisor (it stops its ranks); SIGKILL every process of the job if any is alive later."""
        entry = self._watched.get(job_id)
        if entry is None:
            return
        pid = entry[0]
        self._refresh_cgroup(job_id, pid)
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if job_id not in self._kill_timers:
            self._kill_timers[job_id] = self._loop.call_later(grace + 5.0, self._kill_session, job_id)

    def _kill_session(self, job_id: str) -> None:
        self._kill_timers.pop(job_id, None)
        entry = self._watched.get(job_id)
        if entry is not None:
            self._refresh_cgroup(job_id, entry[0])
            kill_all(job_processes(entry[0], self._cgroups.get(job_id)))

    def _refresh_cgroup(self, job_id: str, pid: int) -> None:
        """systemd-run moves the supervisor into its scope just after the spawn: look again while it lives."""
        if self._cgroups.get(job_id) is None:
            self._cgroups[job_id] = cgroup_of(pid)

    def _exited(self, job_id: str) -> None:
        pid, fd, job_dir = self._watched.pop(job_id)
        self._loop.remove_reader(fd)
        os.close(fd)
        timer = self._kill_timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()
        try:
            os.waitpid(pid, os.WNOHANG)  # reap it when it is our child
        except ChildProcessError:
            pass
        self._drain(job_id, pid, job_dir)

    def _drain(self, job_id: str, sid: int, job_dir: Path) -> None:
        """The supervisor is gone: SIGKILL what is left of the job and report the exit once nothing is."""
        self._draining.pop(job_id, None)
        left = job_processes(sid, self._cgroups.get(job_id))
        if left:
            kill_all(left)
            self._draining[job_id] = self._loop.call_later(REAP_INTERVAL, self._drain, job_id, sid, job_dir)
            return
        self._cgroups.pop(job_id, None)
        self.confiner.remove(job_id)
        (job_dir / "supervisor.pid").unlink(missing_ok=True)
        outcome, told = read_outcome(job_dir), self._told.pop(job_id, None)
        self._on_exit(job_id, told if outcome.status == "lost" and told is not None else outcome)

    def close(self) -> None:
        """Stop watching (the jobs keep running; the next meshd re-adopts them)."""
        self.confiner.close()
        for job_id, (_, fd, _) in list(self._watched.items()):
            self._loop.remove_reader(fd)
            os.close(fd)
        self._watched.clear()
        for timer in [*self._kill_timers.values(), *self._draining.values()]:
            timer.cancel()
        self._kill_timers.clear()
        self._draining.clear()
        self._told.clear()
