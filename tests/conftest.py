"""Shared fixtures: where the raw measurements are (MESHSCHED_DATA), a NodeDaemon in temporary dirs, a meshd in a
thread with `mesh` in-process (served, mesh), a recording MPS control tool (fake_control).

Shared helpers that are not fixtures live in tests/support/; test modules never import each other."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `tests.support` imports whichever directory pytest is run from
    sys.path.insert(0, str(ROOT))

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # beside the repository (as in CI)
# The tests submit as from a shell with this interpreter's environment active: a job's .py script runs on the
# python3 first on the PATH the submitter exports (`mesh submit --export`), so that is this one (with meshsched)
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])


@pytest.fixture(scope="session", autouse=True)
def _job_cgroups_swept():
    """Job cgroups (daemon/confine.py) of jobs that tests killed behind meshd's back are removed at the end."""
    yield
    from tests.support.daemon import sweep_job_cgroups

    sweep_job_cgroups()


@pytest.fixture(scope="session")
def raw_data() -> Path:
    """The folder whose throughputs/ holds Gavel's and Pollux's raw measurements.

    $MESHSCHED_DATA when set (a wrong path fails), else ../shared/data beside the repository; when neither
    is there the test is skipped with a reason that says how to give the data (pytest -rs prints it)."""
    given = os.environ.get("MESHSCHED_DATA")
    path = Path(given).expanduser() if given else DEFAULT_DATA
    if (path / "throughputs").is_dir():
        return path
    if given:
        pytest.fail(f"MESHSCHED_DATA={given} has no throughputs/ folder", pytrace=False)
    pytest.skip(f"raw measurements not found at {DEFAULT_DATA}: set MESHSCHED_DATA to a folder whose "
                "throughputs/ holds Gavel's and Pollux's measurements (sources: profiles/README.md)")


@pytest.fixture
def dirs(tmp_path):
    """A state dir and a short runtime dir (Unix socket paths must stay < 100 characters)."""
    from tests.support.daemon import remove, short_dir

    runtime = short_dir()
    yield tmp_path / "state", runtime
    remove(runtime)


@pytest.fixture
async def daemon(dirs):
    """A started NodeDaemon with 4 fake GPUs; its jobs' sessions are killed after the test."""
    from meshsched.daemon.node import NodeDaemon

    from tests.support.daemon import close_daemon, make_config

    d = NodeDaemon(make_config(*dirs))
    await d.start()
    yield d
    await close_daemon(d)


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    """A recording `nvidia-cuda-mps-control` first on PATH; returns a function that lists what it was told."""
    from tests.support.fakes import FAKE_MPS_CONTROL

    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "mps.log"
    tool = bindir / "nvidia-cuda-mps-control"
    tool.write_text(FAKE_MPS_CONTROL.format(py=sys.executable, log=str(log)))
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")

    def calls() -> list[dict]:
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    return calls


@pytest.fixture
def served_on_loop(tmp_path, monkeypatch):
    """(meshd, its event loop): a meshd (fake GPUs) in a background thread, `mesh` pointed at it by
    MESH_API_SOCKET; the loop for calls that must run on it."""
    from tests.support.daemon import daemon_in_thread, make_config, remove, short_dir

    runtime = short_dir()
    cfg = make_config(tmp_path / "state", runtime)
    monkeypatch.setenv("MESH_API_SOCKET", str(cfg.api_socket))
    with daemon_in_thread(cfg) as (d, loop):
        yield d, loop
    remove(runtime)


@pytest.fixture
def served(served_on_loop):
    """A meshd (fake GPUs) in a background thread, `mesh` pointed at it by MESH_API_SOCKET."""
    return served_on_loop[0]


class Result:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.exit_code, self.stdout, self.stderr = code, out, err
        self.output = out + err


@pytest.fixture
def mesh(capsys):
    """Run `mesh ARGS` in-process through main(), as the installed script does."""

    def run(*args: str) -> Result:
        from meshsched.cli.main import main

        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run
