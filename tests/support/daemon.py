"""Shared helpers for the daemon tests: short socket dirs, configs, polling with a deadline, cleanup, an SDK job."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from meshsched.daemon.config import DaemonConfig

from meshsched.wire.protocol import SubmitRequest

PY = sys.executable


def short_dir() -> Path:
    """A short directory under /tmp: Unix socket paths must stay < 100 characters."""
    return Path(tempfile.mkdtemp(prefix="md", dir="/tmp"))


def make_config(state: Path, runtime: Path, gpus: int = 4, **kw) -> DaemonConfig:
    return DaemonConfig(state_dir=state, runtime_dir=runtime, fake_gpus=gpus, node_name="n1",
                        kill_grace=kw.pop("kill_grace", 1.0), **kw).validate()


def py(code: str) -> list[str]:
    return [PY, "-c", code]


async def wait_for(pred, timeout: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def poll(pred, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_meshd(state: Path, runtime: Path, *flags: str, env: dict | None = None):
    """A real meshd process on fake GPUs (`flags`: more meshd options); returns (process, API client) once it serves."""
    from meshsched.cli.client import Client, DaemonUnavailable

    argv = [PY, "-m", "meshsched.daemon.main", "--state-dir", str(state), "--runtime-dir", str(runtime), *flags]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env)
    client = Client(runtime / "api.sock")

    def up() -> bool:
        try:
            return client.call("GET", "/v1/health")["status"] == "running"
        except DaemonUnavailable:
            assert proc.poll() is None, "meshd exited"
            return False

    poll(up, what="meshd serving")
    return proc, client


def kill_sessions(pids) -> None:
    """SIGKILL the sessions (job supervisors and their ranks) a test left behind."""
    for pid in pids:
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


async def close_daemon(daemon) -> None:
    """Close a test's NodeDaemon, then kill what its jobs left running and remove their cgroups."""
    pids = [r.supervisor_pid for r in daemon.records.values()]
    await daemon.close()
    kill_sessions(pids)
    release_cgroups(daemon)


def release_cgroups(daemon) -> None:
    """Remove the job cgroups (daemon/confine.py) of jobs a test killed behind meshd's back, and their parent."""
    conf = daemon.launcher.confiner if daemon.launcher is not None else None
    if conf is None or conf.parent is None:
        return
    deadline = time.monotonic() + 5.0
    while not conf.remove() and time.monotonic() < deadline:  # SIGKILLed processes take a moment to go
        time.sleep(0.02)
    try:
        conf.parent.rmdir()
    except OSError:
        pass


def sweep_job_cgroups() -> None:
    """Remove the empty job cgroups (and their parents) that tests which kill jobs behind meshd's back left
    under this process's cgroup (v2, or v1 memory); one with a process in it stays."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, path = line.split(":", 2)
        base = Path("/sys/fs/cgroup", *(("memory",) if "memory" in controllers.split(",") else ()), path.lstrip("/"))
        if controllers and "memory" not in controllers.split(","):
            continue
        for leftover in [*base.glob("mesh-jobs-*/mesh-job-*"), *base.glob("mesh-jobs-*")]:
            try:
                leftover.rmdir()
            except OSError:
                pass


def remove(*dirs: Path) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.asynccontextmanager
async def daemon_with_mps(state: Path, gpus: int, **config):
    """A started NodeDaemon on `gpus` fake GPUs whose MPS manager is real (a stand-in control tool on PATH, the
    `fake_control` fixture), as with NVML GPUs and use_mps; `config`: more DaemonConfig fields (a policy, ...);
    everything it started is gone afterwards."""
    from meshsched.daemon.node import NodeDaemon

    runtime = short_dir()
    d = NodeDaemon(make_config(state, runtime, gpus=gpus, use_mps=True, **config))  # RealMps(runtime / "mps", ...)
    await d.start()
    try:
        yield d
    finally:
        pids = [r.supervisor_pid for r in d.records.values()]
        await d.close()
        kill_sessions(pids)
        remove(runtime)


def submit(d, command: list[str], gpus: int = 1, iters: int = 100, **kw):
    return d.submit(SubmitRequest(command=command, cwd="/tmp", gpus=gpus, iterations=iters, **kw), "tester")


def state(d, job_id: str) -> str:
    return d.records[job_id].state


# A meshsched.job script: counts steps, checkpoints, exits on request, prints its total at the end.
JOB = '''
import json, os, sys, time
from pathlib import Path
from meshsched import job

class Counter(job.State):
    def __init__(self):
        super().__init__("counter")
        self.total = 0
    def state_dict(self):
        return {"total": self.total}
    def load_state_dict(self, s):
        self.total = s["total"]
    def save(self, path):
        path.write_text(json.dumps(self.state_dict()))
    def load(self, path):
        self.load_state_dict(json.loads(path.read_text()))

c = Counter()
sess = job.attach(checkpoint_every=1000, rng=False)
sess.add(c)
print("resumed at", sess.resume(), flush=True)
while sess.step < 300:
    c.total += sess.step
    if os.environ["MESH_RESTART_COUNT"] == "0":
        time.sleep(0.02)
    if sess.end_step(samples=4):
        print("exit at", sess.step, "-", sess.exit_reason, flush=True)
        sess.exit()
sess.close()
print("done", sess.step, c.total, flush=True)
'''


@contextlib.contextmanager
def daemon_in_thread(cfg: DaemonConfig):
    """(meshd, its loop): a NodeDaemon started in a background thread's event loop, for tests that call it as a
    client would (`mesh` in-process, HTTP); closed, and its jobs' sessions killed, at the end."""
    from meshsched.daemon.node import NodeDaemon

    loop, d, started = asyncio.new_event_loop(), NodeDaemon(cfg), threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(d.start())
        started.set()
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(20)
    try:
        yield d, loop
    finally:
        pids = [r.supervisor_pid for r in list(d.records.values())]
        asyncio.run_coroutine_threadsafe(d.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)
        loop.close()
        kill_sessions(pids)


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str):
    """`path` (created) with a tmpfs of `size` (e.g. "2m") mounted on it, unmounted at the end; the test is
    skipped with the reason where mounting is not allowed (needs root or CAP_SYS_ADMIN)."""
    import pytest

    path.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True,
                       capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a {size} tmpfs (needs root or CAP_SYS_ADMIN): {exc}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
