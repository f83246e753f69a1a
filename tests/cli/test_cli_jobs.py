"""`mesh submit|ls|show|logs|cancel|nodes|top` against a meshd running in a background thread.

Most calls go through `main()` (the lean parser, as the installed `mesh` runs them); a few through the typer
app (what `--help` and the other commands use). Both call the same functions in cli/jobs.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from meshsched.cli.client import Client, default_socket
from meshsched.cli.jobs import NOTHING_TO_CANCEL, parse_deadline
from meshsched.cli.top import top_rows
from meshsched.cli.main import app
from meshsched.daemon.config import default_runtime_dir
from meshsched.daemon.hostres import machine_cpus, machine_memory_gb
from typer.testing import CliRunner

from meshsched.wire.jobtable import JOBS_HEADER, columns, fmt_time, jobs_row
from tests.support.daemon import poll

# A script that declares its length through meshsched.job, then idles until told to stop.
DECLARES_STEPS = """
import sys, time
from meshsched import job
sess = job.attach(rng=False, total_steps=int(sys.argv[1]))
print("declared", sys.argv[1], flush=True)
while sess.step < 2:
    sess.end_step()
time.sleep(float(sys.argv[2]))
sess.close()
"""


def typer_mesh(*args: str):
    return CliRunner().invoke(app, list(args))


def test_daemon_not_running_names_the_socket_and_how_to_point_mesh_elsewhere(monkeypatch, tmp_path, mesh):
    sock = tmp_path / "none.sock"
    monkeypatch.setenv("MESH_API_SOCKET", str(sock))
    for args in (("ls",), ("show", "1"), ("cancel", "1"), ("logs", "1"), ("nodes",)):
        r = mesh(*args)
        assert r.exit_code == 2, args
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("mesh: error: meshd is not running"), r.stderr
        assert str(sock) in lines[0] and "MESH_API_SOCKET" in lines[0] and "MESHD_RUNTIME_DIR" in lines[0]
        assert "systemctl status meshd" in lines[0] and "--fake-gpus" not in lines[0]  # a server's service


def test_default_socket_follows_meshds_default_runtime_dir():
    assert default_socket({}) == str(default_runtime_dir({}) / "api.sock")
    env = {"XDG_RUNTIME_DIR": "/run/user/1234"}
    assert default_socket(env) == str(default_runtime_dir(env) / "api.sock")
    assert default_socket({"MESHD_RUNTIME_DIR": "/x/run"}) == "/x/run/api.sock"
    assert default_socket({"MESH_API_SOCKET": "/y/api.sock", "MESHD_RUNTIME_DIR": "/x"}) == "/y/api.sock"


def test_submit_ls_show_logs_cancel(served, tmp_path, mesh):
    script = tmp_path / "train.py"
    script.write_text("import sys, time\nprint('args', sys.argv[1:], flush=True)\ntime.sleep(float(sys.argv[1]))\n")
    r = mesh("submit", str(script), "--gpus", "2", "--iters", "10", "--name", "tiny", "--", "0.1")
    assert r.exit_code == 0, r.output
    first = r.stdout.split()[-1]
    r = mesh("submit", str(script), "--gpus", "4", "--json", "--", "30")
    assert r.exit_code == 0, r.output
    second = json.loads(r.stdout)["job_id"]
    poll(lambda: served.records[first].state == "COMPLETED", what="first job completed")
    poll(lambda: served.records[second].state == "RUNNING", what="second job running")
    r = mesh("ls")
    assert r.exit_code == 0
    header = r.stdout.splitlines()[0].split()
    assert header == ["JOBID", "NAME", "USER", "STATE", "TIME", "GPUS", "PARTNER", "BATCH", "MPS%", "NODE(REASON)"]
    assert second in r.stdout and "RUNNING" in r.stdout and first not in r.stdout.split()
    listed = json.loads(mesh("ls", "--all", "--json").stdout)
    assert {j["job_id"]: j["state"] for j in listed} == {first: "COMPLETED", second: "RUNNING"}
    assert "rank_reports" not in listed[0] and listed[0]["command"]  # --json: the whole record, not the brief
    r = mesh("show", first)
    assert "COMPLETED" in r.stdout and "tiny" in r.stdout
    view = json.loads(mesh("show", first, "--json").stdout)
    assert view["name"] == "tiny" and view["cpu_ids"] and view["memory_limit_gb"] > 0  # what its run was confined to
    assert f"cpu ids: {view['cpu_list']}\n" in r.stdout
    by = view["memory_enforced_by"] or "not enforced on its node"
    assert f"memory limit: {view['memory_limit_gb']:g} GiB ({by})\n" in r.stdout
    assert mesh("logs", first).stdout.strip() == "args ['0.1']"
    assert mesh("logs", first, "-f").stdout.strip() == "args ['0.1']"  # ends: the job is done
    r = typer_mesh("top", "--once")
    assert r.exit_code == 0 and "[0]" in r.output and second in r.output
    nodes = json.loads(mesh("nodes", "--json").stdout)
    assert nodes[0]["total_gpus"] == 4 and nodes[0]["free_gpus"] == 0
    assert (nodes[0]["cpus"], nodes[0]["memory_gb"]) == (machine_cpus(), machine_memory_gb())  # the machine's own
    r = mesh("nodes")
    assert r.stdout.split()[:10] == ["NODE", "STATE", "GPUS", "FREE", "TYPE", "CPUS", "MEM(GB)", "BACKEND", "POLICY",
                                     "QUEUE"]
    assert "fake" in r.stdout
    r = mesh("cancel", second)  # a running job is COMPLETING until its processes are gone
    assert r.exit_code == 0 and ("COMPLETING" in r.output or "CANCELLED" in r.output)


def test_ls_lists_what_the_full_view_says(served, tmp_path, mesh):
    """`mesh ls` prints meshd's table (daemon/listing.py): the columns the full job views give."""
    script = tmp_path / "t.py"
    script.write_text("import time\ntime.sleep(30)\n")
    for gpus in (4, 2, 1, 4):
        assert mesh("submit", str(script), "--gpus", str(gpus)).exit_code == 0
    poll(lambda: any(r.state == "RUNNING" for r in served.records.values()), what="a job running")
    full = json.loads(mesh("ls", "--json").stdout)
    table = mesh("ls").stdout.splitlines()
    expected = columns([JOBS_HEADER] + [jobs_row(j) for j in full])
    assert [line.split() for line in table] == [line.split() for line in expected] or \
        [line.split()[:4] + line.split()[5:] for line in table] == \
        [line.split()[:4] + line.split()[5:] for line in expected], (table, expected)  # TIME may have ticked
    reasons = [line.split()[-1] for line in table[1:]]
    assert reasons[0] == "n1" and set(reasons[1:]) <= {"(Resources)", "(Priority)"}, reasons


