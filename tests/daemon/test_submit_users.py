"""Multi-user mode is visible (issue 23, point 3): `meshd --submit-users a,b` beside the TOML key and MESHD_SUBMIT_USERS,
the key shown in examples/meshd.toml, one start-up line saying who may submit and who operates, and a name that is
no local user (or group) refused at start with one line and exit code 2."""

from __future__ import annotations

import os
import pwd
import re
import signal
import subprocess
import tomllib
from pathlib import Path

import pytest
from meshsched.daemon.config import ConfigError, load_config
from meshsched.daemon.main import parse_args

from tests.support.daemon import PY, poll, remove, short_dir

ROOT = Path(__file__).resolve().parents[2]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="submit_users needs meshd to run as root")


def two_local_users() -> list[str]:
    """Two users this machine has besides root (system accounts will do: nothing runs as them)."""
    names = [p.pw_name for p in pwd.getpwall() if 0 < p.pw_uid < 65534]
    if len(names) < 2:
        pytest.skip("needs two local users besides root")
    return names[:2]


def meshd(tmp_path: Path, runtime: Path, *flags: str, env: dict | None = None) -> list[str]:
    return [PY, "-m", "meshsched.daemon.main", "--state-dir", str(tmp_path / "state"), "--runtime-dir", str(runtime),
            "--fake-gpus", "1", *flags]


def test_the_flag_sets_submit_users():
    assert parse_args(["--submit-users", "ann,bob"]).submit_users == "ann,bob"


@needs_root
def test_flag_environment_and_file_say_the_same(tmp_path):
    a, b = two_local_users()
    toml = tmp_path / "meshd.toml"
    toml.write_text(f'[meshd]\nsubmit_users = "{a}"\n')
    base = {"state_dir": str(tmp_path / "s"), "runtime_dir": str(tmp_path / "r")}
    assert load_config(toml, env={}, overrides=base).submit_users == a
    assert load_config(toml, env={"MESHD_SUBMIT_USERS": b}, overrides=base).submit_users == b
    flag = vars(parse_args(["--submit-users", f"{a},{b}"]))
    assert load_config(toml, env={"MESHD_SUBMIT_USERS": b}, overrides={**base, **flag}).submit_users == f"{a},{b}"


def test_the_example_config_shows_the_key():
    text = (ROOT / "examples" / "meshd.toml").read_text()
    line = next((x for x in text.splitlines() if re.match(r"#?\s*submit_users\s*=", x)), None)
    assert line is not None, "examples/meshd.toml does not show submit_users"
    value = tomllib.loads(line.lstrip("# "))["submit_users"]  # the example's value parses
    assert isinstance(value, str) and value


@pytest.mark.parametrize("given,unknown", [("nosuchuser", "nosuchuser"), ("root,nosuchuser", "nosuchuser"),
                                           ("@nosuchgroup", "@nosuchgroup")])
def test_an_unknown_user_is_refused_by_the_configuration(tmp_path, given, unknown):
    base = {"state_dir": str(tmp_path / "s"), "runtime_dir": str(tmp_path / "r"), "submit_users": given}
    with pytest.raises(ConfigError, match=f"submit_users: {re.escape(unknown)} is no local "):
        load_config(env={}, overrides=base)


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_meshd_refuses_an_unknown_user_at_start_with_one_line(tmp_path, how):
    runtime = short_dir()
    flags = ("--submit-users", "nosuchuser") if how == "flag" else ()
    env = dict(os.environ, MESHD_SUBMIT_USERS="nosuchuser") if how == "environment" else None
    try:
        p = subprocess.run(meshd(tmp_path, runtime, *flags), capture_output=True, text=True, env=env, timeout=120,
                           check=False)
    finally:
        remove(runtime)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("meshd: error: submit_users: nosuchuser is no local user"), p.stderr


def test_the_start_up_line_says_who_may_submit(tmp_path):
    from dataclasses import replace

    from meshsched.daemon.main import multi_user_line

    from tests.support.daemon import make_config

    cfg = make_config(tmp_path / "s", tmp_path / "r")
    assert multi_user_line(cfg) is None  # one user: nothing to say
    me = pwd.getpwuid(os.geteuid()).pw_name
    line = multi_user_line(replace(cfg, submit_users="ann, bob"))
    operators = "root" if me == "root" else f"root, {me}"
    assert line == f"multi-user: ann, bob may submit; operators: {operators}"
    assert multi_user_line(replace(cfg, submit_users="*")).startswith("multi-user: every local user may submit;")
    tcp = multi_user_line(replace(cfg, submit_users="@gpu", http_tcp="127.0.0.1:8470", token="x"))
    assert tcp.startswith("multi-user: members of group gpu may submit; operators: ") and "TCP token" in tcp


@needs_root
def test_meshd_logs_who_may_submit_when_it_starts(tmp_path):
    from meshsched.cli.client import Client, DaemonUnavailable

    a, b = two_local_users()
    runtime = short_dir()
    proc = subprocess.Popen(meshd(tmp_path, runtime, "--submit-users", f"{a},{b}"), stdin=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)

    def up() -> bool:
        try:
            return Client(runtime / "api.sock").call("GET", "/v1/health")["status"] == "running"
        except DaemonUnavailable:
            assert proc.poll() is None, f"meshd exited: {proc.stderr.read()}"
            return False

    try:
        poll(up, what="meshd serving")
    finally:
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=30)[1]
        remove(runtime, tmp_path / "state")
    lines = [x for x in err.splitlines() if "multi-user" in x]
    assert lines == [f"meshd: multi-user: {a}, {b} may submit; operators: root"], err
