"""A job's environment is its submitter's, never meshd's (issue 22, point 1): nothing of the environment meshd was
started from reaches a job unless `job_env_passthrough` names it; the environment is kept with the job, so a
requeue after meshd was killed (kill -9) and restarted from another environment gives the same one.

meshd runs as a real process started from an environment of its own (SECRET_X, its own HOME and PATH); `mesh`
runs in-process, the test's environment being the submitter's.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from meshsched.cli import jobs
from meshsched.cli.client import Client
from meshsched.daemon.launcher import MESHD_VARS, exported

from tests.support.daemon import kill_sessions, poll, remove, short_dir, start_meshd

# meshd's own per-run variables besides MESHD_VARS (docs/daemon.md)
ADDED = {"PYTHONUNBUFFERED", "MESH_GRACE_PERIOD", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
         "TORCH_NCCL_ASYNC_ERROR_HANDLING"}  # torchrun's default 1, where the submitter did not set it
DUMP = f"#!{sys.executable}\nimport json, os, sys\nopen(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))\n"
# each run writes its environment to DIR/run<N>.json, then waits; SIGTERM (a requeue) -> the resumable exit
RUNS = f"""#!{sys.executable}
import json, os, signal, sys, time
out = os.path.join(sys.argv[1], "run" + os.environ["MESH_RESTART_COUNT"] + ".json")
open(out + ".tmp", "w").write(json.dumps(dict(os.environ)))
os.replace(out + ".tmp", out)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
time.sleep(120)
"""


class Meshd:
    """A real meshd started from `env` (restartable on the same state), `mesh` in-process pointed at it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.state, self.runtime, self.env = short_dir(), short_dir(), env
        self.proc = None
        self.pids: set[int] = set()

    def start(self, *flags: str, env: dict[str, str] | None = None) -> Client:
        self.proc, client = start_meshd(self.state, self.runtime, "--fake-gpus", "2", "--kill-grace", "1",
                                        "--preempt-grace", "1", *flags, env=env or self.env)
        return client

    def stop(self, sig: int = signal.SIGTERM) -> None:
        jobs_now = Client(self.runtime / "api.sock").call("GET", "/v1/jobs?all=1")
        self.pids |= {j["supervisor_pid"] for j in jobs_now}
        self.proc.send_signal(sig)
        self.proc.wait(20)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop(signal.SIGKILL)
        kill_sessions(self.pids)
        remove(self.state, self.runtime)


@pytest.fixture
def meshd(tmp_path, monkeypatch):
    home, bindir = tmp_path / "meshd-home", tmp_path / "meshd-bin"
    home.mkdir()
    bindir.mkdir()
    env = dict(os.environ, SECRET_X="meshd-secret", HOME=str(home), PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    m = Meshd(env)
    monkeypatch.setenv("MESH_API_SOCKET", str(m.runtime / "api.sock"))
    monkeypatch.delenv("SECRET_X", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "submitter-home"))  # the submitter's: unlike meshd's
    monkeypatch.chdir(tmp_path)
    yield m
    m.close()


def dumped(mesh, tmp_path: Path, name: str, *options: str) -> dict[str, str]:
    dump = tmp_path / "dump"
    dump.write_text(DUMP)
    dump.chmod(0o755)
    r = mesh("submit", "--wait", *options, str(dump), "--", str(tmp_path / name))
    assert r.exit_code == 0, r.output
    return json.loads((tmp_path / name).read_text())


def own_part(job: dict[str, str]) -> dict[str, str]:
    """A job's environment without the variables meshd sets for each run."""
    return {k: v for k, v in exported(job).items() if k not in ADDED and not k.startswith("MESH_")}


def test_nothing_of_meshds_environment_reaches_a_job(meshd, mesh, tmp_path, monkeypatch):
    """Fails before: a job ran with meshd's environment (its SECRET_X, HOME, PATH), not the submitter's."""
    meshd.start()
    job = dumped(mesh, tmp_path, "all.json")
    assert "SECRET_X" not in job
    assert job["HOME"] == os.environ["HOME"] and job["PATH"] == os.environ["PATH"]  # the submitter's
    assert own_part(job) == own_part(dict(os.environ))  # all of the submitter's, nothing else
    assert set(job) - set(os.environ) <= MESHD_VARS | ADDED | {k for k in job if k.startswith("MESH_")}
    bare = dumped(mesh, tmp_path, "none.json", "--export=NONE")
    assert "SECRET_X" not in bare and bare["PATH"] == jobs.JOB_PATH
    assert bare["HOME"] not in (meshd.env["HOME"], os.environ["HOME"])  # its user's, from the password database

    # the admin lets SECRET_X through: jobs get meshd's, unless the submitter exports their own
    meshd.stop()
    config = tmp_path / "meshd.toml"
    config.write_text('job_env_passthrough = "SECRET_X, NO_SUCH_VAR"\n')
    meshd.start("--config", str(config))
    assert dumped(mesh, tmp_path, "through.json", "--export=NONE")["SECRET_X"] == "meshd-secret"
    monkeypatch.setenv("SECRET_X", "the-users-own")
    assert dumped(mesh, tmp_path, "own.json")["SECRET_X"] == "the-users-own"


