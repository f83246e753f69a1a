"""`mesh simulate` and `mesh profiles ls`: JSON output, files written by --out/--plot, one-line errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from meshsched.cli.main import app
from typer.testing import CliRunner

from meshsched.loaders.profiles import load_perf_model
from meshsched.loaders.traces import TraceOptions, load_trace
from meshsched.perf import DEFAULT_GPU_TYPE
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.sim.metrics import JOB_COLUMNS, summarise, summary_dict

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SUMMARY_KEYS = {
    "policy", "jobs", "completed", "unschedulable", "unfinished", "jct_mean_h", "jct_p50_h", "jct_p95_h",
    "jct_p99_h", "wait_mean_h", "makespan_h", "preemptions", "futile_preemptions", "gpu_utilisation", "events",
    "sim_seconds",
}  # fmt: skip


def _mesh(*args: str):
    return CliRunner().invoke(app, list(args))


def _ok(result) -> None:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr, result.exception)


def _assert_one_line_error(result, *fragments: str) -> str:
    """Non-zero exit through `fail` (SystemExit, not a crash), nothing on stdout, one `mesh: error:` line."""
    assert result.exit_code != 0, result.stdout
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.stdout == ""
    err = result.stderr
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mesh: error: "), err
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    return lines[0]


# ---------------------------------------------------------------------------------------------- --json


def test_simulate_json_one_entry_per_policy():
    r = _mesh("simulate", "--jobs", "200", "--nodes", "2", "--policy", "fifo,sjf", "--json")
    _ok(r)
    data = json.loads(r.stdout)
    assert data["trace"] == "philly" and data["jobs"] == 200 and data["seed"] == 1 and data["load"] == 1.0
    assert data["cluster"] == [{"nodes": 2, "gpus_per_node": 8, "gpu_type": DEFAULT_GPU_TYPE}]
    assert [p["policy"] for p in data["policies"]] == ["fifo", "sjf"]
    for p in data["policies"]:
        assert SUMMARY_KEYS <= set(p), SUMMARY_KEYS - set(p)
        assert p["jobs"] == 200
        assert p["completed"] + p["unschedulable"] == 200 and p["unfinished"] == 0
        assert 0 < p["wait_mean_h"] < p["jct_mean_h"] <= p["jct_p99_h"]
        assert p["preemptions"] == 0 and p["futile_preemptions"] == 0  # both non-preemptive
        assert 0 < p["gpu_utilisation"] <= 1 and p["sim_seconds"] >= 0
    fifo, sjf = data["policies"]
    assert sjf["jct_mean_h"] < fifo["jct_mean_h"]
    # the CLI reports what the library computes for the same replay
    perf = load_perf_model()
    tr = load_trace("philly", perf, TraceOptions(gpu_type=DEFAULT_GPU_TYPE, gpus_per_node=8, seed=1, first_n=200))
    cluster = ClusterSpec(2, 8, DEFAULT_GPU_TYPE, perf.gpu_memory_mb(DEFAULT_GPU_TYPE))
    lib = summary_dict(summarise(simulate(tr.jobs, make_policy("fifo"), perf, cluster), "fifo"))
    assert set(fifo) == set(lib) | {"sim_seconds"}
    for key, want in lib.items():
        assert fifo[key] == (pytest.approx(want, rel=1e-12) if isinstance(want, float) else want), key


def test_simulate_table_output_and_unschedulable_warning():
    r = _mesh("simulate", "--jobs", "60", "--nodes", "1", "--policy", "fifo,srtf@360")
    _ok(r)
    assert "fifo" in r.stdout and "srtf@360" in r.stdout
    assert "philly: 60 jobs on 1 x 8" in r.stdout
    too_big = sum(
        1
        for j in load_trace("philly", load_perf_model(),
                            TraceOptions(gpu_type=DEFAULT_GPU_TYPE, gpus_per_node=8, seed=1, first_n=60)).jobs
        if j.gpus > 8
    )  # fmt: skip
    if too_big:
        assert f"{too_big} job(s) need more than the cluster's 8 GPUs" in r.stderr


def test_simulate_table_fits_100_columns_and_wide_shows_all():
    """Fails before: 131 columns, whatever the terminal."""
    r = _mesh("simulate", "--jobs", "60", "--nodes", "1", "--policy", "fifo,srtf@360")
    _ok(r)
    lines = r.stdout.rstrip("\n").splitlines()
    assert max(len(line) for line in lines) <= 100, lines
    header = next(line for line in lines if line.lstrip().startswith("policy")).split()
    assert header[:4] == ["policy", "done", "unsched", "JCT"] and "futile" not in header and "…" not in r.stdout
    wide = _mesh("simulate", "--jobs", "60", "--nodes", "1", "--policy", "fifo", "--wide")
    _ok(wide)
    wide_header = next(line for line in wide.stdout.splitlines() if line.lstrip().startswith("policy")).split()
    assert {"p99", "futile", "deadl"} <= set(wide_header) and "…" not in wide.stdout


def test_simulate_where_no_job_fits_the_cluster_is_an_error(tmp_path):
    """Fails before: a table of nan and exit 0."""
    trace = tmp_path / "big.csv"
    trace.write_text("submit_time,gpus,duration\n0,16,600\n30,32,1200\n")
    _assert_one_line_error(_mesh("simulate", "--trace", str(trace), "--nodes", "1", "--json"),
                           "every one of the 2 jobs needs more than the cluster's 8 GPUs", "--nodes")


def test_simulate_json_carries_the_unschedulable_warning(tmp_path):
    """Fails before: --json dropped the warning that jobs could never run."""
    trace = tmp_path / "some.csv"
    trace.write_text("submit_time,gpus,duration\n0,1,600\n30,32,1200\n")
    r = _mesh("simulate", "--trace", str(trace), "--nodes", "1", "--policy", "fifo", "--json")
    _ok(r)
    data = json.loads(r.stdout)
    assert data["warnings"] == ["1 job(s) need more than the cluster's 8 GPUs: reported as unschedulable"]
    assert data["policies"][0]["unschedulable"] == 1 and r.stderr == ""


# ---------------------------------------------------------------------------------------------- --out, --plot


def test_simulate_out_writes_summaries_and_per_job_csvs(tmp_path):
    out = tmp_path / "res" / "deep"
    r = _mesh("simulate", "--jobs", "100", "--nodes", "1", "--policy", "fifo,srtf@360", "--out", str(out))
    _ok(r)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["jobs-fifo.csv", "jobs-srtf_at_360.csv", "summary.csv", "summary.json"]

    summary = json.loads((out / "summary.json").read_text())
    assert [s["policy"] for s in summary] == ["fifo", "srtf@360"]
    assert all(SUMMARY_KEYS <= set(s) and s["jobs"] == 100 for s in summary)

    with (out / "summary.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["policy"] for row in rows] == ["fifo", "srtf@360"]
    assert set(rows[0]) == set(summary[0])
    for row, s in zip(rows, summary, strict=True):
        assert int(row["completed"]) == s["completed"]
        assert float(row["jct_mean_h"]) == pytest.approx(s["jct_mean_h"], rel=1e-12)

    for name in ("jobs-fifo.csv", "jobs-srtf_at_360.csv"):
        with (out / name).open(newline="") as f:
            reader = csv.DictReader(f)
            jobs = list(reader)
        assert tuple(reader.fieldnames) == JOB_COLUMNS
        assert len(jobs) == 100 and len({j["job_id"] for j in jobs}) == 100
    assert not (out / "simulate.png").exists()
    # says where the summaries went (fails before: only --plot's path was printed)
    assert f"summaries: {out / 'summary.json'}, {out / 'summary.csv'}, {out / 'jobs-fifo.csv'}" in r.stderr


def test_simulate_plot_writes_a_png(tmp_path):
    r = _mesh("simulate", "--jobs", "50", "--nodes", "2", "--policy", "fifo,srtf", "--out", str(tmp_path), "--plot")
    _ok(r)
    png = tmp_path / "simulate.png"
    data = png.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000
    assert f"plot: {png}" in r.stderr


# ---------------------------------------------------------------------------------------------- errors


ERROR_CASES = [
    (["--trace", "no-such-trace"], ["unknown trace 'no-such-trace'", "philly"]),
    (["--policy", "fifo,bogus"], ["unknown policy 'bogus'", "fifo", "srtf"]),
    (["--policy", "srtf@x"], ["srtf@x", "seconds"]),
    (["--policy", "srtf@0"], ["srtf@0", ">= 1"]),
    (["--policy", "srtf@-60"], ["srtf@-60", ">= 1"]),
    # Fails as of writing: make_policy (meshsched/policies/registry.py, `if not interval > 0:`) accepts an
    # infinite interval; with jobs left queued the replay then dies in QueueScheduler.next_timer
    # (math.floor(inf / inf): ValueError traceback); on a big cluster it "completes" with JCT inf.
    (["--policy", "srtf@inf", "--nodes", "1"], ["srtf@inf"]),
    (["--policy", " , "], ["--policy is empty"]),
    (["--nodes", "0"], ["--nodes 0"]),
    (["--gpus-per-node", "0"], ["--gpus-per-node 0"]),
    (["--nodes", "-3"], ["--nodes -3"]),
    (["--gpu-type", "a100"], ["unknown GPU type 'a100'", "v100"]),
    (["--window", "abc"], ["--window", "START:END", "'abc'"]),
    (["--window", "720"], ["--window", "'720'"]),
    (["--window", "10:x"], ["--window", "'10:x'"]),
    (["--window", "10:5"], ["window"]),
    (["--window", "-5:10"], ["window"]),
    (["--window", "900000:900001"], ["no job arrives in the window"]),
    (["--load", "0"], ["load must be"]),
    (["--jobs", "0"], ["first_n must be"]),
]  # fmt: skip


@pytest.mark.parametrize(("args", "fragments"), ERROR_CASES, ids=[" ".join(a) for a, _ in ERROR_CASES])
def test_simulate_errors_are_one_line(args, fragments):
    if "--jobs" not in args:
        args = ["--jobs", "20", *args]  # small, should an error ever be missed and the replay run
    _assert_one_line_error(_mesh("simulate", *args), *fragments)


def test_simulate_csv_with_a_bad_row_names_file_and_line(tmp_path):
    trace = tmp_path / "mine.csv"
    trace.write_text("submit_time,gpus,duration\n0,1,600\n\n30,two,600\n60,1,600\n")
    line = _assert_one_line_error(_mesh("simulate", "--trace", str(trace), "--nodes", "1"))
    assert f"{trace}:4:" in line and "'gpus'" in line and "'two'" in line


def test_simulate_own_csv_trace_runs(tmp_path):
    trace = tmp_path / "mine.csv"
    trace.write_text("submit_time,gpus,duration\n0,1,600\n30,2,1200\n60,16,600\n")
    r = _mesh("simulate", "--trace", str(trace), "--nodes", "1", "--policy", "srtf,las", "--json")
    _ok(r)
    data = json.loads(r.stdout)
    assert data["trace"] == "mine" and data["jobs"] == 3
    for p in data["policies"]:
        assert (p["completed"], p["unschedulable"], p["unfinished"]) == (2, 1, 0)


def test_simulate_out_that_is_a_file_is_an_error(tmp_path):
    """Fails as of writing: without --json, the transient rich progress bar leaves a blank line on stderr
    (stderr not a terminal) before the error, so the error is not one line; see cli/simulate.py, the
    `Progress(..., transient=True, disable=json_out)` block. (--out is also only checked after every replay.)"""
    target = tmp_path / "taken"
    target.write_text("")
    _assert_one_line_error(
        _mesh("simulate", "--jobs", "10", "--nodes", "1", "--policy", "fifo", "--out", str(target)), "--out"
    )


def _mesh_script() -> Path:
    script = Path(sys.executable).parent / "mesh"
    if not script.exists():
        pytest.skip("the `mesh` console script is not installed next to this interpreter")
    return script


@pytest.mark.parametrize(
    ("args", "fragment"),
    [(["--nodes", "0"], "--nodes 0"), (["--trace", "/nonexistent/trace.csv"], "unknown trace")],
)
def test_installed_mesh_exits_2_with_one_line_and_no_traceback(args, fragment):
    p = subprocess.run(
        [str(_mesh_script()), "simulate", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stdout == ""
    assert "Traceback" not in p.stderr
    assert p.stderr.startswith("mesh: error: ") and p.stderr.count("\n") == 1 and fragment in p.stderr


# ---------------------------------------------------------------------------------------------- profiles ls


def test_profiles_ls_json_lists_models_per_gpu_type():
    r = _mesh("profiles", "ls", "--json")
    _ok(r)
    rows = json.loads(r.stdout)
    perf = load_perf_model()
    assert {row["gpu_type"] for row in rows} == set(perf.gpu_types)
    assert DEFAULT_GPU_TYPE in perf.gpu_types
    for g in perf.gpu_types:
        models = [row["model"] for row in rows if row["gpu_type"] == g]
        assert models and sorted(models) == sorted(perf.models(g, 1)), g
    for row in rows:
        assert set(row) >= {"gpu_type", "model", "multi_gpu", "batches"}
        assert isinstance(row["multi_gpu"], bool)
        assert row["batches"] and all(isinstance(b, int) and b > 0 for b in row["batches"])
        assert row["batches"] == list(perf.profiled_batches(row["model"], row["gpu_type"]))


def test_profiles_ls_has_a_header_row():
    """Fails before: rows only."""
    r = _mesh("profiles", "ls", "--gpu-type", "v100")
    _ok(r)
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["GPU", "MODEL", "MULTI-GPU", "BATCHES"]
    assert lines[1].split()[:2] == ["v100", "a3c"] and len(lines) == 1 + len(load_perf_model().models("v100"))


def test_simulate_json_does_not_import_rich():
    code = ("import sys\nfrom meshsched.cli.main import main\n"
            "try:\n    main(['simulate', '--jobs', '20', '--nodes', '1', '--policy', 'fifo', '--json'])\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'rich'), file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["jobs"] == 20 and p.stderr.strip() == "[]"


def test_profiles_ls_one_gpu_type_and_unknown_type():
    r = _mesh("profiles", "ls", "--gpu-type", "v100", "--json")
    _ok(r)
    rows = json.loads(r.stdout)
    assert rows and {row["gpu_type"] for row in rows} == {"v100"}
    _assert_one_line_error(_mesh("profiles", "ls", "--gpu-type", "a100", "--json"), "unknown GPU type 'a100'")


def test_simulate_mps_one_user_pairs_only_one_users_jobs(tmp_path):
    """`--mps-one-user`: bob's job does not share ann's only GPU (it waits for it); without it, it shares at once."""
    trace = tmp_path / "two.csv"
    trace.write_text("submit_time,gpus,iterations,model,batch_size,user\n0,1,20000,resnet18,16,ann\n"
                     "60,1,2000,resnet18,16,bob\n")
    waits = {}
    for flag in ((), ("--mps-one-user",)):
        r = _mesh("simulate", "--trace", str(trace), "--nodes", "1", "--gpus-per-node", "1", "--policy", "sjf-ffs",
                  "--json", *flag)
        _ok(r)
        waits[bool(flag)] = json.loads(r.stdout)["policies"][0]["wait_mean_h"]
    assert waits[False] == 0 < waits[True], waits