def test_ls_is_current_after_every_change(served, tmp_path, mesh):
    """The listings are cached between state changes: each change shows in the next `mesh ls` (and --json)."""
    script = tmp_path / "t.py"
    script.write_text("import time\ntime.sleep(30)\n")
    ids = [mesh("submit", str(script), "--gpus", "4").stdout.split()[-1] for _ in range(3)]
    poll(lambda: served.records[ids[0]].state == "RUNNING", what="the first job running")

    def states(both: bool = True) -> dict[str, str]:
        rows = {row.split()[0]: row.split()[3] for row in mesh("ls", "--all").stdout.splitlines()[1:]}
        views = {j["job_id"]: j["state"] for j in json.loads(mesh("ls", "--all", "--json").stdout)}
        assert rows == views or not both
        return rows

    assert states() == {ids[0]: "RUNNING", ids[1]: "PENDING", ids[2]: "PENDING"}
    assert states() == {ids[0]: "RUNNING", ids[1]: "PENDING", ids[2]: "PENDING"}  # from the cache
    assert mesh("cancel", ids[2]).exit_code == 0
    assert states()[ids[2]] == "CANCELLED"
    assert mesh("hold", ids[1]).exit_code == 0
    assert "(JobHeldUser)" in mesh("ls").stdout
    assert mesh("release", ids[1]).exit_code == 0
    assert "(JobHeldUser)" not in mesh("ls").stdout
    assert mesh("cancel", ids[0]).exit_code == 0
    poll(lambda: states(both=False)[ids[1]] in ("LOADING", "RUNNING"), what="the second job started in the listing")
    for _ in range(3):  # nothing written in between: still not the PENDING piece cached before it started
        assert states(both=False)[ids[1]] in ("LOADING", "RUNNING")


def test_show_counts_restarts_not_launches_and_whole_steps(served, tmp_path, mesh):
    """Fails before: `restarts: 1` for a job that ran once, `done_iterations: 10.0`."""
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    job = mesh("submit", str(script), "--iters", "10").stdout.split()[-1]
    poll(lambda: served.records[job].state == "COMPLETED", what="job completed")
    fields = dict(line.split(": ", 1) for line in mesh("show", job).stdout.splitlines() if ": " in line)
    fields = {k.strip(): v for k, v in fields.items()}
    assert fields["restarts"] == "0"
    assert json.loads(mesh("show", job, "--json").stdout)["restarts"] == 0  # --json says the same (was 1)
    # a script that reports no steps: no measured figure, the scheduler's estimate marked as one (issue 22)
    assert fields["done_iterations"].startswith("- ") and "estimate" in fields["done_iterations"]
    assert fields["iterations"] == "10"


