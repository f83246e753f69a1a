"""The per-job supervisor: `python -m meshsched.daemon.supervisor JOB_DIR`, started by meshd in its own session.

It reads JOB_DIR/launch.json, starts one process per rank with torchrun's environment contract, sends each
rank's stdout+stderr to JOB_DIR/logs/rank<N>.log, and waits. When a rank fails the others get SIGTERM, then
SIGKILL after the grace period. SIGTERM to the supervisor (cancel, preempt) is forwarded the same way.
The outcome goes to JOB_DIR/result.json (written atomically) so that meshd learns it even if meshd was
restarted meanwhile; when the disk refuses it, to meshd as a `result` frame on the job socket, which needs no disk
and which meshd acknowledges once the end is durable (`hand_over`: until then the supervisor stays, so the end is
never only in a meshd's memory, and a full disk never turns a finished job into a lost one or runs it twice):
{"status": completed|failed|terminated|preempted, "rank", "exit_code", "reason"};
"preempted" when ranks exited with PREEMPTED_EXIT_CODE (checkpointed on meshd's request) and none failed.
Because it lives in its own session, restarting meshd does not stop a job.

The job's processes are one unit: the supervisor is a child subreaper (orphaned grandchildren, daemonised or
not, are re-parented to it), each rank dies with it (PR_SET_PDEATHSIG), and it exits only after every
process left in its session or re-parented to it is gone -- so its exit means the job's GPUs are free.
A SIGTERM that arrives while ranks are being spawned stops the ranks already started and spawns no more.
A rank's log is capped at `log_max_bytes`: past it, the newest half moves to rank<N>.log.1 and the log
starts again (a marker line says so).
With `output` (and `error`) set (`mesh submit --output/--error`), each rank's stdout (stderr) goes through a
pipe the supervisor copies both to its rank log and, appended, to that file; without them the ranks write
their logs directly, as before.
Confinement (daemon/confine.py): with `--cgroup PATH` (from meshd's command line, never from the job directory
its user may write) the supervisor moves itself into that cgroup, which holds the job's memory limit, before it
starts a rank; with `cpus` it sets its CPU affinity to them, so every rank inherits both. A rank that fails
while the cgroup counts an OOM kill is reported as having exceeded its memory limit.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from meshsched.daemon.confine import join_cgroup, oom_kills
from meshsched.daemon.procs import children, kill_all, session_members
from meshsched.wire.exitcodes import PREEMPTED_EXIT_CODE

TAIL_LINES = 5
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
LOG_MAX_BYTES = 64 << 20
POLL = 0.5  # seconds between log-size checks while ranks run
PARTIAL_MAX = 1 << 16  # bytes of a line without an end kept back from the user's file before it goes anyway
CLEANUP_TIMEOUT = 10.0  # seconds to wait for left-over processes after SIGKILL (D state, NFS)
RESULT_PATIENCE = 300.0  # seconds the result is offered to result.json and meshd before the supervisor gives up
RESULT_RETRY = 1.0  # seconds between those tries
RESULT_SLOT = 8192  # bytes reserved for result.json when the supervisor starts (a reason is capped at 4096 characters)
TELL_TIMEOUT = 5.0  # seconds meshd has to acknowledge a result frame


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    job_id: str
    command: list[str]
    cwd: str
    env: dict[str, str]  # the full base environment of every rank
    local_gpus: list[int]  # physical GPU index per local rank
    master_port: int
    restart: int
    socket: str
    checkpoint_dir: str
    grace: float
    rank_envs: list[dict[str, str]] = field(default_factory=list)  # per rank, e.g. its GPU's MPS server
    log_max_bytes: int = LOG_MAX_BYTES  # per rank log; rotated once past it
    first_rank: int = 0  # a job across nodes: the global rank of this node's first rank
    world_size: int = 0  # ranks over all nodes (0: the local ones)
    node_rank: int = 0  # this node's place among the job's nodes (GROUP_RANK)
    master_addr: str = "127.0.0.1"  # rank 0's node
    devices: list[str] = field(default_factory=list)  # CUDA_VISIBLE_DEVICES per local rank (GpuInfo.cuda_id)
    output: str = ""  # a file every rank's stdout is also appended to ("": only the rank logs)
    error: str = ""  # the same for stderr ("": with stdout)
    cpus: list[int] = field(default_factory=list)  # CPU ids every rank runs on (daemon/confine.py; []: any)
    memory_limit_gb: float | None = None  # the job's memory limit here, GiB, where one is enforced

    @classmethod
    def load(cls, path: Path) -> LaunchSpec:
        return cls(**json.loads(path.read_text()))


def rank_env(spec: LaunchSpec, rank: int) -> dict[str, str]:
    """The environment of one worker: torchrun's contract (as torch's LocalElasticAgent sets it, one role, one
    group per node; docs/daemon.md) plus CUDA_VISIBLE_DEVICES and MESH_*."""
    local = len(spec.local_gpus)
    env = dict(spec.env)
    if rank < len(spec.rank_envs):
        env.update(spec.rank_envs[rank])
    world = str(spec.world_size or local)
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # torchrun's default, unless the job's env sets it
    env.update(
        RANK=str(spec.first_rank + rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=world,
        LOCAL_WORLD_SIZE=str(local),
        GROUP_RANK=str(spec.node_rank),
        GROUP_WORLD_SIZE=spec.env.get("GROUP_WORLD_SIZE", "1"),  # the job's nodes (daemon/runs.py sets it)
        ROLE_RANK=str(spec.first_rank + rank),  # one role: the role's ranks are the job's
        ROLE_WORLD_SIZE=world,
        ROLE_NAME="default",  # torchrun's --role default
        TORCHELASTIC_RESTART_COUNT=str(spec.restart),  # restarts of this job so far (preemption, requeue, resize)
        TORCHELASTIC_MAX_RESTARTS="0",  # meshd never runs a failed job again (torchrun's --max-restarts default)
        TORCHELASTIC_RUN_ID=spec.job_id,  # one per job, the same on every restart and node
        TORCHELASTIC_USE_AGENT_STORE="False",  # no agent hosts a store: rank 0 does, at MASTER_ADDR:MASTER_PORT
        MASTER_ADDR=spec.master_addr,
        MASTER_PORT=str(spec.master_port),
        CUDA_VISIBLE_DEVICES=spec.devices[rank] if rank < len(spec.devices) else str(spec.local_gpus[rank]),
        CUDA_DEVICE_ORDER="PCI_BUS_ID",  # CUDA numbers GPUs as NVML does
        MESH_JOB_ID=spec.job_id,
        MESH_SOCKET=spec.socket,
        MESH_CHECKPOINT_DIR=spec.checkpoint_dir,
        MESH_RESTART_COUNT=str(spec.restart),
        PYTHONUNBUFFERED="1",
    )
    return env


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 4096))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def reserve_result(job_dir: Path) -> None:
    """Take the space result.json will need now, while the disk has it (RESULT_SLOT bytes in result.json.tmp, which
    `write_result` overwrites in place): a disk full by the time the job ends still takes its result, and a meshd
    restarted (SIGKILLed while it kept the end in memory) still finds it. A full disk now: no slot, no harm."""
    tmp = job_dir / "result.json.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    except OSError:
        return
    try:
        os.write(fd, b" " * RESULT_SLOT)
    except OSError:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)


def write_result(job_dir: Path, result: dict) -> None:
    tmp = job_dir / "result.json.tmp"
    data = json.dumps(result).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)  # no O_TRUNC: the space `reserve_result` took is reused
    try:
        try:
            if os.pwrite(fd, data, 0) != len(data):  # a short write: the disk is full past the slot
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.ftruncate(fd, len(data))  # shrinking needs no space
        finally:
            os.close(fd)
        os.replace(tmp, job_dir / "result.json")
    except OSError:  # a full disk: no empty file left behind
        tmp.unlink(missing_ok=True)
        raise


def say(line: str) -> None:
    """One line to supervisor.log; a full disk loses it, never the job's result."""
    try:
        print(f"supervisor: {line}", file=sys.stderr, flush=True)
    except OSError:
        pass


