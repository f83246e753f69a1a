"""`mesh simulate --events FILE` (issue 23, "Drain and resume": replay a maintenance window on a trace): the
jobs a drain delays and the mean JCT without it, and a bad events file as one line naming its line."""

from __future__ import annotations

import json

from meshsched.cli.main import app
from typer.testing import CliRunner

# the golden setup (tests/golden/philly200.json): first 200 Philly jobs, 1 x 8 V100; node 0 drained for 2 h
# from 241 h, when jobs wait for it under SRTF
WINDOW = "time,node,action,reason\n241h,0,drain,driver update\n243h,node0,resume,\n"


def _mesh(*args: str):
    return CliRunner().invoke(app, list(args))


def test_simulate_with_a_drain_window_counts_the_jobs_it_delays(tmp_path):
    events = tmp_path / "window.csv"
    events.write_text(WINDOW)
    args = ("simulate", "--jobs", "200", "--nodes", "1", "--policy", "srtf", "--json")
    with_events = _mesh(*args, "--events", str(events))
    assert with_events.exit_code == 0, (with_events.stdout, with_events.stderr)
    plain = json.loads(_mesh(*args).stdout)
    got = json.loads(with_events.stdout)
    assert got["events"] == {"file": str(events), "count": 2}
    (row,), (base,) = got["policies"], plain["policies"]
    assert "delayed_by_events" not in base  # without --events the output is as it was
    assert row["jct_mean_h_without_events"] == base["jct_mean_h"]
    assert row["delayed_by_events"] > 0
    assert row["jct_mean_h"] > base["jct_mean_h"]
    assert row["completed"] == base["completed"]


def test_simulate_table_names_the_events(tmp_path):
    events = tmp_path / "window.csv"
    events.write_text(WINDOW)
    r = _mesh("simulate", "--jobs", "60", "--nodes", "1", "--policy", "fifo", "--events", str(events))
    assert r.exit_code == 0, (r.stdout, r.stderr)
    assert f"events: 2 from {events}" in r.stdout
    assert "fifo: " in r.stdout and "job(s) delayed; mean JCT" in r.stdout


def test_a_bad_events_file_is_one_line_with_its_line_number(tmp_path):
    events = tmp_path / "bad.csv"
    events.write_text("time,node,action\n1h,0,drain\n2h,7,resume\n")
    r = _mesh("simulate", "--jobs", "20", "--nodes", "2", "--policy", "fifo", "--events", str(events))
    assert r.exit_code == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith(f"mesh: error: {events}:3: node '7'"), lines[0]
    missing = _mesh("simulate", "--jobs", "20", "--policy", "fifo", "--events", str(tmp_path / "none.csv"))
    assert missing.exit_code == 2 and missing.stderr.splitlines() == [f"mesh: error: {tmp_path / 'none.csv'}: no such events file"]
