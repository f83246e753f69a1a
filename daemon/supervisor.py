"""The per-job supervisor: `python -m meshsched.daemon.supervisor JOB_DIR`, started by meshd in its own session.

It reads JOB_DIR/launch.json, starts one process per rank with torchrun's environment contract, sends each
rank's stdout+stderr to JOB_DIR/logs/rank<N>.log, and waits. When a rank fails the others get SIGTERM, then
SIGKILL after the grace period. SIGTERM to the supervisor (cancel, preempt) is forwarded the same way.
The outcome goes to JOB_DIR/result.json (written atomically) so that meshd learns it even if meshd was
restarted meanwhile: {"status": completed|failed|terminated|preempted, "rank", "exit_code", "reason"};
"preempted" when ranks exited with PREEMPTED_EXIT_CODE (checkpointed on meshd's request) and none failed.
Because it lives in its own session, restarting meshd does not stop a job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from meshsched.protocol import PREEMPTED_EXIT_CODE

TAIL_LINES = 5


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

    @classmethod
    def load(cls, path: Path) -> LaunchSpec:
        return cls(**json.loads(path.read_text()))


def rank_env(spec: LaunchSpec, rank: int) -> dict[str, str]:
    """The environment of one worker: torchrun's contract plus CUDA_VISIBLE_DEVICES and MESH_*."""
    world = len(spec.local_gpus)
    env = dict(spec.env)
    if rank < len(spec.rank_envs):
        env.update(spec.rank_envs[rank])
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(spec.master_port),
        CUDA_VISIBLE_DEVICES=str(spec.local_gpus[rank]),
        MESH_JOB_ID=spec.job_id,
        MESH_SOCKET=spec.socket,
        MESH_CHECKPOINT_DIR=spec.checkpoint_dir,
        MESH_RESTART_COUNT=str(spec.restart),
        PYTHONUNBUFFERED="1",
    )
    return env


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 4096))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def write_result(job_dir: Path, result: dict) -> None:
    tmp = job_dir / "result.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, job_dir / "result.json")


class Supervisor:
    def __init__(self, job_dir: Path) -> None:
        self.job_dir = job_dir
        self.spec = LaunchSpec.load(job_dir / "launch.json")
        self.procs: dict[int, subprocess.Popen] = {}  # pid -> worker
        self.rank_of: dict[int, int] = {}
        self.stopping = False
        self.terminated = False

    def start(self) -> None:
        logs = self.job_dir / "logs"
        logs.mkdir(exist_ok=True)
        Path(self.spec.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        for rank in range(len(self.spec.local_gpus)):
            with open(logs / f"rank{rank}.log", "ab") as out:
                p = subprocess.Popen(
                    self.spec.command, cwd=self.spec.cwd, env=rank_env(self.spec, rank),
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                )
            self.procs[p.pid] = p
            self.rank_of[p.pid] = rank

    def stop_all(self) -> None:
        """SIGTERM every live rank now, SIGKILL after the grace period (a timer, not a sleep)."""
        if self.stopping:
            return
        self.stopping = True
        for p in self.procs.values():
            if p.returncode is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        signal.setitimer(signal.ITIMER_REAL, max(self.spec.grace, 0.01))

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.returncode is None:
                try:
                    p.kill()
                except ProcessLookupError:
                    pass

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._on_term())
        signal.signal(signal.SIGINT, lambda *_: self._on_term())
        signal.signal(signal.SIGALRM, lambda *_: self.kill_all())
        self.start()
        failure: dict | None = None
        preempted = False
        live = set(self.procs)
        while live:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            if pid not in live:
                continue
            live.discard(pid)
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
        if self.terminated:
            result = {"status": "terminated", "rank": None, "exit_code": None, "reason": "terminated"}
        elif preempted and failure is None:
            result = {"status": "preempted", "rank": None, "exit_code": PREEMPTED_EXIT_CODE,
                      "reason": "checkpointed and exited on request (resumable)"}
        else:
            result = failure or {"status": "completed", "rank": None, "exit_code": 0, "reason": ""}
        write_result(self.job_dir, result)
        return {"completed": 0, "failed": 1, "preempted": PREEMPTED_EXIT_CODE}.get(result["status"], 143)

    def _on_term(self) -> None:
        self.terminated = True
        self.stop_all()


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m meshsched.daemon.supervisor JOB_DIR")
    sys.exit(Supervisor(Path(sys.argv[1])).run())


if __name__ == "__main__":
    main()