def test_cancel_of_a_finished_job_says_nothing_happened(served, tmp_path, mesh):
    """Fails before: exit 0 with `job 1: COMPLETED`."""
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    job = mesh("submit", str(script)).stdout.split()[-1]
    poll(lambda: served.records[job].state == "COMPLETED", what="job completed")
    r = mesh("cancel", job)
    assert r.exit_code == NOTHING_TO_CANCEL == 3
    assert r.stdout.strip() == f"job {job} already COMPLETED; nothing to cancel"
    assert served.records[job].state == "COMPLETED"


def test_logs_of_a_job_without_output_says_so(served, tmp_path, mesh):
    """Fails before: `mesh logs` printed nothing at all while the job had not written anything."""
    script = tmp_path / "quiet.py"
    script.write_text("import time\ntime.sleep(30)\n")
    job = mesh("submit", str(script)).stdout.split()[-1]
    poll(lambda: served.records[job].state == "RUNNING", what="job running")
    r = mesh("logs", job)
    assert r.exit_code == 0 and r.stdout == ""
    assert r.stderr.strip() == f"mesh: job {job} is RUNNING; its log (rank 0) is empty so far"
    mesh("cancel", job)


def test_top_json_and_gpu_share_unknown_on_fake_gpus(served, tmp_path, mesh):
    """Fails before: no --json; job rows showed SM 100 on fake GPUs whose utilisation is not measured."""
    script = tmp_path / "t.py"
    script.write_text("import time\ntime.sleep(30)\n")
    job = mesh("submit", str(script), "--gpus", "2", "--iters", "500").stdout.split()[-1]
    poll(lambda: served.records[job].state == "RUNNING", what="job running")
    r = typer_mesh("top", "--json")
    assert r.exit_code == 0, r.output
    frame = json.loads(r.stdout)
    assert frame["nodes"][0]["backend"] == "fake" and [j["job_id"] for j in frame["jobs"]] == [job]
    rows = top_rows(frame["nodes"][0], frame["jobs"])
    assert rows[0] == ("JOBID", "NAME", "STATE", "GPUS", "PARTNER", "BATCH", "MPS%", "GPU%", "STEP", "STEPS/S", "TIME")
    gpu_col = rows[0].index("GPU%")
    assert rows[1][gpu_col] == "-" and rows[1][gpu_col + 1:gpu_col + 3] == ("-", "-")  # reports no steps: not made up
    assert rows[1][4:7] == ("-", "16x1", "100")  # alone, its whole per-GPU batch (32 / 2 GPUs), a whole GPU
    r = typer_mesh("top", "--once")
    assert r.exit_code == 0 and r.output.split().count("100") == 1  # the MPS share; no made-up GPU utilisation
    measured = dict(frame["nodes"][0], backend="nvml",
                    gpus=[dict(g, utilization=u) for g, u in zip(frame["nodes"][0]["gpus"], (30, 50, -1, -1))])
    assert top_rows(measured, frame["jobs"])[1][gpu_col] == "40"  # the mean of its GPUs' readings, where measured
    mesh("cancel", job)


def test_the_scripts_declared_steps_become_the_jobs_length(served, tmp_path, mesh):
    """Fails before: the estimate stayed at --iters' default 100 whatever the script ran."""
    script = tmp_path / "declares.py"
    script.write_text(DECLARES_STEPS)
    free = mesh("submit", str(script), "--", "3000", "30").stdout.split()[-1]
    fixed = mesh("submit", str(script), "--iters", "50", "--", "3000", "30").stdout.split()[-1]
    poll(lambda: served.records[free].iterations == 3000, what="declared total taken")
    assert served.engine.state.jobs[free].spec.iterations == 3000
    assert json.loads(mesh("show", free, "--json").stdout)["iterations"] == 3000
    poll(lambda: fixed in served.sdk_jobs, what="second job said hello")
    assert served.records[fixed].iterations == 50 and served.engine.state.jobs[fixed].spec.iterations == 50
    assert any("declared 3000 iterations" in e.message for e in served.engine.explain(free))
    mesh("cancel", free, fixed)


