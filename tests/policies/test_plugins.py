"""Policies from outside the repository: the example package examples/policy_plugin, installed for real (pip, no
network), runs in `mesh simulate` by entry point and by import path and in meshd by name; a malformed one is
refused in one line, without a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.daemon import PY, poll, remove, short_dir, start_meshd

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "policy_plugin"
BAD = '''
class NoPlace:
    """Has a placement policy's methods but `place`."""
    name = "no-place"
    periodic = False
    monotone = True

    def __init__(self, handle):
        pass

    def queue_key(self, job):
        return (job.spec.submit_time,)

    def try_start(self, view, cycle, job):
        return None

    def next_timer(self, view, now):
        return None


NOT_A_CLASS = 42
'''


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    """An environment whose PYTHONPATH holds the example package, installed with pip into a target folder (its
    entry point included), and a module of malformed policies."""
    root = tmp_path_factory.mktemp("plugin")
    source, target = root / "src", root / "site"
    shutil.copytree(EXAMPLE, source)  # pip builds in the source folder: keep the repository's clean
    subprocess.run([PY, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
                    "--target", str(target), str(source)], check=True, timeout=300)
    (target / "bad_policies.py").write_text(BAD)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}


def _mesh(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "meshsched.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def test_the_example_runs_in_mesh_simulate_by_entry_point_and_by_import_path(plugin_env):
    p = _mesh(plugin_env, "simulate", "--jobs", "40", "--nodes", "2", "--json",
              "--policy", "largest-first,largest_first_policy:LargestFirst")
    assert p.returncode == 0, p.stderr
    by_name, by_path = json.loads(p.stdout)["policies"]
    assert by_name["policy"] == "largest-first" and by_path["policy"] == "largest_first_policy:LargestFirst"
    assert by_name["completed"] == 40
    drop = {"policy", "sim_seconds"}
    assert {k: v for k, v in by_name.items() if k not in drop} == {k: v for k, v in by_path.items() if k not in drop}


@pytest.mark.parametrize(("spec", "fragment"), [
    ("bad_policies:NoPlace", "lacks place"),
    ("bad_policies:NOT_A_CLASS", "42 is not a class"),
    ("bad_policies:Missing", "has no 'Missing'"),
    ("no_such_module_xyz:Policy", "cannot import 'no_such_module_xyz'"),
])
def test_a_malformed_policy_is_refused_in_one_line(plugin_env, spec, fragment):
    p = _mesh(plugin_env, "simulate", "--jobs", "10", "--nodes", "1", "--policy", spec)
    assert p.returncode == 2 and p.stdout == "" and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("mesh: error: policy ") and p.stderr.count("\n") == 1 and fragment in p.stderr


def test_meshd_refuses_a_malformed_policy_in_one_line(plugin_env, tmp_path):
    runtime = short_dir()
    try:
        p = subprocess.run([PY, "-m", "meshsched.daemon.main", "--state-dir", str(tmp_path / "state"),
                            "--runtime-dir", str(runtime), "--fake-gpus", "1", "--policy", "bad_policies:NoPlace"],
                           capture_output=True, text=True, env=plugin_env, timeout=120, check=False)
    finally:
        remove(runtime)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.startswith("meshd: error: policy: ") and p.stderr.count("\n") == 1 and "lacks place" in p.stderr


def test_meshd_runs_the_example_by_name(plugin_env, tmp_path):
    config = tmp_path / "meshd.toml"
    config.write_text('[meshd]\npolicy = "largest-first"\n')
    runtime = short_dir()
    proc, client = start_meshd(tmp_path / "state", runtime, "--config", str(config), "--fake-gpus", "2",
                               "--kill-grace", "1", env=plugin_env)
    try:
        assert [n["policy"] for n in client.call("GET", "/v1/nodes")] == ["largest-first"]
        job = client.call("POST", "/v1/jobs", {"command": [PY, "-c", "pass"], "gpus": 2, "cwd": "/tmp",
                                               "iterations": 1, "env": {}})["job_id"]
        poll(lambda: client.call("GET", f"/v1/jobs/{job}")["state"] == "COMPLETED", timeout=60, what="job done")
    finally:
        proc.terminate()
        proc.wait(10)
        remove(runtime)
