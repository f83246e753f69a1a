"""scripts/install-system: a system-wide install that another local user can use (issue 23, point 2).

The slow tests install this checkout once per session into a temporary prefix (`--without-torch`: meshd needs no
torch; packages come through this machine's pip configuration, as .ci/run's do), run the script a second time
(nothing changes, and it says so), then start meshd from that install as root with `--submit-users` and have a
throwaway local user run `mesh submit --wait` of a script that exits 3: mesh exits 3. The fast ones check the
unit's paths against the script's defaults and that an unreachable prefix is refused in one line.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.daemon import kill_sessions, poll, remove, short_dir

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install-system"
NETWORK = ("No matching distribution found", "Failed to establish a new connection",
           "Temporary failure in name resolution", "Could not fetch URL")


def run_script(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    # the environment of a root shell, not of this test's venv
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd="/", check=False)


@pytest.fixture(scope="session")
def installed():
    """(base, prefix, bin dir, the first run's output): one install per session, removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="isys", dir="/tmp"))
    os.chmod(base, 0o755)  # every user must reach the install (pytest's tmp_path lies under a 0700 directory)
    args = ("--prefix", str(base / "opt"), "--bin-dir", str(base / "bin"), "--no-systemd", "--without-torch")
    start = time.monotonic()
    first = run_script(*args)
    took = time.monotonic() - start
    try:
        if first.returncode != 0 and any(m in first.stdout + first.stderr for m in NETWORK):
            pytest.skip(f"install-system could not reach the package index: {first.stderr.strip().splitlines()[-1]}")
        assert first.returncode == 0, first.stdout + first.stderr
        print(f"\ninstall-system into an empty prefix took {took:.0f} s")
        yield base, base / "opt", base / "bin", args, first.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and link under root (bytecode caches aside) with its size and mtime."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.slow
def test_a_second_run_changes_nothing_and_says_so(installed):
    base, prefix, bin_dir, args, first = installed
    assert "meshsched 0.1.0 in" in first and f"linked {bin_dir}/meshd -> {prefix}/bin/meshd" in first
    for name in ("mesh", "meshd"):
        assert os.readlink(bin_dir / name) == str(prefix / "bin" / name)
    assert (prefix / "share/doc/meshsched/daemon.md").read_text() == (REPO / "docs/daemon.md").read_text()
    before = tree(base)
    again = run_script(*args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.splitlines()[-1] == f"install-system: nothing to change: meshsched 0.1.0 in {prefix} is up to date"
    assert "installed" not in again.stdout and "linked" not in again.stdout
    assert tree(base) == before


@pytest.fixture
def local_user():
    if os.geteuid() != 0:
        pytest.skip("needs root: creates a throwaway user with useradd and runs meshd as root (CI runs as root)")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is missing: cannot create a second local user")
    name = f"i{os.getpid() % 100000}u"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)


@pytest.mark.slow
def test_another_user_submits_to_a_meshd_from_the_install(installed, local_user):
    from meshsched.cli.client import Client, DaemonUnavailable

    base, _, bin_dir, _, _ = installed
    user = local_user
    state, runtime = base / "state", short_dir()
    home = base / user.pw_name
    home.mkdir()
    os.chown(home, user.pw_uid, user.pw_gid)
    job = home / "fails.sh"
    job.write_text("#!/bin/sh\nid -u > ran-as\nexit 3\n")
    job.chmod(0o755)
    os.chown(job, user.pw_uid, user.pw_gid)

    clean = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # nothing of this test's venv
    meshd = subprocess.Popen([str(bin_dir / "meshd"), "--state-dir", str(state), "--runtime-dir", str(runtime),
                              "--fake-gpus", "2", "--submit-users", user.pw_name, "--kill-grace", "1"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean,
                             cwd="/")
    client = Client(runtime / "api.sock")

    def up() -> bool:
        try:
            return client.call("GET", "/v1/health")["status"] == "running"
        except DaemonUnavailable:
            assert meshd.poll() is None, f"meshd from the install exited: {meshd.stderr.read().decode()}"
            return False

    try:
        poll(up, timeout=60, what="meshd from the install serving")
        env = dict(clean, HOME=str(home), USER=user.pw_name, MESH_API_SOCKET=str(runtime / "api.sock"))
        out = subprocess.run([str(bin_dir / "mesh"), "submit", "--wait", str(job)], capture_output=True, text=True,
                             user=user.pw_uid, group=user.pw_gid, extra_groups=[], env=env, cwd=home, timeout=120,
                             check=False)
        assert out.returncode == 3, out.stdout + out.stderr
        assert (home / "ran-as").read_text().split() == [str(user.pw_uid)]  # the job ran as its submitter
        jobs = client.call("GET", "/v1/jobs?all=1")
        assert [(j["user"], j["state"]) for j in jobs] == [(user.pw_name, "FAILED")]
    finally:
        pids = [j.get("supervisor_pid") for j in client.call("GET", "/v1/jobs?all=1")] if meshd.poll() is None else []
        meshd.send_signal(signal.SIGTERM)
        meshd.wait(20)
        kill_sessions(pids)
        remove(runtime)


def script_default(option: str) -> str:
    return re.search(rf"^{option}=(\S+)$", SCRIPT.read_text(), re.MULTILINE).group(1)


def test_the_unit_runs_the_meshd_the_script_installs() -> None:
    unit = (REPO / "systemd" / "meshd.service").read_text()
    bin_dir, prefix = script_default("BIN_DIR"), script_default("PREFIX")
    assert (bin_dir, prefix) == ("/usr/local/bin", "/opt/meshsched")
    exec_start = re.search(r"^ExecStart=(\S+)", unit, re.MULTILINE).group(1)
    assert exec_start == f"{bin_dir}/meshd"
    docs = re.search(r"^Documentation=file://(\S+)", unit, re.MULTILINE).group(1)
    assert docs == f"{prefix}/share/doc/meshsched/daemon.md"  # where the script puts docs/daemon.md


def test_a_prefix_other_users_cannot_reach_is_refused_in_one_line(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    out = run_script("--prefix", str(closed / "opt"), "--bin-dir", str(tmp_path / "bin"), "--no-systemd", timeout=60)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [f"install-system: other users cannot reach {closed}/opt: {closed} is mode 700 "
                                       "(choose another --prefix or chmod o+x " + f"{closed})"]
    assert not (closed / "opt").exists()
