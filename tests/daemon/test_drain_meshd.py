"""`mesh drain` / `mesh resume` on a one-server meshd (issue 23, point 4): the running job finishes, a queued job
does not start on the drained node, the drain survives kill -9 of meshd, a resume starts the job, and a user who
is not an operator is refused with one line. A real meshd process (kill -9); `nobody` plays the ordinary user."""

from __future__ import annotations

import os
import pwd
import signal
import tempfile
from pathlib import Path

import pytest
from meshsched.cli.client import ApiError, Client

from tests.support.daemon import PY, kill_sessions, poll, remove, short_dir, start_meshd

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: acts as the user nobody (seteuid) to be "
                                "refused as a non-operator (CI runs as root)")


def job_state(client: Client, job_id: str) -> str:
    return client.call("GET", f"/v1/jobs/{job_id}")["state"]


def test_drain_one_server_survives_kill9_and_resume(mesh, monkeypatch):
    base = Path(tempfile.mkdtemp(prefix="dr", dir="/tmp"))
    os.chmod(base, 0o755)
    runtime = short_dir()
    go = base / "go"
    env = dict(os.environ, MESHD_SUBMIT_USERS="nobody")
    flags = ("--fake-gpus", "2", "--node-name", "n1", "--kill-grace", "1")
    proc, client = start_meshd(base / "state", runtime, *flags, env=env)
    monkeypatch.setenv("MESH_API_SOCKET", str(runtime / "api.sock"))
    wait_go = ["/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.1; done"]
    pids: list[int] = []
    try:
        a = client.call("POST", "/v1/jobs", {"command": wait_go, "cwd": str(base), "gpus": 1})["job_id"]
        poll(lambda: job_state(client, a) == "RUNNING", what="job a running")
        r = mesh("drain", "n1", "--reason", "driver update")
        assert r.exit_code == 0, r.output
        assert "DRAINING" in r.stdout
        b = client.call("POST", "/v1/jobs", {"command": [PY, "-c", "pass"], "cwd": str(base), "gpus": 1})["job_id"]
        r = mesh("nodes")
        assert "DRAINING" in r.stdout and "driver update" in r.stdout and "by root" in r.stdout
        assert job_state(client, b) == "PENDING"  # one GPU is free, but drained
        assert "drained" in client.call("GET", f"/v1/jobs/{b}")["reason"]
        pids = [j["supervisor_pid"] for j in client.call("GET", "/v1/jobs?all=1")]
        go.touch()
        poll(lambda: job_state(client, a) == "COMPLETED", what="the running job finishes")
        assert job_state(client, b) == "PENDING"
        assert "DRAINED" in mesh("nodes").stdout

        proc.send_signal(signal.SIGKILL)
        proc.wait(20)
        proc, client = start_meshd(base / "state", runtime, *flags, env=env)
        assert [d["state"] for d in client.call("GET", "/v1/drains")] == ["DRAINED"]
        assert job_state(client, b) == "PENDING"  # the recovery pass did not start it
        nodes = mesh("nodes", "--json")
        assert '"DRAINED"' in nodes.stdout and "driver update" in nodes.stdout

        nobody = pwd.getpwnam("nobody")
        os.setegid(nobody.pw_gid)
        os.seteuid(nobody.pw_uid)
        try:
            with pytest.raises(ApiError) as exc:
                Client(runtime / "api.sock").call("POST", "/v1/resume", {"node": "n1"})
        finally:
            os.seteuid(0)
            os.setegid(0)
        assert exc.value.status == 403 and "operator" in str(exc.value) and "\n" not in str(exc.value)

        r = mesh("resume", "n1")
        assert r.exit_code == 0, r.output
        poll(lambda: job_state(client, b) == "COMPLETED", what="the queued job starts after the resume")
        assert client.call("GET", "/v1/drains") == []
        assert mesh("drain", "n9", "--reason", "x").exit_code == 1  # unknown node: one line
        assert mesh("drain", "n1:x", "--reason", "x").exit_code == 2
    finally:
        pids += [j["supervisor_pid"] for j in client.call("GET", "/v1/jobs?all=1")]
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        kill_sessions(pids)
        remove(base, runtime)