@pytest.mark.slow
def test_a_requeue_after_meshd_was_killed_gets_the_same_environment(meshd, mesh, tmp_path, monkeypatch):
    """Fails before: the job had meshd's environment, so a run after meshd's restart from another environment had
    another one (and neither had the submitter's FOO)."""
    client = meshd.start()
    monkeypatch.setenv("FOO", "at-submit")
    runs = tmp_path / "runs"
    runs.mkdir()
    script = tmp_path / "runs.py"
    script.write_text(RUNS)
    script.chmod(0o755)
    job = mesh("submit", str(script), "--", str(runs)).stdout.split()[-1]
    poll(lambda: (runs / "run0.json").exists(), what="the first run")
    meshd.stop(signal.SIGKILL)  # the job runs on in its own session
    monkeypatch.setenv("FOO", "changed-since")  # the submitter's shell now: not the job's
    client = meshd.start(env=dict(meshd.env, SECRET_X="another-secret", HOME="/nonexistent"))
    poll(lambda: client.call("GET", f"/v1/jobs/{job}")["state"] == "RUNNING", what="the job adopted")
    r = mesh("requeue", job)
    assert r.exit_code == 0, r.output
    poll(lambda: list(runs.glob("run[1-9].json")), timeout=60, what="the run after the requeue")
    first = json.loads((runs / "run0.json").read_text())
    again = json.loads(next(runs.glob("run[1-9].json")).read_text())
    assert first["FOO"] == again["FOO"] == "at-submit" and "SECRET_X" not in again
    assert own_part(first) == own_part(again)
    mesh("cancel", job)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: runs meshd as root and creates a throwaway user with "
                    "useradd (CI runs as root)")
def test_a_second_users_job_has_their_environment_and_none_of_roots(tmp_path, mesh, monkeypatch):
    """A root-run meshd started with SECRET_X serves another local user: their job's environment is what they
    exported, with nothing of root's (SECRET_X, root's PATH and HOME)."""
    import pwd
    import shutil
    import subprocess

    name, userdel = f"e{os.getpid() % 100000}", shutil.which("userdel") or "userdel"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    m = None
    try:
        user = pwd.getpwnam(name)
        base = Path(short_dir())
        os.chmod(base, 0o755)
        (base / name).mkdir()
        os.chown(base / name, user.pw_uid, user.pw_gid)
        dump = base / name / "dump.sh"
        dump.write_text('#!/bin/sh\nexec /usr/bin/env > "$1"\n')
        dump.chmod(0o755)
        m = Meshd(dict(os.environ, SECRET_X="root-secret", HOME="/root", MESHD_SUBMIT_USERS=name))
        m.start()
        theirs = {"PATH": "/usr/bin:/bin", "HOME": f"/home/{name}", "USER": name, "LOGNAME": name, "LANG": "C.UTF-8",
                  "MESH_API_SOCKET": str(m.runtime / "api.sock"), "WANDB_PROJECT": "mine"}
        monkeypatch.setattr(os, "environ", dict(theirs))  # the user's shell
        monkeypatch.chdir(base / name)
        os.setegid(user.pw_gid)
        os.seteuid(user.pw_uid)
        try:
            r = mesh("submit", "--wait", str(dump), "--", str(base / name / "env.txt"))
        finally:
            os.seteuid(0)
            os.setegid(0)
        assert r.exit_code == 0, r.output
        job = dict(line.split("=", 1) for line in (base / name / "env.txt").read_text().splitlines() if "=" in line)
        assert {k: job.get(k) for k in theirs} == theirs and "SECRET_X" not in job
        assert set(job) - set(theirs) <= MESHD_VARS | ADDED | {"PWD"} | {k for k in job if k.startswith("MESH_")}
    finally:
        if m is not None:
            m.close()
        subprocess.run([userdel, name], check=False, capture_output=True)
