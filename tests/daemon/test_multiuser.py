"""Two local users submit to one root-run meshd (`submit_users`): each job runs under its submitter's uid, neither
user can cancel, read or wait on the other's job (403, one line), and job directories are the submitter's (0700).

Runs as root (CI does): it creates two throwaway users with `useradd` and removes them afterwards. A user's
requests are made by this test process with its effective uid switched to that user around the connect, so
SO_PEERCRED names them (meshd runs in its own process). Not root (a developer's machine): skipped, saying so.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from meshsched.cli.client import ApiError, Client

from tests.support.daemon import kill_sessions, poll, remove, short_dir, start_meshd

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: runs meshd as root and creates two "
                                "throwaway users with useradd (CI runs as root)")


@contextlib.contextmanager
def as_user(uid: int, gid: int):
    """Act as `uid` (effective ids) inside the block; this process is single-threaded while it does."""
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.fixture
def two_users():
    tag = f"m{os.getpid() % 100000}"
    names = [f"{tag}a", f"{tag}b"]
    for name in names:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True,
                       capture_output=True)
    try:
        yield [pwd.getpwnam(n) for n in names]
    finally:
        for name in names:
            subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.fixture
def shared_meshd(two_users):
    base = Path(tempfile.mkdtemp(prefix="mu", dir="/tmp"))
    os.chmod(base, 0o755)  # meshd's state lives here; each user's jobs run in base/<user>, theirs
    for u in two_users:
        (base / u.pw_name).mkdir()
        os.chown(base / u.pw_name, u.pw_uid, u.pw_gid)
    runtime = short_dir()
    env = dict(os.environ, MESHD_SUBMIT_USERS=",".join(u.pw_name for u in two_users))
    proc, client = start_meshd(base / "state", runtime, "--fake-gpus", "4", "--kill-grace", "1", env=env)
    try:
        yield base, runtime / "api.sock", client
    finally:
        pids = [j["supervisor_pid"] for j in client.call("GET", "/v1/jobs?all=1")]
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        kill_sessions(pids)
        remove(base, runtime)


def call(user, sock: Path, method: str, url: str, body=None):
    with as_user(user.pw_uid, user.pw_gid):
        return Client(sock).call(method, url, body)


def refused(user, sock: Path, method: str, url: str) -> str:
    with pytest.raises(ApiError) as exc:
        call(user, sock, method, url)
    assert exc.value.status == 403
    return str(exc.value)


def test_two_users_jobs_run_as_themselves_and_stay_private(two_users, shared_meshd):
    base, sock, root = shared_meshd
    ann, bob = two_users
    body = {"command": ["/bin/sh", "-c", "id -u; id -g; touch mine; sleep 60"], "cwd": str(base / ann.pw_name)}
    a = call(ann, sock, "POST", "/v1/jobs", body)
    b = call(bob, sock, "POST", "/v1/jobs", {"command": ["/bin/sh", "-c", "id -u; sleep 60"],
                                             "cwd": str(base / bob.pw_name)})
    assert (a["user"], b["user"]) == (ann.pw_name, bob.pw_name)

    def log(user, job) -> str:
        with as_user(user.pw_uid, user.pw_gid):
            return Client(sock).raw("GET", f"/v1/jobs/{job['job_id']}/logs")[2].decode()

    poll(lambda: log(ann, a).split()[:2] == [str(ann.pw_uid), str(ann.pw_gid)], what="ann's job runs as ann")
    poll(lambda: log(bob, b).split()[:1] == [str(bob.pw_uid)], what="bob's job runs as bob")
    poll(lambda: (base / ann.pw_name / "mine").exists(), what="ann's job wrote a file")
    assert (base / ann.pw_name / "mine").stat().st_uid == ann.pw_uid  # the files it writes are hers

    job_dir = Path(a["job_dir"])
    st = job_dir.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (ann.pw_uid, 0o700)
    for name in ("logs", "checkpoints"):
        assert (job_dir / name).stat().st_uid == ann.pw_uid
    with as_user(bob.pw_uid, bob.pw_gid):
        with pytest.raises(PermissionError):
            os.listdir(job_dir)
        with pytest.raises(PermissionError):
            (job_dir / "logs" / "rank0.log").read_bytes()

    # bob sees the queue, but can neither act on ann's job nor read it
    with as_user(bob.pw_uid, bob.pw_gid):  # `mesh ls`: meshd's table
        table = Client(sock).raw("GET", "/v1/jobs?format=table")[2].decode().splitlines()
    assert {row.split()[0]: row.split()[2] for row in table[1:]} == {a["job_id"]: ann.pw_name, b["job_id"]: bob.pw_name}
    assert "command" in root.call("GET", "/v1/jobs")[0]  # an operator's listing, cached: not what bob is served
    full = {j["job_id"]: j for j in call(bob, sock, "GET", "/v1/jobs")}  # `mesh ls --json`
    assert "command" not in full[a["job_id"]] and "job_dir" not in full[a["job_id"]]
    assert full[b["job_id"]]["command"][0] == "/bin/sh" and full[a["job_id"]]["state"] == "RUNNING"
    for method, route in (("POST", "cancel"), ("GET", "logs"), ("GET", ""), ("POST", "hold"), ("POST", "requeue"),
                          ("GET", "wait?timeout=0"), ("GET", "explain")):
        url = f"/v1/jobs/{a['job_id']}/{route}".rstrip("/")
        msg = refused(bob, sock, method, url)
        assert msg == f"job {a['job_id']} belongs to {ann.pw_name}; only its owner or an operator may act on it or read it"
    assert root.call("GET", f"/v1/jobs/{a['job_id']}")["state"] == "RUNNING"  # still running

    # many jobs per call: bob's filters select among his own jobs only; naming hers is refused
    with as_user(bob.pw_uid, bob.pw_gid), pytest.raises(ApiError) as exc:  # not "no job matched": not his to cancel
        Client(sock).call("POST", "/v1/jobs/cancel", {"user": ann.pw_name})
    assert exc.value.status == 404 and "not yours to cancel" in str(exc.value)
    with as_user(bob.pw_uid, bob.pw_gid), pytest.raises(ApiError) as exc:
        Client(sock).call("POST", "/v1/jobs/cancel", {"job_ids": [a["job_id"]], "signal": "USR1"})
    assert exc.value.status == 403

    # a user not in submit_users may not use this meshd at all
    nobody = pwd.getpwnam("nobody")
    assert "may not use this meshd" in refused(nobody, sock, "GET", "/v1/jobs")

    # each may cancel their own; root (an operator) anyone's
    call(ann, sock, "POST", f"/v1/jobs/{a['job_id']}/cancel")
    root.call("POST", f"/v1/jobs/{b['job_id']}/cancel")
    poll(lambda: [root.call("GET", f"/v1/jobs/{j['job_id']}")["state"] for j in (a, b)] == ["CANCELLED"] * 2,
         what="both cancelled")


def test_a_users_array_runs_as_them_with_their_output_file(two_users, shared_meshd):
    base, sock, root = shared_meshd
    ann, _ = two_users
    body = {"command": ["/bin/sh", "-c", "echo $MESH_ARRAY_TASK_ID $(id -u) $USER"], "cwd": str(base / ann.pw_name),
            "array": "0-2", "output": "out-%A_%a.txt"}
    answer = call(ann, sock, "POST", "/v1/jobs", body)
    array = answer["array_id"]
    poll(lambda: call(ann, sock, "GET", f"/v1/jobs/{array}/wait?timeout=5")["done"], what="array done")
    for t in range(3):
        out = base / ann.pw_name / f"out-{array}_{t}.txt"
        assert out.read_text().split() == [str(t), str(ann.pw_uid), ann.pw_name]
        assert out.stat().st_uid == ann.pw_uid  # created by her, not by root


def test_an_output_file_is_opened_as_the_user_never_as_root(two_users, shared_meshd):
    """A user may not make meshd (root) write where they cannot: the file is opened with their rights."""
    base, sock, root = shared_meshd
    ann, _ = two_users
    protected = base / "root-only"
    protected.mkdir(mode=0o700)
    body = {"command": ["/bin/true"], "cwd": str(base / ann.pw_name), "output": str(protected / "x.txt")}
    job = call(ann, sock, "POST", "/v1/jobs", body)
    poll(lambda: root.call("GET", f"/v1/jobs/{job['job_id']}")["state"] == "FAILED", what="failed")
    assert "cannot open" in root.call("GET", f"/v1/jobs/{job['job_id']}")["reason"]
    assert not (protected / "x.txt").exists()


def test_who_may_submit_is_configuration(two_users):
    from dataclasses import replace

    from meshsched.daemon.config import DaemonConfig

    ann, bob = two_users
    base = DaemonConfig(state_dir=Path("/tmp/s"), runtime_dir=Path("/tmp/r"))
    assert not base.may_submit(ann.pw_name)
    assert replace(base, submit_users=ann.pw_name).may_submit(ann.pw_name)
    assert not replace(base, submit_users=ann.pw_name).may_submit(bob.pw_name)
    assert replace(base, submit_users="*").may_submit(bob.pw_name)
    group = f"{ann.pw_name}g"
    subprocess.run(["groupadd", group], check=True, capture_output=True)
    try:
        subprocess.run(["usermod", "-aG", group, bob.pw_name], check=True, capture_output=True)
        by_group = replace(base, submit_users=f"@{group}")
        assert by_group.may_submit(bob.pw_name) and not by_group.may_submit(ann.pw_name)
    finally:
        subprocess.run(["groupdel", group], check=False, capture_output=True)


def test_under_mps_only_one_users_jobs_share_a_gpu(two_users, tmp_path):
    """meshd with MPS and several users (castor, one fake GPU): bob's job never shares ann's GPU and its pending
    reason says why; ann's second job does share it."""
    from tests.support.fakes import FAKE_MPS_CONTROL as FAKE

    ann, bob = two_users
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "nvidia-cuda-mps-control"
    tool.write_text(FAKE.format(py=sys.executable, log=str(tmp_path / "mps.log")))
    tool.chmod(0o755)
    base = Path(tempfile.mkdtemp(prefix="mu", dir="/tmp"))
    os.chmod(base, 0o755)
    for u in two_users:
        (base / u.pw_name).mkdir()
        os.chown(base / u.pw_name, u.pw_uid, u.pw_gid)
    runtime = short_dir()
    env = dict(os.environ, MESHD_SUBMIT_USERS=f"{ann.pw_name},{bob.pw_name}", MESHD_USE_MPS="true",
               MESHD_SYSTEMD_SCOPE="no", PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    proc, root = start_meshd(base / "state", runtime, "--fake-gpus", "1", "--policy", "castor", "--kill-grace", "1",
                             env=env)
    sock = runtime / "api.sock"
    try:
        def submit(user, model: str, batch: int, iters: int) -> str:
            body = {"command": ["/bin/sh", "-c", "sleep 60"], "cwd": str(base / user.pw_name), "gpus": 1,
                    "model": model, "batch_size": batch, "iterations": iters}
            return call(user, sock, "POST", "/v1/jobs", body)["job_id"]

        a = submit(ann, "resnet18", 16, 20000)
        poll(lambda: root.call("GET", f"/v1/jobs/{a}")["state"] == "RUNNING", what="ann's job running")
        b = submit(bob, "resnet50", 128, 2000)  # one user: Castor would share A's GPU (tests/test_shared_restart)
        view = root.call("GET", f"/v1/jobs/{b}")
        assert view["state"] == "PENDING" and f"of user {ann.pw_name}" in view["reason"], view["reason"]
        assert "MPS" in view["reason"]
        c = submit(ann, "resnet50", 128, 2000)
        poll(lambda: root.call("GET", f"/v1/jobs/{c}")["state"] == "RUNNING", what="ann's second job sharing")
        assert root.call("GET", f"/v1/jobs/{c}")["partners"] == [a]
        assert root.call("GET", f"/v1/jobs/{b}")["state"] == "PENDING"
    finally:
        pids = [j["supervisor_pid"] for j in root.call("GET", "/v1/jobs?all=1")]
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        kill_sessions(pids)
        remove(base, runtime)


def test_a_failed_jobs_log_lines_reach_only_its_owner(two_users, shared_meshd):
    """Real users, real SO_PEERCRED (tests/daemon/test_privacy.py covers every view with faked ones): bob's job
    prints a secret and fails; ann's `mesh ls` table and --json show why without it, bob's and root's with it."""
    base, sock, root = shared_meshd
    ann, bob = two_users
    body = {"command": ["/bin/sh", "-c", "echo token=s3cr3t; exit 3"], "cwd": str(base / bob.pw_name)}
    job = call(bob, sock, "POST", "/v1/jobs", body)["job_id"]
    poll(lambda: root.call("GET", f"/v1/jobs/{job}")["state"] == "FAILED", what="bob's job failed")

    def seen(user) -> tuple[str, dict]:
        with as_user(user.pw_uid, user.pw_gid):
            table = Client(sock).raw("GET", "/v1/jobs?format=table")[2].decode()
            return table, {j["job_id"]: j for j in Client(sock).call("GET", "/v1/jobs")}[job]

    table, view = seen(ann)
    assert "s3cr3t" not in table and view["reason"] == "rank 0 failed (exit code 3)", (table, view)
    assert "(rank 0 failed (exit code 3))" in table
    for user in (bob, pwd.getpwuid(0)):
        table, view = seen(user)
        assert "token=s3cr3t" in table and view["reason"] == "rank 0 failed (exit code 3): token=s3cr3t", (table, view)
