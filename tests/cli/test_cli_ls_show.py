"""`mesh ls` as squeue and `mesh show` as scontrol (issue 22, points 4 and 6), against a meshd in a thread.

Honest progress: a job that reports no steps shows '-' (its figures are the scheduler's estimate, said so in
--json); listing filters, --format, arrays collapsed, unknown ids, TIME, widths; show's scontrol fields.
"""

from __future__ import annotations

import json
import time

from meshsched.cli.top import top_rows

from tests.support.daemon import poll

SLEEPS = "import time\ntime.sleep(60)\n"
REPORTS = """
import time
from meshsched import job
sess = job.attach(rng=False)
for _ in range(7):
    sess.end_step()
time.sleep(60)
"""


def _submit(mesh, script, *args: str) -> str:
    r = mesh("submit", str(script), *args)
    assert r.exit_code == 0, r.output
    return r.stdout.split()[-1]


def test_progress_is_measured_or_marked_as_the_schedulers_estimate(served, tmp_path, mesh, monkeypatch):
    """Fails before: a script without meshsched.job showed STEP 23/100 and done_iterations as if measured."""
    monkeypatch.setenv("MESH_REPORT_INTERVAL", "0.1")
    (tmp_path / "quiet.py").write_text(SLEEPS)
    (tmp_path / "reports.py").write_text(REPORTS)
    quiet = _submit(mesh, tmp_path / "quiet.py", "--gpus", "2")
    loud = _submit(mesh, tmp_path / "reports.py", "--gpus", "2")
    poll(lambda: served.records[quiet].state == "RUNNING", what="quiet job running")
    poll(lambda: (served.records[loud].reported or [0])[0] >= 7, what="the reporting job's steps journaled")
    views = {j["job_id"]: j for j in json.loads(mesh("ls", "--json").stdout)}
    q, lv = views[quiet], views[loud]
    assert q["done_iterations"] is None and q["step_time"] is None
    assert q["progress"]["measured"] is False and q["progress"]["estimated"] is True
    assert q["progress"]["estimated_iterations"] >= 0 and q["progress"]["estimated_step_time"] > 0  # kept: scheduling
    assert lv["done_iterations"] == 7 and lv["progress"] == dict(lv["progress"], measured=True, iterations=7)
    assert json.loads(mesh("show", quiet, "--json").stdout)["progress"]["measured"] is False
    shown = mesh("show", quiet).stdout
    assert "done_iterations: - (the job reports no steps; the scheduler's estimate: ~" in shown
    assert "done_iterations: 7 (reported by the job)" in mesh("show", loud).stdout
    node = json.loads(mesh("nodes", "--json").stdout)[0]
    rows = {r[0]: r for r in top_rows(node, list(views.values()))}
    step = rows["JOBID"].index("STEP")
    assert rows[quiet][step:step + 2] == ("-", "-")
    assert rows[loud][step] == "7/100" and rows[loud][step + 1] != "-"
    mesh("cancel", quiet, loud)


def test_ls_filters_and_format(served, tmp_path, mesh):
    """Fails before: --user, --me, --state, --name and --format did not exist."""
    (tmp_path / "s.py").write_text(SLEEPS)
    run = _submit(mesh, tmp_path / "s.py", "--gpus", "4", "--name", "big")
    wait = _submit(mesh, tmp_path / "s.py", "--gpus", "4", "--name", "next")
    poll(lambda: served.records[run].state == "RUNNING", what="first job running")
    me = served.records[run].user

    def ids(*args: str) -> list[str]:
        r = mesh("ls", *args, "--format", "id")
        assert r.exit_code == 0, r.output
        return r.stdout.split()[1:]

    assert ids("--state", "PENDING") == [wait] and ids("--state", "running") == [run]
    assert ids("--name", "next") == [wait] and ids("--user", me) == [run, wait] and ids("--me") == [run, wait]
    assert ids("--user", "nosuchuser") == []
    r = mesh("ls", "--format", "id,user,state,time,name")
    assert r.stdout.splitlines()[0].split() == ["JOBID", "USER", "STATE", "TIME", "NAME"]
    assert r.stdout.splitlines()[1].split()[:3] == [run, me, "RUNNING"]
    for bad in (("--format", "id,bogus"), ("--state", "BOGUS")):
        r = mesh("ls", *bad)
        assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1 and "mesh: error:" in r.stderr, (bad, r.output)
    mesh("cancel", run, wait)
    # the cancel frees `run`'s GPUs before it reaches `wait`, which may start and then need its kill: wait for both
    poll(lambda: served.records[run].state == served.records[wait].state == "CANCELLED", what="both cancelled")
    assert ids("--state", "CANCELLED") == [run, wait]  # an ended state: ended jobs listed without --all


