"""Nothing of one user reaches another (issue 23, point 1): pbob's job prints `token=s3cr3t` and fails, and a
running one of his carries the secret in its arguments, working directory and output file; pann sees both jobs
in every view (`mesh ls`, `ls --json`, `top --json`, `nodes`, `/metrics`) without any of it, and `mesh show`
refuses her. pbob and an operator see it all.

meshd runs in this process (a thread, fake GPUs) with `submit_users = "pann,pbob"`; who asks is faked where meshd
reads it (`users.peer`, SO_PEERCRED in production) and jobs run as the test's own user (`runs.owner_of`), so
this runs anywhere. tests/daemon/test_multiuser.py does the same with two real users and a root-run meshd.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from meshsched.cli.client import Client
from meshsched.daemon import runs, users
from meshsched.daemon.users import Peer

from tests.support.daemon import daemon_in_thread, make_config, poll, remove, short_dir

SECRET = "s3cr3t"
ANN, BOB = Peer(50001, "pann"), Peer(50002, "pbob")


@pytest.fixture
def shared(tmp_path, monkeypatch):
    """(meshd, act_as): a multi-user meshd in a thread; `act_as(peer)` makes later requests come from `peer`."""
    runtime = short_dir()
    cfg = replace(make_config(tmp_path / "state", runtime), submit_users="pann,pbob")  # (validate: root only)
    monkeypatch.setenv("MESH_API_SOCKET", str(cfg.api_socket))
    asking = [Peer(None, "operator")]
    monkeypatch.setattr(users, "peer", lambda request: asking[0])
    monkeypatch.setattr(runs, "owner_of", lambda uid: None)  # jobs run as this test's user
    def act_as(peer: Peer) -> None:
        asking[0] = peer

    with daemon_in_thread(cfg) as (d, _):
        yield d, act_as
    remove(runtime)


@pytest.fixture
def bobs_jobs(shared, tmp_path):
    """pbob's failed job (its log's last line holds the secret) and his running one (secret in its arguments,
    working directory and output file): their ids."""
    d, act_as = shared
    secret_dir = tmp_path / f"bob-{SECRET}-dir"
    secret_dir.mkdir()
    act_as(BOB)
    client = Client()
    script = f"echo bob-private-line token={SECRET}; exit 1"
    failed = client.call("POST", "/v1/jobs", {"command": ["/bin/sh", "-c", script], "cwd": str(tmp_path)})
    running = client.call("POST", "/v1/jobs", {"command": ["/bin/sh", "-c", "sleep 60", f"token={SECRET}"],
                                               "cwd": str(secret_dir), "output": f"out-{SECRET}.txt"})
    poll(lambda: d.records[failed["job_id"]].state == "FAILED", what="bob's first job failed")
    poll(lambda: d.records[running["job_id"]].state == "RUNNING", what="bob's second job running")
    assert SECRET in d.records[failed["job_id"]].reason  # the supervisor put the log's tail in the reason
    return failed["job_id"], running["job_id"]


def views(mesh) -> dict[str, str]:
    """Every view a user may have of the queue, as `mesh` prints it."""
    out = {}
    for args in (("ls",), ("ls", "-a"), ("ls", "-a", "--json"), ("top", "--json"), ("nodes",), ("nodes", "--json")):
        r = mesh(*args)
        assert r.exit_code == 0, (args, r.output)
        out[" ".join(args)] = r.stdout
    out["metrics"] = Client().raw("GET", "/metrics")[2].decode()
    return out


def test_another_users_job_shows_no_log_lines_arguments_or_paths(shared, bobs_jobs, mesh):
    _, act_as = shared
    failed, running = bobs_jobs
    act_as(ANN)
    seen = views(mesh)
    for view, text in seen.items():
        assert SECRET not in text, f"pann sees pbob's secret in `{view}`:\n{text}"
    # she still sees the queue: both jobs, their owner and state, and why the failed one failed (no log lines)
    table = {line.split()[0]: line for line in seen["ls -a"].splitlines()[1:]}
    assert "pbob" in table[failed] and "FAILED" in table[failed] and "(rank 0 failed (exit code 1))" in table[failed]
    listed = {j["job_id"]: j for j in json.loads(seen["ls -a --json"])}
    assert listed[failed]["reason"] == "rank 0 failed (exit code 1)"
    assert {"command", "cwd", "job_dir", "output"} & set(listed[running]) == set()
    assert running in [j["job_id"] for j in json.loads(seen["top --json"])["jobs"]]
    for args in (("show", failed), ("show", running), ("logs", failed)):
        r = mesh(*args)
        assert r.exit_code != 0 and SECRET not in r.output and "belongs to pbob" in r.output, (args, r.output)


@pytest.mark.parametrize("who", [BOB, Peer(None, "operator")], ids=["owner", "operator"])
def test_the_owner_and_operators_see_it_all(shared, bobs_jobs, mesh, who):
    _, act_as = shared
    failed, running = bobs_jobs
    act_as(who)
    seen = views(mesh)
    assert f"bob-private-line token={SECRET}" in seen["ls -a"]
    listed = {j["job_id"]: j for j in json.loads(seen["ls -a --json"])}
    assert listed[failed]["reason"] == f"rank 0 failed (exit code 1): bob-private-line token={SECRET}"
    assert f"token={SECRET}" in listed[running]["command"] and SECRET in listed[running]["cwd"]
    top = {j["job_id"]: j for j in json.loads(seen["top --json"])["jobs"]}
    assert SECRET in top[running]["output"]
    r = mesh("show", failed)
    assert r.exit_code == 0 and f"token={SECRET}" in r.stdout


def test_listings_are_served_per_viewer_from_one_cache(shared, bobs_jobs, mesh):
    """The table and the views are cached between changes: one viewer's cached rows are never another's."""
    _, act_as = shared
    for who, sees in ((Peer(None, "operator"), True), (ANN, False), (BOB, True), (ANN, False)):
        act_as(who)
        assert (SECRET in mesh("ls", "-a").stdout) is sees, who
        assert (SECRET in mesh("ls", "-a", "--json").stdout) is sees, who


@pytest.mark.parametrize("reason,public", [
    ("rank 0 failed (exit code 1): bob-private-line token=s3cr3t | more", "rank 0 failed (exit code 1)"),
    ("rank 2 failed (signal 9): Traceback: x", "rank 2 failed (signal 9)"),
    ("rank 1 failed (exit code 3)", "rank 1 failed (exit code 3)"),
    ("exceeded its memory limit of 4 GiB (the kernel OOM-killed it): rank 0 failed (exit code 137): s3cr3t",
     "exceeded its memory limit of 4 GiB (the kernel OOM-killed it): rank 0 failed (exit code 137)"),
    ("ranks on n2 failed: rank 1 failed (exit code 1): token=s3cr3t", "ranks on n2 failed: rank 1 failed (exit code 1)"),
    ("cannot open /home/pbob/s3cr3t/out.txt: Permission denied", "cannot open <path>"),
    ("could not start on n1: [Errno 13] Permission denied: '/var/lib/meshsched/jobs/3'", "could not start on n1"),
    ("the job's supervisor exited without a result (cannot open /srv/state/journal.sqlite: Permission denied)",
     "the job's supervisor exited without a result"),
    ("refused: asks for 9 GPUs; the largest node has 8", "refused: asks for 9 GPUs; the largest node has 8"),
    ("meshd restarted and the job's processes were gone", "meshd restarted and the job's processes were gone"),
    ("TimeLimit", "TimeLimit"),
    ("", ""),
])
def test_a_reason_without_its_private_detail(reason, public):
    from meshsched.daemon.privacy import public_reason

    assert public_reason(reason) == public


def test_server_paths_are_kept_from_the_owner_too():
    """A reason naming meshd's own files shows their place to operators only; the job's own directory stays."""
    from pathlib import Path

    from meshsched.daemon.privacy import owner_reason

    server = (Path("/srv/meshsched/state"), Path("/run/meshsched"))
    why = "the job's supervisor exited without a result (cannot open /srv/meshsched/state/journal.sqlite: Permission denied)"
    assert owner_reason(why, server, "/srv/meshsched/state/jobs/7") == (
        "the job's supervisor exited without a result (cannot open <meshd's state>: Permission denied)")
    own = "cannot open /srv/meshsched/state/jobs/7/logs/rank0.log: No space left on device"
    assert owner_reason(own, server, "/srv/meshsched/state/jobs/7") == own
