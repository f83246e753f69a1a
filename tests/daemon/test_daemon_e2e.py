"""Multi-process: real meshd processes, real jobs, the real `mesh` client; kill -9 of meshd mid-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from meshsched.cli.client import Client, DaemonUnavailable

from tests.support.daemon import kill_sessions, poll, py, remove, short_dir

pytestmark = pytest.mark.slow


class Meshd:
    def __init__(self, state, runtime) -> None:
        self.state, self.runtime = state, runtime
        self.proc: subprocess.Popen | None = None
        self.client = Client(runtime / "api.sock")

    def start(self) -> None:
        argv = [sys.executable, "-m", "meshsched.daemon.main", "--state-dir", str(self.state),
                "--runtime-dir", str(self.runtime), "--fake-gpus", "4", "--kill-grace", "1", "--node-name", "e2e"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)

        def up() -> bool:
            try:
                return self.client.call("GET", "/v1/health")["status"] == "running"
            except DaemonUnavailable:
                assert self.proc.poll() is None, "meshd exited"
                return False

        poll(up, what="meshd serving")

    def submit(self, code: str, gpus: int, iters: int) -> str:
        body = {"command": py(code), "cwd": "/tmp", "gpus": gpus, "iterations": iters}
        return self.client.call("POST", "/v1/jobs", body)["job_id"]

    def jobs(self) -> dict[str, dict]:
        return {j["job_id"]: j for j in self.client.call("GET", "/v1/jobs")}

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)


@pytest.fixture
def meshd(tmp_path):
    runtime = short_dir()
    m = Meshd(tmp_path / "state", runtime)
    yield m
    pids = []
    try:
        pids = [j["supervisor_pid"] for j in m.jobs().values()]
    except (DaemonUnavailable, OSError):
        pass
    m.stop()
    kill_sessions(pids)
    remove(runtime)


def test_policy_order_cancel_and_cli(meshd):
    meshd.start()
    blocker = meshd.submit("import time; time.sleep(1.0)", 4, 1)
    long, mid, short = (meshd.submit("import time; time.sleep(0.3)", 2, n) for n in (300, 200, 100))
    doomed = meshd.submit("import time; time.sleep(60)", 4, 1000)
    env = dict(os.environ, MESH_API_SOCKET=str(meshd.runtime / "api.sock"))
    out = subprocess.run([sys.executable, "-m", "meshsched.cli.main", "ls"], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "(Priority)" in out.stdout and "(Resources)" in out.stdout, out.stdout + out.stderr
    poll(lambda: meshd.jobs()[doomed]["state"] == "RUNNING", what="last job running")
    jobs = meshd.jobs()
    assert all(jobs[j]["state"] == "COMPLETED" for j in (blocker, long, mid, short))
    starts = {j: jobs[j]["start_time"] for j in (short, mid, long)}
    assert starts[short] <= starts[mid] < starts[long]
    meshd.client.call("POST", f"/v1/jobs/{doomed}/cancel")
    poll(lambda: meshd.jobs()[doomed]["supervisor_pid"] == 0, what="cancelled job's processes gone")
    assert meshd.jobs()[doomed]["state"] == "CANCELLED"


def test_kill_9_mid_run_loses_nothing(meshd):
    meshd.start()
    a = meshd.submit("import time; time.sleep(2.5)", 2, 10)
    b = meshd.submit("import time; time.sleep(2.5)", 2, 20)
    c = meshd.submit("import time; time.sleep(0.2)", 4, 30)
    poll(lambda: meshd.jobs()[b]["state"] == "RUNNING", what="two jobs running")
    pids = {j: meshd.jobs()[j]["supervisor_pid"] for j in (a, b)}
    meshd.stop(signal.SIGKILL)
    assert all(os.kill(p, 0) is None for p in pids.values())  # jobs outlive meshd
    meshd.start()
    jobs = meshd.jobs()
    assert jobs[a]["state"] == "RUNNING" and jobs[a]["supervisor_pid"] == pids[a]
    assert jobs[b]["state"] == "RUNNING" and jobs[c]["state"] == "PENDING"
    poll(lambda: all(j["state"] == "COMPLETED" for j in meshd.jobs().values()), what="all completed after restart")
    assert meshd.jobs()[c]["launches"] == 1 and meshd.jobs()[c]["restarts"] == 0  # ran once: no restart


def test_examples_train_runs_under_meshd_with_two_gpus(meshd):
    pytest.importorskip("torch")
    meshd.start()
    train = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train.py")
    body = {"command": [sys.executable, os.path.abspath(train), "--steps", "12", "--checkpoint-every", "5"],
            "cwd": "/tmp", "gpus": 2, "iterations": 12}
    job = meshd.client.call("POST", "/v1/jobs", body)["job_id"]
    poll(lambda: meshd.jobs()[job]["state"] in ("COMPLETED", "FAILED"), timeout=90, what="DDP job finished")
    info = meshd.jobs()[job]
    assert info["state"] == "COMPLETED", info["reason"]
    assert (meshd.state / "jobs" / job / "checkpoints" / "step-00000010" / "meta.json").exists()  # meshsched.job
    log = (meshd.state / "jobs" / job / "logs" / "rank0.log").read_text()
    assert "world=2 backend=gloo" in log and "done: 12 steps" in log


def test_bad_frames_and_impersonation_leave_meshd_serving(meshd):
    import socket

    from meshsched.wire.protocol import HEADER, REPLY_TYPES, FrameDecoder, encode_frame

    meshd.start()
    victim = meshd.submit("import time; time.sleep(30)", 1, 10)
    code = (
        "from meshsched.job.client import JobClient\nc = JobClient.from_env()\n"
        f"try:\n    c.request({{'type': 'checkpoint', 'job_id': '{victim}', 'iterations': 9}})\n"
        "except Exception as e:\n    print('refused:', e)\n"
    )
    rogue = meshd.submit(code, 1, 10)
    poll(lambda: meshd.jobs()[rogue]["state"] == "COMPLETED", what="rogue job done")
    log = (meshd.state / "jobs" / rogue / "logs" / "rank0.log").read_text()
    assert f"may speak only for job {rogue}" in log
    assert meshd.jobs()[victim]["checkpoint_iterations"] == 0
    for payload in (HEADER.pack(10**9), HEADER.pack(2) + b"\xc1\xc1", encode_frame({"type": "ping"})):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(meshd.runtime / "job.sock"))
            try:  # meshd refuses a non-job peer at accept: it may have closed before the send
                s.sendall(payload)
            except BrokenPipeError:
                pass
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            assert FrameDecoder(REPLY_TYPES).feed(data)[0]["type"] == "error"
    assert meshd.client.call("GET", "/v1/health")["status"] == "running"
    assert meshd.jobs()[victim]["state"] == "RUNNING"