def test_unknown_job_ids_are_an_error(served, tmp_path, mesh):
    """Fails before: `mesh ls 9999` printed an empty table and exited 0."""
    r = mesh("ls", "9999")
    assert r.exit_code == 1 and r.stdout == "" and r.stderr.strip() == "mesh: error: invalid job id 9999"
    (tmp_path / "s.py").write_text("pass\n")
    job = _submit(mesh, tmp_path / "s.py")
    r = mesh("ls", job, "9999")
    assert r.exit_code == 1 and r.stderr.strip() == "mesh: error: invalid job id 9999"
    assert [line.split()[0] for line in r.stdout.splitlines()] == ["JOBID", job]
    r = mesh("ls", "--json", "9999", job)
    assert r.exit_code == 1 and [j["job_id"] for j in json.loads(r.stdout)] == [job]


def test_pending_array_tasks_are_one_row(served, tmp_path, mesh):
    """Fails before: a 10-task array was 10 rows (squeue: `12_[0-9%2]`)."""
    (tmp_path / "s.py").write_text(SLEEPS)
    r = mesh("submit", str(tmp_path / "s.py"), "--array", "0-9%2", "--hold", "--json")
    array = json.loads(r.stdout)["array_id"]
    rows = [line.split() for line in mesh("ls").stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == [f"{array}_[0-9%2]"] and rows[0][-1] == "(JobHeldUser)"
    unfolded = [line.split()[0] for line in mesh("ls", "--array-unfold").stdout.splitlines()[1:]]
    assert unfolded == [f"{array}_{i}" for i in range(10)]
    assert len(json.loads(mesh("ls", "--json").stdout)) == 10  # --json: every task
    mesh("release", array)
    poll(lambda: any(line.split()[0] == f"{array}_0" for line in mesh("ls").stdout.splitlines()),
         what="running tasks listed one by one")
    ids = [line.split()[0] for line in mesh("ls").stdout.splitlines()[1:]]
    assert all("[" not in i for i in ids[:2]) and any(i.startswith(f"{array}_[") for i in ids), ids
    mesh("cancel", array)


def test_long_and_wide_names_keep_columns_aligned(served, tmp_path, mesh):
    """Fails before: a 128-character name widened every row; CJK names misaligned the columns after NAME."""
    (tmp_path / "s.py").write_text("import time\ntime.sleep(60)\n")
    for name in ("x" * 128, "训练任务", "plain"):
        _submit(mesh, tmp_path / "s.py", "--name", name, "--hold")
    lines = mesh("ls", "--format", "name,user,state").stdout.splitlines()
    assert max(len(line) for line in lines) < 60 and "…" in lines[1]
    from meshsched.daemon.jobformat import cells

    starts = {cells(line[: line.index("PENDING" if i else "STATE")]) for i, line in enumerate(lines)}
    assert len(starts) == 1, lines  # STATE starts at the same cell on every row (a CJK character takes two)
    for job in list(served.records):
        mesh("cancel", job)


def test_show_has_scontrols_fields(served, tmp_path, mesh):
    """Fails before: no submit / eligible / begin / start / end times, exit code, stdout, time limit or left."""
    (tmp_path / "f.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "s.py").write_text(SLEEPS)
    failed = _submit(mesh, tmp_path / "f.py", "--time", "10:00")
    later = _submit(mesh, tmp_path / "s.py", "--begin", "now+3600")
    poll(lambda: served.records[failed].state == "FAILED", what="job failed")

    def fields(job: str) -> dict[str, str]:
        out = mesh("show", job).stdout.splitlines()
        return {k.strip(): v for k, v in (line.split(": ", 1) for line in out if ": " in line)}

    f = fields(failed)
    assert f["exit_code"] == "3" and f["state"] == "FAILED"
    for key in ("submit_time", "eligible_time", "start_time", "end_time"):
        time.strptime(f[key], "%Y-%m-%dT%H:%M:%S")
    assert f["time_limit"] == "10:00" and f["time_left"] == "-" and f["begin_time"] == "-"
    assert f["stdout"].endswith(f"/{failed}/logs/rank0.log") and f["stderr"] == "with stdout"
    assert f["command"].endswith("f.py") and f["restarts"] == "0" and f["run_time"]
    p = fields(later)
    assert p["eligible_time"] == "Unknown" and p["start_time"] == "-" and p["exit_code"] == "-"
    time.strptime(p["begin_time"], "%Y-%m-%dT%H:%M:%S")
    assert p["time_limit"] == "UNLIMITED"
    view = json.loads(mesh("show", failed, "--json").stdout)
    assert view["exit_code"] == 3 and view["end_time"] >= view["start_time"] and view["eligible_time"]
    mesh("cancel", later)


def test_format_fields_are_documented():
    """Every --format field is named in `mesh ls --help` and docs/daemon.md."""
    from pathlib import Path

    from meshsched.cli.app import app
    from meshsched.daemon.jobformat import FIELDS
    from typer.testing import CliRunner

    helptext = " ".join(CliRunner().invoke(app, ["ls", "--help"], terminal_width=400).output.split())
    docs = (Path(__file__).parents[2] / "docs" / "daemon.md").read_text()
    for name in FIELDS:
        assert f" {name}" in helptext and f"`{name}`" in docs, name