DURABLE, HELD = "durable", "held"  # meshd's answers to a result frame (tell_meshd); "": no answer, or refused


def tell_meshd(path: str, job_id: str, result: dict, timeout: float = TELL_TIMEOUT) -> str:
    """Say `result` to meshd over the job socket (no disk needed): DURABLE once meshd acknowledged it with the end
    durable (result.json exists: it writes it where this process could not), HELD while it holds the end but its
    disk refuses it too (an `ok` with `durable: false`), "" when meshd did not take it (not there, or refused)."""
    from meshsched.wire.protocol import MAX_REASON, REPLY_TYPES, FrameDecoder, ProtocolError, encode_frame

    message = {"type": "result", "job_id": job_id, "status": result["status"], "rank": result.get("rank"),
               "exit_code": result.get("exit_code"), "reason": str(result.get("reason") or "")[:MAX_REASON]}
    if isinstance(result.get("restart"), int):
        message["restart"] = result["restart"]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            sock.sendall(encode_frame(message))
            decoder = FrameDecoder(REPLY_TYPES)
            while data := sock.recv(1 << 16):
                for reply in decoder.feed(data):
                    if reply["type"] != "ok":
                        return ""
                    return HELD if reply.get("durable") is False else DURABLE  # an older meshd: no `durable`
    except (OSError, ProtocolError):
        pass
    return ""


