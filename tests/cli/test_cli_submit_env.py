"""`mesh submit` gives a job its submitter's environment (`--export`, as sbatch) and runs its script as the
submitter's shell would: an executable is executed, a #! line is honoured, a .py file without one runs on the
python3 first on the job's PATH (issue 22, points 1 and 2).

The meshd here is a real process started from an environment of its own, so what a job sees can only have come
from the submitter (`mesh` runs in-process, with the test's environment as the submitter's).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from meshsched.cli import jobs
from meshsched.cli.fast import parse
from meshsched.wire.protocol import MAX_ENV_BYTES

from tests.support.daemon import remove, short_dir, start_meshd

DUMP = f"#!{sys.executable}\nimport json, os, sys\nopen(sys.argv[1], 'w').write(json.dumps(dict(os.environ)))\n"


@pytest.fixture(scope="module")
def meshd():
    """A meshd on 2 fake GPUs whose own environment has none of the variables the tests export."""
    state, runtime = short_dir(), short_dir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FOO", "MESH_", "A", "B"))}
    proc, _ = start_meshd(state, runtime, "--fake-gpus", "2", "--kill-grace", "1", env=env)
    yield runtime / "api.sock"
    from meshsched.cli.client import Client

    jobs_left = Client(runtime / "api.sock").call("GET", "/v1/jobs?all=1")
    proc.kill()
    proc.wait(10)
    from tests.support.daemon import kill_sessions

    kill_sessions(j["supervisor_pid"] for j in jobs_left)
    remove(state, runtime)


@pytest.fixture
def submit(meshd, mesh, monkeypatch, tmp_path):
    """`mesh submit --wait ARGS` against the module's meshd from tmp_path; (job id, its view, its rank 0 log)."""
    monkeypatch.setenv("MESH_API_SOCKET", str(meshd))
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> tuple[str, dict, str]:
        r = mesh("submit", "--wait", *args)
        assert r.stdout.startswith("Submitted job"), r.output
        job = r.stdout.split()[2]
        view = json.loads(mesh("show", job, "--json").stdout)
        return job, view, mesh("logs", job).stdout

    return run


def script(path: Path, text: str, executable: bool) -> Path:
    path.write_text(text)
    path.chmod(0o755 if executable else 0o644)
    return path


def test_the_job_gets_the_submitters_variables(submit, tmp_path, monkeypatch):
    """Fails before: `FOO=bar mesh submit task.sh` printed foo=unset (the job had meshd's environment)."""
    monkeypatch.setenv("FOO", "bar")
    task = script(tmp_path / "task.sh", '#!/bin/sh\necho "foo=${FOO:-unset}"\n', executable=True)
    _, view, log = submit(str(task))
    assert log.strip() == "foo=bar" and view["state"] == "COMPLETED"
    assert view["export"] == "ALL"


def test_export_none_and_a_list(submit, tmp_path, monkeypatch):
    """Fails before: there was no --export. NONE: a minimal PATH/HOME/USER/LANG and meshd's variables only; a list:
    those variables (this shell's value, or the one given) over the same minimal environment."""
    monkeypatch.setenv("FOO", "kept-out")
    monkeypatch.setenv("A", "from-shell")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # meshd's to set, whatever the submitter has
    dump = script(tmp_path / "dump", DUMP, executable=True)
    _, view, _ = submit("--export=NONE", str(dump), "--", str(tmp_path / "none.json"))
    none = json.loads((tmp_path / "none.json").read_text())
    assert view["export"] == "NONE" and "FOO" not in none and "A" not in none
    assert none["PATH"] == jobs.JOB_PATH and none["HOME"] and none["USER"] and none["LANG"]
    assert none["CUDA_VISIBLE_DEVICES"] == "0" and none["RANK"] == "0" and none["MESH_JOB_ID"]
    _, view, _ = submit("--export", "A,B=2,NOT_SET_ANYWHERE", str(dump), "--", str(tmp_path / "list.json"))
    listed = json.loads((tmp_path / "list.json").read_text())
    assert (listed["A"], listed["B"]) == ("from-shell", "2") and "FOO" not in listed
    assert "NOT_SET_ANYWHERE" not in listed and listed["PATH"] == jobs.JOB_PATH
    assert view["export"] == "A,B,NOT_SET_ANYWHERE"


