"""Shared fixtures: where the raw measurements are (MESHSCHED_DATA), and a NodeDaemon in temporary dirs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"  # beside the repository (as in CI)


@pytest.fixture(scope="session", autouse=True)
def _job_cgroups_swept():
    """Job cgroups (daemon/confine.py) of jobs that tests killed behind meshd's back are removed at the end."""
    yield
    from tests.test_daemon_helpers import sweep_job_cgroups

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
    from tests.test_daemon_helpers import remove, short_dir

    runtime = short_dir()
    yield tmp_path / "state", runtime
    remove(runtime)


@pytest.fixture
async def daemon(dirs):
    """A started NodeDaemon with 4 fake GPUs; its jobs' sessions are killed after the test."""
    from meshsched.daemon.node import NodeDaemon
    from tests.test_daemon_helpers import close_daemon, make_config

    d = NodeDaemon(make_config(*dirs))
    await d.start()
    yield d
    await close_daemon(d)
