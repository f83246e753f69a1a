"""A restart of meshd in the middle of a shared pair keeps both jobs' ExecConfig (issue 9)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from tests.support.daemon import kill_sessions, poll, remove, short_dir, start_meshd

pytestmark = pytest.mark.slow


def _start(state, runtime):
    return start_meshd(state, runtime, "--fake-gpus", "1", "--policy", "castor", "--kill-grace", "1", "--node-name",
                       "pair", env=dict(os.environ, MESHD_SYSTEMD_SCOPE="no"))


def test_meshd_restart_mid_shared_pair_keeps_both_exec_configs(tmp_path):
    state, runtime = tmp_path / "state", short_dir()
    proc, client = _start(state, runtime)
    pids: list[int] = []
    try:
        def submit(model: str, batch: int, iters: int) -> str:
            body = {"command": [sys.executable, "-c", "import time; time.sleep(120)"], "cwd": "/tmp", "gpus": 1,
                    "name": model, "model": model, "batch_size": batch, "iterations": iters}
            return client.call("POST", "/v1/jobs", body)["job_id"]

        a = submit("resnet18", 16, 20000)
        poll(lambda: client.call("GET", f"/v1/jobs/{a}")["state"] == "RUNNING", what="A running")
        b = submit("resnet50", 128, 2000)  # Castor shares A's GPU with B at micro-batch 32 x 4
        poll(lambda: client.call("GET", f"/v1/jobs/{b}")["state"] == "RUNNING", what="B sharing")
        before = {j: client.call("GET", f"/v1/jobs/{j}")["exec"] for j in (a, b)}
        assert before[b]["micro_batch"] * before[b]["accumulation"] == 128 and before[b]["accumulation"] > 1
        pids = [client.call("GET", f"/v1/jobs/{j}")["supervisor_pid"] for j in (a, b)]
        proc.send_signal(signal.SIGKILL)  # meshd dies; the jobs' processes live on in their own sessions
        proc.wait(10)
        proc, client = _start(state, runtime)
        after = {j: client.call("GET", f"/v1/jobs/{j}") for j in (a, b)}
        assert all(v["state"] == "RUNNING" for v in after.values())  # re-adopted, not restarted
        assert {j: v["exec"] for j, v in after.items()} == before
        assert after[b]["partners"] == [a] and after[a]["partners"] == [b]
        assert [v["supervisor_pid"] for v in after.values()] == pids
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        kill_sessions(pids)
        remove(runtime)