def test_user_errors_are_one_line(served, tmp_path, mesh):
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    for args, text in [
        (("submit", str(script), "--gpus", "0"), "--gpus must be at least 1"),
        (("submit", str(script), "--gpus", "9"), "only 4 GPU"),
        (("submit", str(script), "--iters", "0"), "--iters must be at least 1"),
        (("submit", str(tmp_path / "missing.py")), "does not exist"),
        (("show", "404"), "unknown job 404"),
        (("cancel", "404"), "unknown job 404"),
        (("logs", "404"), "unknown job 404"),
        (("submit", str(script), "--deadline", "soon"), "--deadline"),
    ]:
        r = mesh(*args)
        assert r.exit_code not in (0, None), args
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mesh: error:") and text in lines[0], r.output


def test_formatting_helpers():
    assert fmt_time(5) == "0:05" and fmt_time(3725) == "1:02:05" and fmt_time(90061) == "1-01:01:01"
    assert parse_deadline("2h", 100.0) == 7300.0 and parse_deadline("30m", 0.0) == 1800.0
    assert parse_deadline("1.5d", 0.0) == 129600.0
    for bad in ("-2h", "infh", "nanm", "h", "2x"):
        with pytest.raises(SystemExit):
            parse_deadline(bad, 0.0)


def test_mesh_daemon_reports_bad_flags(tmp_path):
    r = typer_mesh("daemon", "--fake-gpus", "-1", "--state-dir", str(tmp_path / "s"), "--runtime-dir",
                   str(tmp_path / "r"))
    assert r.exit_code != 0 and "fake_gpus must be >= 0" in r.output


LEAN = ("typer", "click", "rich", "meshsched.daemon", "meshsched.perf", "meshsched.sim", "pathlib", "http",
        "email", "dataclasses", "typing", "asyncio", "datetime")
PROBE = """import sys
from meshsched.cli.main import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:  # the typer app exits on its own
    rc = exc.code
loaded = sorted(sys.modules)
import json
print(json.dumps(loaded), file=sys.stderr)
sys.exit(rc)
"""


BARE = "import sys; m = sorted(sys.modules); import json; print(json.dumps(m))"


@pytest.mark.parametrize("args", [["ls"], ["ls", "--json"], ["show", "{job}"], ["show", "{job}", "--json"],
                                  ["logs", "{job}"], ["nodes"], ["nodes", "--json"], ["submit", "{script}"],
                                  ["cancel", "{job}"]])
def test_common_commands_import_only_what_they_use(served, tmp_path, args):
    """Fails before: every command imported typer, rich and the daemon's configuration (0.28 s). Output
    meshd's JSON passes through undecoded (`--json`, logs) does not even import json."""
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    job = Client().call("POST", "/v1/jobs", {"command": [sys.executable, str(script)], "cwd": "/tmp"})["job_id"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    p = subprocess.run([sys.executable, "-c", PROBE, *[a.format(job=job, script=script) for a in args]], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode in (0, NOTHING_TO_CANCEL), p.stderr
    loaded = set(json.loads(p.stderr.strip().splitlines()[-1]))
    # what the interpreter loads before any of our code (an editable install's path hook brings pathlib)
    bare = subprocess.run([sys.executable, "-c", BARE], env=env, capture_output=True, text=True, timeout=60)
    lean = LEAN + (("json",) if "--json" in args or args[0] == "logs" else ())
    lean += ("shutil", "bz2", "lzma") if args[0] == "submit" else ()  # a plain PATH scan finds python3 (jobs.which)
    extra = sorted(m for m in loaded - set(json.loads(bare.stdout)) if any(m == p or m.startswith(p + ".")
                                                                           for p in lean))
    assert extra == [], extra


def test_top_json_does_not_import_rich(served):
    """`mesh top --json` goes through the typer app, but draws nothing: rich stays out."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    p = subprocess.run([sys.executable, "-c", PROBE, "top", "--json"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["nodes"][0]["name"] == "n1"
    assert [m for m in json.loads(p.stderr.strip().splitlines()[-1]) if m.split(".")[0] == "rich"] == []


def test_which_finds_what_shutil_which_finds(tmp_path):
    """`mesh submit` finds a .py job's python3 on the job's PATH without importing shutil (jobs.which)."""
    import shutil

    from meshsched.cli.jobs import which

    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    (a / "python3").mkdir()  # a directory: skipped
    (b / "python3").write_text("")  # not executable: skipped
    (c / "python3").write_text("#!/bin/sh\n")
    (c / "python3").chmod(0o755)
    for path in (f"{a}:{b}:{c}", f"{c}:{a}", f"{a}:{b}", "", f"{b}::{c}", f"{c}:{c}"):
        assert which("python3", path) == shutil.which("python3", path=path), path
