"""meshd restarting itself in place (`NodeDaemon.restart`, then `daemon/main.py` execs it; the mesh asks for it when
its log was compacted past a running node): the same PID serves again and re-adopts a job that ran across it,
whose supervisor, still this process's child, is reaped when the job ends; the job completes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.daemon import PY, kill_sessions, poll, remove, short_dir

# meshd, with a restart asked once when the file RESTART_FILE appears (RESTARTED keeps the started-again one from
# asking again: execv keeps the environment)
_WRAPPER = """
import asyncio, os, sys
from pathlib import Path
from meshsched.daemon import main
from meshsched.daemon.node import NodeDaemon

start = NodeDaemon.start

async def start_then_watch(self):
    await start(self)
    if os.environ.get("RESTARTED"):
        return
    async def watch():
        while not Path(os.environ["RESTART_FILE"]).exists():
            await asyncio.sleep(0.05)
        os.environ["RESTARTED"] = "1"
        self.restart("a test asked")
    self._restart_watch = asyncio.get_running_loop().create_task(watch())

NodeDaemon.start = start_then_watch
main.main(sys.argv[1:])
"""


@pytest.mark.slow
def test_meshd_restarted_in_place_re_adopts_the_running_job_and_it_completes(tmp_path):
    from meshsched.cli.client import Client, DaemonUnavailable

    runtime, trigger, release = short_dir(), tmp_path / "restart", tmp_path / "release"
    env = {"PATH": "/usr/bin:/bin", "RESTART_FILE": str(trigger)}
    log = open(tmp_path / "meshd.log", "wb")
    proc = subprocess.Popen([PY, "-c", _WRAPPER, "--state-dir", str(tmp_path / "state"), "--runtime-dir", str(runtime),
                             "--fake-gpus", "1", "--kill-grace", "1"], stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    client = Client(runtime / "api.sock")

    def serving() -> bool:
        try:
            return client.call("GET", "/v1/health")["status"] == "running"
        except DaemonUnavailable:
            assert proc.poll() is None, (tmp_path / "meshd.log").read_text()
            return False

    job_id, pids = None, []
    try:
        poll(serving, what="meshd serving")
        wait = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.05)"
        job_id = client.call("POST", "/v1/jobs", {"command": [sys.executable, "-c", wait], "gpus": 1, "cwd": "/tmp",
                                                  "env": {}})["job_id"]
        poll(lambda: client.call("GET", f"/v1/jobs/{job_id}")["state"] == "RUNNING", what="the job running")
        before = client.call("GET", f"/v1/jobs/{job_id}")
        supervisor = before["supervisor_pid"]
        pids.append(supervisor)
        trigger.touch()
        poll(lambda: b"meshd: restarting: a test asked" in (tmp_path / "meshd.log").read_bytes(), what="the restart")
        poll(lambda: (tmp_path / "meshd.log").read_bytes().count(b"meshd: serving") == 2 and serving(),
             what="meshd serving again")
        assert proc.poll() is None  # the same process (PID) serves again
        job = client.call("GET", f"/v1/jobs/{job_id}")
        assert job["state"] == "RUNNING" and job["supervisor_pid"] == supervisor and job["restarts"] == before["restarts"], job
        release.touch()
        poll(lambda: client.call("GET", f"/v1/jobs/{job_id}")["state"] == "COMPLETED", what="the job completes")
        poll(lambda: _zombies(proc.pid) == [], what="its supervisor reaped")
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
        kill_sessions(pids)
        remove(runtime)


def _zombies(parent: int) -> list[str]:
    out = subprocess.run(["ps", "-o", "pid=,stat=", "--ppid", str(parent)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split()[1].startswith("Z")]
