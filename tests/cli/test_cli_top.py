"""`mesh top`: `q` quits the live view, the columns give way by priority at narrow widths, and `--once` into a
pipe keeps the full width (or takes `--width`)."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import pytest

from tests.support.daemon import poll

LONG_NAME = "a-job-whose-name-is-long-enough-to-push-the-table-past-eighty-columns-" + "x" * 40


def _pipe_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}


def _running_job(served, tmp_path, mesh, name: str = LONG_NAME) -> str:
    script = tmp_path / "t.py"
    script.write_text("import time\ntime.sleep(60)\n")
    job = mesh("submit", str(script), "--gpus", "2", "--name", name).stdout.split()[-1]
    poll(lambda: served.records[job].state == "RUNNING", what="job running")
    return job


def _top(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshsched.cli.main", "top", *args], env=_pipe_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False)


def test_top_once_into_a_pipe_keeps_the_full_width(served, tmp_path, mesh):
    """Fails before: rich laid the frame out in 80 columns when stdout was a pipe; the name was cut (or wrapped)."""
    job = _running_job(served, tmp_path, mesh)
    r = _top("--once")
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.split()[:1] == [job])
    assert LONG_NAME in row.split() and len(row) > 80
    header = next(line for line in r.stdout.splitlines() if line.startswith("JOBID"))
    assert header.split() == ["JOBID", "NAME", "STATE", "GPUS", "PARTNER", "BATCH", "MPS%", "GPU%", "STEP",
                              "STEPS/S", "TIME"]
    mesh("cancel", job)


def test_top_once_width_60_fits_by_dropping_and_shrinking_columns(served, tmp_path, mesh):
    """Fails before: no --width (and at 60 columns rich truncated every column alike)."""
    job = _running_job(served, tmp_path, mesh)
    r = _top("--once", "--width", "60")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and all(len(line) <= 60 for line in lines), lines
    header = next(line for line in lines if line.startswith("JOBID")).split()
    assert header[:3] == ["JOBID", "NAME", "STATE"] and "BATCH" not in header  # the lowest priority goes first
    row = next(line for line in lines if line.split()[:1] == [job]).split()
    assert row[2] == "RUNNING" and row[1] != LONG_NAME and LONG_NAME.startswith(row[1].rstrip("…"))
    mesh("cancel", job)


def test_columns_give_way_by_priority():
    """The layout as a function of the width: everything when it fits; then NAME shrinks and the lowest-priority
    columns go one by one; JOBID, NAME and STATE stay to the end, whole."""
    from meshsched.cli.top import fit_columns

    header = ("JOBID", "NAME", "STATE", "GPUS", "PARTNER", "BATCH", "MPS%", "GPU%", "STEP", "STEPS/S", "TIME")
    rows = [header, ("12", "resnet-" + "y" * 30, "RUNNING", "0,1", "13", "16x2", "50", "-", "120/500", "3.20",
                     "1:02:03")]
    full = fit_columns(rows, None)
    assert full[1].split() == list(rows[1])
    assert fit_columns(rows, 200) == full
    previous = len(header)
    for width in (100, 80, 70, 60, 50, 40, 30):
        lines = fit_columns(rows, width)
        assert all(len(line) <= width for line in lines), (width, lines)
        kept = lines[0].split()
        assert kept[:3] == ["JOBID", "NAME", "STATE"] and len(kept) <= previous
        assert lines[1].split()[0] == "12" and lines[1].split()[2] == "RUNNING"
        previous = len(kept)
    assert fit_columns(rows, 60)[0].split()[:3] == ["JOBID", "NAME", "STATE"]
    assert "TIME" in fit_columns(rows, 60)[0].split()  # TIME outlives BATCH, MPS%, STEPS/S


def test_q_quits_and_other_keys_do_not():
    """The live view's key reader (a pipe stands in for the terminal): `q` quits at once, another key does not,
    and a closed input leaves a plain timer."""
    from meshsched.cli.top import Keys

    read, write = os.pipe()
    try:
        keys = Keys(read)
        os.write(write, b"x")
        assert keys.wait(0.05) is False
        os.write(write, b"xq")
        assert keys.wait(60.0) is True  # at once: not after the interval
        os.close(write)
        write = -1
        assert keys.wait(0.05) is False and keys.fd is None  # end of input: no keys any more
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)
    assert Keys(None).wait(0.01) is False  # stdin not a terminal: nothing to read


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="no pseudo-terminals on this platform")
def test_q_quits_the_live_view_on_a_terminal(served, tmp_path, mesh):
    """Fails before: `q` did nothing; only Ctrl-C left the live view."""
    import fcntl
    import struct
    import termios

    job = _running_job(served, tmp_path, mesh, name="short")
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 60, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "meshsched.cli.main", "top", "--interval", "0.2"],
                            stdin=slave, stdout=slave, stderr=slave, env=_pipe_env(), start_new_session=True)
    os.close(slave)
    seen = bytearray()

    def drain(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    seen.extend(os.read(master, 65536))
                except OSError:  # the terminal's other side closed
                    return

    try:
        poll(lambda: (drain(0.1), b"JOBID" in seen)[1] or proc.poll() is not None, timeout=60,
             what="the first frame drawn")
        assert proc.poll() is None, bytes(seen)
        os.write(master, b"q")
        poll(lambda: (drain(0.1), proc.poll() is not None)[1], timeout=60, what="mesh top quitting on q")
        assert proc.returncode == 0, bytes(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
        mesh("cancel", job)