def hand_over(job_dir: Path, spec: LaunchSpec, result: dict, patience: float = RESULT_PATIENCE,
              stopped=lambda: False) -> bool:
    """The job's result, durable before anything else: result.json (what meshd reads, restarted or not) or, when
    the disk refuses it, meshd itself over the job socket, which needs no disk and acknowledges the result once it
    is durable (it writes result.json itself, with root's reserve). Both are tried again every RESULT_RETRY seconds
    until one is durable. While meshd answers that it holds the end but cannot make it durable yet (its disk is
    full as well), this waits without a limit and the supervisor's session stays: meshd alive and answering still
    accounts for the job's GPUs, and a meshd SIGKILLed meanwhile finds this supervisor live when it restarts, adopts
    it, and is told again -- the end is never only in a meshd's memory. `patience` bounds only how long meshd does
    not answer at all (restarting while the disk is full); `stopped()` (a SIGTERM now) ends the wait. True once
    durable."""
    deadline, said, held = time.monotonic() + patience, False, False
    result = {**result, "restart": spec.restart}  # which run ended: a restarted meshd tells it from a newer one
    while True:
        try:
            write_result(job_dir, result)
            return True
        except OSError as exc:
            if not said:
                said = True
                say(f"cannot write result.json: {exc}; telling meshd over its socket")
        answer = tell_meshd(spec.socket, spec.job_id, result) if spec.socket else ""
        if answer == DURABLE:
            return True
        if answer == HELD:
            deadline = time.monotonic() + patience  # meshd is there: no limit while it answers
            if not held:
                held = True
                say("meshd holds the result but cannot make it durable yet (its disk is full too); offering it "
                    "again until one of them can")
        if (answer != HELD and time.monotonic() > deadline) or stopped():
            return False
        time.sleep(RESULT_RETRY)


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl failed")


def _die_with(parent: int):
    """preexec_fn of a rank: SIGKILL it when the supervisor dies (and at once if it already has)."""

    def setup() -> None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return setup


