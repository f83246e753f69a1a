"""Slurm's options on meshd's side and torchrun's variables (issue 22, points 5 and 7): `--dependency singleton`,
release of an ended job, unknown models refused at submit, `--user` of another user's jobs, `--wait` on a job a
signal killed, and the variables torch's elastic agent sets for each rank."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from meshsched import events as ev
from meshsched.daemon.control import parse_dependency
from meshsched.daemon.supervisor import LaunchSpec, rank_env
from meshsched.state import Dependency, DependencyKind, JobSpec
from tests.support.daemon import poll
from tests.support.engine import Harness

SINGLETON = DependencyKind.SINGLETON


def _submit(h: Harness, job_id: str, now: float, name: str = "train", user: str = "ann", singleton: bool = True):
    deps = (Dependency(SINGLETON, ""),) if singleton else ()
    spec = JobSpec(job_id, 1, "m", 100, 100, submit_time=now, name=name, user=user, dependencies=deps)
    return h(ev.JobSubmitted(h.sid(f"submit-{job_id}"), spec), now)


def test_singleton_waits_for_the_same_users_job_of_that_name():
    assert parse_dependency("singleton") == ((SINGLETON, ""),)
    with pytest.raises(ValueError):
        parse_dependency("singleton:3")
    h = Harness()
    _submit(h, "a", 0.0, singleton=False)
    h.started("a", 1.0)
    _submit(h, "b", 2.0)  # a runs: b waits
    _submit(h, "c", 3.0)  # a runs, b is queued ahead: c waits
    _submit(h, "other-name", 3.0, name="eval")
    _submit(h, "other-user", 3.0, user="bob")
    assert h.engine.pending_reason("b") == h.engine.pending_reason("c") == "Dependency"
    assert h.engine.pending_reason("other-name") != "Dependency"
    assert h.engine.pending_reason("other-user") != "Dependency"
    h.finished("a", 10.0)
    assert h.engine.pending_reason("b") != "Dependency" and h.engine.pending_reason("c") == "Dependency"
    h.started("b", 11.0)
    h.cancel("b", 12.0)
    assert h.engine.pending_reason("c") != "Dependency"


def test_torchruns_variables_as_its_agent_sets_them(monkeypatch):
    spec = LaunchSpec(job_id="12_3", command=["x"], cwd="/", env={"GROUP_WORLD_SIZE": "2"}, local_gpus=[0, 1],
                      master_port=29500, restart=2, socket="/s", checkpoint_dir="/c", grace=1.0, first_rank=2,
                      world_size=4, node_rank=1)
    env = rank_env(spec, 1)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                                "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
                                "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
                                "TORCH_NCCL_ASYNC_ERROR_HANDLING")} == {
        "RANK": "3", "LOCAL_RANK": "1", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4", "ROLE_NAME": "default", "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "12_3", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    spec.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "0"  # the job's own value, as torchrun keeps it
    assert rank_env(spec, 0)["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


def test_cancel_user_of_another_user_says_so(served):
    me = SimpleNamespace(name="ann", uid=4242, operator=False)
    with pytest.raises(LookupError, match="not yours"):
        served.control.select({"user": "pann"}, me)
    assert served.control.select({"user": "ann"}, me) == []


def test_release_of_an_ended_job_unknown_model_and_wait_on_a_signal(served, mesh, tmp_path):
    path = tmp_path / "job.py"
    path.write_text("import os, signal, sys, time\nif sys.argv[1:] == ['segv']: os.kill(os.getpid(), signal.SIGSEGV)\n"
                    "time.sleep(0.2)\n")
    r = mesh("submit", str(path), "--model", "nosuch")
    assert r.exit_code == 1 and "not a known model" in r.stderr and len(r.stderr.splitlines()) == 1
    assert mesh("submit", str(path), "--model", "resnet18", "--wait").exit_code == 0
    held = mesh("submit", str(path), "--hold").stdout.split()[-1]
    assert mesh("cancel", held).exit_code == 0
    poll(lambda: served.records[held].state == "CANCELLED", what="cancelled")
    r = mesh("release", held)
    assert r.exit_code == 1 and "CANCELLED" in r.stderr, r.output
    r = mesh("submit", str(path), "--wait", "--", "segv")
    assert r.exit_code == 128 + 11, r.output


TRAPS = """#!/bin/bash
trap 'echo usr1 >> "$1"' USR1
trap 'echo term >> "$1"; exit 0' TERM
for i in $(seq 600); do sleep 0.1; done
"""


def test_signal_reaches_the_ranks_before_the_time_limit(served, mesh, tmp_path):
    """Fails before: no --signal (issue 22 point 7). `--time 0:05 --signal USR1@3`: the job's trap of USR1 writes
    before anything stops it (the time limit's stop, a SIGTERM to a job not on the SDK, would end it at once)."""
    path, got = tmp_path / "traps.sh", tmp_path / "got"
    path.write_text(TRAPS)
    path.chmod(0o755)
    r = mesh("submit", str(path), "--time", "0:05", "--signal", "USR1@3", "--", str(got))
    assert r.exit_code == 0, r.stderr
    job = r.stdout.split()[-1]
    assert served.records[job].signal == "SIGUSR1@3"
    poll(lambda: got.exists() and "usr1" in got.read_text(), timeout=30, what="USR1 trapped")
    assert mesh("cancel", job).exit_code == 0  # (had the limit stopped it first, its TERM trap would have exited)
    poll(lambda: served.records[job].state in ("CANCELLED", "TIMEOUT"), timeout=30, what="ended")
    lines = got.read_text().split()
    assert lines[0] == "usr1" and lines.count("usr1") == 1, lines  # once, before the stop
    assert '"signal":"SIGUSR1@3"' in mesh("show", job, "--json").stdout.replace(" ", "")


def test_signal_in_the_request_and_the_journal():
    """An old journal's record (no `signal`) loads as none; a request's signal is kept canonical, a bad one is one
    line (400); the engine's spec gets the number and the seconds."""
    import json

    from meshsched.daemon.control import ControlRequest
    from meshsched.daemon.journal import JobRecord
    from meshsched.daemon.mirror import job_spec
    from meshsched.wire.protocol import RequestError

    old = {"job_id": "1", "seq": 1, "gpus": 1, "model": "custom", "batch_size": 32, "iterations": 10,
           "submit_time": 0.0, "name": "n", "user": "u", "deadline": None, "guaranteed": False, "command": ["x"],
           "cwd": "/", "env": {}, "job_dir": "/j"}
    rec = JobRecord.from_json(json.dumps(old))
    assert rec.signal == "" and job_spec(rec).signal == 0
    ctl, rest = ControlRequest.split({"command": ["x"], "signal": "b:usr1"})
    assert ctl.signal == "B:SIGUSR1@60" and "signal" not in rest
    rec.signal, rec.time_limit = ctl.signal, 30.0
    assert (job_spec(rec).signal, job_spec(rec).signal_time) == (10, 60.0)
    with pytest.raises(RequestError, match="signal"):
        ControlRequest.split({"command": ["x"], "signal": "NOPE"})