def test_a_scripts_shebang_is_honoured_without_the_execute_bit(submit, tmp_path):
    """Fails before: a non-executable #!/bin/bash script was run by Python (SyntaxError)."""
    task = script(tmp_path / "task.sh", '#!/bin/bash\n[[ -n "$BASH_VERSION" ]] && echo "bash ok"\n', executable=False)
    _, view, log = submit(str(task))
    assert view["state"] == "COMPLETED" and log.strip() == "bash ok"
    assert view["command"] == ["/bin/bash", str(task)]


def test_a_py_script_runs_on_the_python3_of_the_exported_path(submit, tmp_path, monkeypatch):
    """Fails before: a .py script ran on the `mesh` CLI's own interpreter (sys.executable), not the python3 the
    submitter's PATH names."""
    bindir = tmp_path / "venv-bin"
    bindir.mkdir()
    mark = tmp_path / "wrapper-ran"
    script(bindir / "python3", f'#!/bin/sh\necho "$0" > {mark}\nexec {sys.executable} "$@"\n', executable=True)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    which = script(tmp_path / "which.py", "import sys\nprint('argv', sys.argv[0])\n", executable=False)
    _, view, log = submit(str(which))
    assert view["state"] == "COMPLETED" and log.strip() == f"argv {which}"
    assert view["command"] == [str(bindir / "python3"), str(which)]
    assert mark.read_text().strip() == str(bindir / "python3")


def test_how_a_script_is_run(tmp_path, monkeypatch):
    """build_command as a shell: executable -> executed; #! -> its interpreter (and its one argument); .py -> the
    python3 on the job's PATH, a clear line when there is none; anything else is refused in one line."""
    exe = script(tmp_path / "run", "#!/usr/bin/env python3\n", executable=True)
    assert jobs.build_command(str(exe), ["x"]) == [str(exe), "x"]
    env_py = script(tmp_path / "t.py", "#!/usr/bin/env  python3 \nprint(1)\n", executable=False)
    assert jobs.build_command(str(env_py), []) == ["/usr/bin/env", "python3", str(env_py)]
    opt = script(tmp_path / "o.sh", "#! /bin/bash -eu\n", executable=False)
    assert jobs.build_command(str(opt), ["1"]) == ["/bin/bash", "-eu", str(opt), "1"]
    plain = script(tmp_path / "p.py", "print(1)\n", executable=False)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script(bindir / "python3", "#!/bin/sh\n", executable=True)
    assert jobs.build_command(str(plain), [], str(bindir)) == [str(bindir / "python3"), str(plain)]
    nosh = script(tmp_path / "n.sh", "echo hi\n", executable=True)
    assert jobs.build_command(str(nosh), []) == ["/bin/sh", str(nosh)]
    for path, where, says in ((plain, str(tmp_path / "empty"), "no python3 on the job's PATH"),
                              (script(tmp_path / "data.txt", "x\n", False), jobs.JOB_PATH, "not executable")):
        with pytest.raises(SystemExit):
            jobs.build_command(str(path), [], where)


def test_export_parsing_and_the_size_limit(served, mesh, tmp_path, monkeypatch, capsys):
    """--export as sbatch takes it; an environment over meshd's limit is refused in one line, nothing sent."""
    env = {"A": "1", "B": "2", "PATH": "/p"}
    assert jobs.parse_export("ALL", env) == (env, "ALL")
    assert jobs.parse_export("ALL,B=3,C=4", env) == ({**env, "B": "3", "C": "4"}, "ALL")
    assert jobs.parse_export("NONE", env) == ({}, "NONE")
    assert jobs.parse_export("A,C=x=y", env) == ({"A": "1", "C": "x=y"}, "A,C")
    for bad in ("", "A,,B", "A,NONE", "=1"):
        with pytest.raises(SystemExit):
            jobs.parse_export(bad, env)
    assert jobs.ENV_LIMIT == MAX_ENV_BYTES
    assert parse(["submit", "t.py", "--export=NONE"])[1]["export"] == "NONE"
    assert parse(["submit", "t.py", "--export", "A,B=2"])[1]["export"] == "A,B=2"
    capsys.readouterr()
    task = script(tmp_path / "task.sh", "#!/bin/sh\n", executable=True)
    monkeypatch.setenv("HUGE", "x" * MAX_ENV_BYTES)
    r = mesh("submit", str(task))
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1 and "--export=NONE" in r.stderr
    assert not served.records  # nothing sent
    ok = mesh("submit", "--export=NONE", str(task))
    assert ok.exit_code == 0, ok.output