def _write(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        pass  # a full disk loses output, never the job


def rotate_log(path: Path, cap: int) -> bool:
    """When `path` is over `cap` bytes, keep its newest cap/2 bytes in PATH.1 and restart it; True if so."""
    try:
        size = path.stat().st_size
    except OSError:
        return False
    if size <= cap:
        return False
    keep = max(1, cap // 2)
    with open(path, "rb") as fh:
        fh.seek(max(0, size - keep))
        tail_bytes = fh.read(keep)
    old = path.with_name(path.name + ".1")
    tmp = path.with_name(path.name + ".1.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "wb") as fh:
        fh.write(tail_bytes)
    os.replace(tmp, old)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.ftruncate(fd, 0)  # the rank writes with O_APPEND: its next write lands at the new end
        os.write(fd, f"[meshd: log rotated at {size} bytes; the previous {len(tail_bytes)} bytes are in "
                     f"{old.name}, older output was dropped]\n".encode())
    finally:
        os.close(fd)
    return True


class Supervisor:
    def __init__(self, job_dir: Path, as_user: tuple[int, int, list[int]] | None = None, cgroup: str = "") -> None:
        self.job_dir = job_dir
        self.as_user = as_user  # (uid, gid, groups): work as that user and start the ranks as them (many users)
        self.cgroup = cgroup  # the job's cgroup to move into before any rank starts ("": none)
        self.spec = LaunchSpec.load(job_dir / "launch.json")
        self.procs: dict[int, subprocess.Popen] = {}  # pid -> worker
        self.rank_of: dict[int, int] = {}
        self.signalled: set[int] = set()  # ranks that got SIGTERM
        self.stopping = False
        self.terminated = False
        self.handing_over = False  # the job is over and its result is being handed over (`hand_over`)
        self.stop_handing_over = False  # a SIGTERM came meanwhile: stop waiting for meshd to make it durable
        self.tees: dict[int, tuple[int, int]] = {}  # read end of a rank's pipe -> (its rank log, the user's file)
        self.partial: dict[int, bytes] = {}  # read end -> the start of a line not yet written to the user's file

    def start(self) -> None:
        logs = self.job_dir / "logs"
        logs.mkdir(mode=0o700, exist_ok=True)
        Path(self.spec.checkpoint_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        me = os.getpid()
        files = self._open_files()
        for rank in range(len(self.spec.local_gpus)):
            if self.stopping:  # SIGTERM while spawning: start no more ranks
                break
            fd = os.open(logs / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if files is None:
                with open(fd, "ab") as out, self._privileged():
                    p = subprocess.Popen(
                        self.spec.command, cwd=self.spec.cwd, env=rank_env(self.spec, rank),
                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with(me),
                        **self._identity(),
                    )
            else:
                with self._privileged():
                    p = subprocess.Popen(
                        self.spec.command, cwd=self.spec.cwd, env=rank_env(self.spec, rank), stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE if files[1] != files[0] else subprocess.STDOUT,
                        preexec_fn=_die_with(me), **self._identity(),
                    )
                self.tees[p.stdout.fileno()] = (fd, files[0])
                if p.stderr is not None:
                    self.tees[p.stderr.fileno()] = (os.dup(fd), files[1])
            self.procs[p.pid] = p
            self.rank_of[p.pid] = rank
            if self.stopping:  # the SIGTERM came while this rank was being spawned: pass it on
                self._term_live()

    def become_user(self) -> None:
        """Work as the job's user from now on (effective ids: the ranks are started as root drops to them)."""
        if self.as_user is not None:
            uid, gid, groups = self.as_user
            os.setgroups(groups)
            os.setegid(gid)
            os.seteuid(uid)

    @contextlib.contextmanager
    def _privileged(self):
        """Back to root while a rank is started as the user (setuid in the child needs it)."""
        if self.as_user is None:
            yield
            return
        os.seteuid(0)
        os.setegid(0)
        try:
            yield
        finally:
            self.become_user()

    def _identity(self) -> dict:
        if self.as_user is None:
            return {}
        uid, gid, groups = self.as_user
        return {"user": uid, "group": gid, "extra_groups": groups}

    def _open_files(self) -> tuple[int, int] | None:
        """The user's --output / --error files, opened for appending (None when neither was asked for)."""
        out, err = self.spec.output, self.spec.error
        if not out and not err:
            return None
        fds = {}
        for path in dict.fromkeys(p for p in (out, err) if p):
            try:
                fds[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise SystemExit(f"cannot open {path}: {exc.strerror}") from None
        if not out:  # --error alone: stdout only to the rank logs
            fds[""] = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        return fds[out], fds[err or out]

    def copy_output(self, ready: list[int]) -> None:
        """Copy what the ranks wrote to their pipes into their logs and, whole lines at a time (ranks share the
        file), into the user's files; close at EOF."""
        for fd in ready:
            log, user = self.tees[fd]
            data = os.read(fd, 1 << 16)
            if not data:
                del self.tees[fd]
                _write(user, self.partial.pop(fd, b""))
                os.close(fd)
                os.close(log)
                continue
            _write(log, data)
            pending = self.partial.pop(fd, b"") + data
            cut = pending.rfind(b"\n") + 1 if len(pending) < PARTIAL_MAX else len(pending)
            _write(user, pending[:cut])
            if cut < len(pending):
                self.partial[fd] = pending[cut:]

    def _term_live(self) -> None:
        for pid, p in self.procs.items():
            if p.returncode is None and pid not in self.signalled:
                self.signalled.add(pid)
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass

    def stop_all(self) -> None:
        """SIGTERM every live rank now, SIGKILL after the grace period (a timer, not a sleep)."""
        if self.stopping:
            self._term_live()
            return
        self.stopping = True
        self._term_live()
        signal.setitimer(signal.ITIMER_REAL, max(self.spec.grace, 0.01))

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.returncode is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass

    def confine(self) -> None:
        """Join the job's cgroup (its memory limit) and take its CPUs; the ranks inherit both. Confinement that
        cannot be set up is said in supervisor.log and never stops the job."""
        if self.cgroup:
            try:
                join_cgroup(self.cgroup)
            except OSError as exc:
                say(f"memory limit not enforced: cannot join {self.cgroup}: {exc.strerror}")
                self.cgroup = ""
        if self.spec.cpus:
            try:
                os.sched_setaffinity(0, self.spec.cpus)
            except (OSError, ValueError) as exc:
                say(f"CPUs not pinned to {self.spec.cpus}: {exc}")

    def oom_reason(self, failure: dict) -> str:
        """A failed job's reason, said as an exceeded memory limit when its cgroup counts an OOM kill."""
        limit = self.spec.memory_limit_gb
        if limit is None or not oom_kills():
            return failure["reason"]
        return f"exceeded its memory limit of {limit:g} GiB (the kernel OOM-killed it): {failure['reason']}"

    def run(self) -> int:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        self.confine()
        self.become_user()
        reserve_result(self.job_dir)  # as the user who will write it
        signal.signal(signal.SIGTERM, lambda *_: self._on_term())
        signal.signal(signal.SIGINT, lambda *_: self._on_term())
        signal.signal(signal.SIGALRM, lambda *_: self.kill_all())
        self.start()
        failure: dict | None = None
        preempted = False
        pidfds = {pid: os.pidfd_open(pid) for pid in self.procs}
        logs = [self.job_dir / "logs" / f"rank{r}.log" for r in range(len(self.spec.local_gpus))]
        while pidfds:
            ready = select.select(list(pidfds.values()) + list(self.tees), [], [], POLL)[0]
            if self.tees:
                self.copy_output([fd for fd in ready if fd in self.tees])
            for log in logs:
                rotate_log(log, self.spec.log_max_bytes)
            for pid in list(pidfds):
                try:
                    done, status = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done, status = pid, 0
                if not done:
                    continue
                os.close(pidfds.pop(pid))
                code = os.waitstatus_to_exitcode(status)
                self.procs[pid].returncode = code
                if code == PREEMPTED_EXIT_CODE:  # checkpointed and left on request: resumable, not a failure
                    preempted = True
                elif code != 0 and failure is None and not self.terminated:
                    rank = self.rank_of[pid]
                    last = tail(self.job_dir / "logs" / f"rank{rank}.log")
                    why = f"exit code {code}" if code > 0 else f"signal {-code}"
                    failure = {
                        "status": "failed", "rank": rank, "exit_code": code,
                        "reason": f"rank {rank} failed ({why}): {last}" if last else f"rank {rank} failed ({why})",
                    }
                    self.stop_all()
        self.clean_up()
        for fd in list(self.tees):  # every process of the job is gone: the pipes hold the last of its output
            os.set_blocking(fd, False)
            try:
                while fd in self.tees:
                    self.copy_output([fd])
            except BlockingIOError:  # a writer outlived the clean-up: what it writes later is dropped
                log, user = self.tees.pop(fd)
                _write(user, self.partial.pop(fd, b""))
                os.close(fd)
                os.close(log)
        if failure is not None:
            failure["reason"] = self.oom_reason(failure)
        if self.terminated:
            result = {"status": "terminated", "rank": None, "exit_code": None, "reason": "terminated"}
        elif preempted and failure is None:
            result = {"status": "preempted", "rank": None, "exit_code": PREEMPTED_EXIT_CODE,
                      "reason": "checkpointed and exited on request (resumable)"}
        else:
            result = failure or {"status": "completed", "rank": None, "exit_code": 0, "reason": ""}
        self.handing_over = True
        if not hand_over(self.job_dir, self.spec, result, stopped=lambda: self.stop_handing_over):
            # neither the file nor meshd: say so (supervisor.log)
            say("the result reached neither result.json nor meshd")
            return 70
        return {"completed": 0, "failed": 1, "preempted": PREEMPTED_EXIT_CODE}.get(result["status"], 143)

    def clean_up(self) -> None:
        """SIGKILL what the ranks left behind (background children, daemonised grandchildren re-parented to
        this subreaper, anything else in the session) and wait until none is left."""
        me = os.getpid()
        deadline = time.monotonic() + CLEANUP_TIMEOUT
        while True:
            left = set(session_members(me)) | set(children(me))
            left.discard(me)
            while True:  # reap whatever already exited
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if not pid:
                    break
                left.discard(pid)
            if not left or time.monotonic() > deadline:
                return
            kill_all(sorted(left))
            time.sleep(0.02)

    def _on_term(self) -> None:
        if self.handing_over:  # every process of the job is gone: meshd (or a restarted one that does not know
            self.stop_handing_over = True  # the job) wants this supervisor gone too
            return
        self.terminated = True
        self.stop_all()


def parse_args(argv: list[str]) -> tuple[Path, tuple[int, int, list[int]] | None, str]:
    """JOB_DIR [--as-user UID:GID:G1,G2] [--cgroup PATH] -> (job dir, as_user, cgroup). The options come from
    meshd's command line, never from the job directory its user may write."""
    args, options = list(argv), {}
    while len(args) >= 3 and args[-2] in ("--as-user", "--cgroup"):
        value = args.pop()
        options[args.pop()] = value
    if len(args) != 1:
        sys.exit("usage: python -m meshsched.daemon.supervisor JOB_DIR [--as-user UID:GID:GROUPS] [--cgroup PATH]")
    as_user = None
    if "--as-user" in options:
        uid, gid, groups = options["--as-user"].split(":")
        as_user = (int(uid), int(gid), [int(g) for g in groups.split(",") if g])
    return Path(args[0]), as_user, options.get("--cgroup", "")


def main() -> None:
    job_dir, as_user, cgroup = parse_args(sys.argv[1:])
    try:
        code = Supervisor(job_dir, as_user, cgroup).run()
        with contextlib.suppress(OSError):  # a full disk (supervisor.log)
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)  # every process of the job is gone and result.json is written: meshd sees the exit now,
        # not after the interpreter's teardown
    except SystemExit as exc:
        if isinstance(exc.code, str):  # a job that cannot start (its --output cannot be opened): it failed
            write_result(job_dir, {"status": "failed", "rank": None, "exit_code": 1, "reason": exc.code})
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
