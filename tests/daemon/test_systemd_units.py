"""The systemd units pass `systemd-analyze verify` (where it exists), binaries aside."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "systemd"
ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("unit,name", [("meshd.service", "meshd.service"), ("nvidia-mps@.service", "nvidia-mps@0.service")])
def test_unit_verifies(tmp_path: Path, unit: str, name: str) -> None:
    # meshd and nvidia-cuda-mps-control are not installed here: point Exec lines at /bin/true so
    # everything else in the unit (sections, keys, values) is what gets checked.
    text = (UNITS / unit).read_text()
    text = re.sub(r"^(Exec\w+=)[-@!+:]*/\S+", r"\1/bin/true", text, flags=re.M)
    (tmp_path / name).write_text(text)
    out = subprocess.run([ANALYZE, "verify", str(tmp_path / name)], capture_output=True, text=True)
    problems = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    assert out.returncode == 0 and problems == [], problems


def test_meshd_unit_is_notify_with_watchdog_and_keeps_jobs_on_restart() -> None:
    text = (UNITS / "meshd.service").read_text()
    for line in ("Type=notify", "WatchdogSec=", "KillMode=process", "RuntimeDirectory=meshsched", "StateDirectory=meshsched"):
        assert line in text
