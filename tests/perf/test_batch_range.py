"""Issue 26, point 7: a per-GPU batch outside the batches a profile was measured at is said in one line, by
`mesh simulate` (once per model) and in meshd's answer to `mesh submit`."""

from __future__ import annotations

import json

import typer
from typer.testing import CliRunner

from meshsched.cli import simulate as simulate_cli
from meshsched.loaders.profiles import load_perf_model
from meshsched.perf.batch_range import batch_outside_profile, batch_warnings
from meshsched.state import JobSpec


def test_bert_at_48_per_t4_gpu_is_outside_the_profile():
    perf = load_perf_model()
    lo, hi = min(perf.profiled_batches("bert", "t4")), max(perf.profiled_batches("bert", "t4"))
    line = batch_outside_profile(perf, "bert", "t4", 48)
    assert line is not None and "bert" in line and "48" in line and f"{lo}-{hi}" in line and "\n" not in line
    assert batch_outside_profile(perf, "bert", "t4", hi) is None
    assert batch_outside_profile(perf, "custom", "t4", 48) is None  # no profile: nothing to compare with


def test_one_warning_per_model():
    perf = load_perf_model()
    jobs = [JobSpec(f"j{i}", 1, "bert", b, 10) for i, b in enumerate((48, 96, 8))]
    jobs.append(JobSpec("n", 2, "ncf", 2 * 10_000, 10))
    lines = batch_warnings(perf, jobs, "t4")
    assert len(lines) == 2 - (batch_outside_profile(perf, "ncf", "t4", 10_000) is None)
    assert lines[0].startswith("bert at 48 per GPU") and lines[0].endswith("(2 job(s))")


def _simulate(*args: str):
    app = typer.Typer()
    simulate_cli.register(app)
    app.command("noop")(lambda: None)
    return CliRunner().invoke(app, ["simulate", *args])


def test_mesh_simulate_warns_once_per_model(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,gpus,iterations,model,batch_size\n"
                     "a,0,1,50,bert,48\nb,10,1,50,bert,96\nc,20,1,50,bert,8\n")
    r = _simulate("--trace", str(trace), "--gpu-type", "t4", "--nodes", "1", "--policy", "sjf")
    assert r.exit_code == 0, (r.output, r.exception)
    lines = [ln for ln in r.stderr.splitlines() if "outside its t4 profile" in ln]
    assert len(lines) == 1 and lines[0].startswith("mesh: warning: bert at 48 per GPU"), r.stderr
    j = _simulate("--trace", str(trace), "--gpu-type", "t4", "--nodes", "1", "--policy", "sjf", "--json")
    assert [w for w in json.loads(j.stdout)["warnings"] if "outside" in w] == [lines[0].removeprefix("mesh: warning: ")]


def test_meshd_submission_names_the_batch_outside_the_profile():
    """What meshd answers a submit with (`Submission.batch_warnings`), for each GPU type of its live nodes."""
    from types import SimpleNamespace

    from meshsched.daemon.submission import Submission
    from meshsched.wire.protocol import SubmitRequest

    engine = SimpleNamespace(state=SimpleNamespace(gpu_types=("t4",)))
    sub = Submission(SimpleNamespace(engine=engine))
    req = SubmitRequest.from_json({"command": ["python", "t.py"], "cwd": "/", "gpus": 1, "batch_size": 48,
                                   "model": "bert"})
    assert sub.batch_warnings(req) == [batch_outside_profile(load_perf_model(), "bert", "t4", 48)]
    ok = SubmitRequest.from_json({"command": ["python", "t.py"], "cwd": "/", "gpus": 4, "batch_size": 48,
                                  "model": "bert"})
    assert sub.batch_warnings(ok) == []


def test_mesh_submit_prints_meshds_batch_warning_on_stderr(served, mesh, tmp_path):
    """Fails before: meshd computed the lines but its submit reply did not carry them."""
    perf = load_perf_model()
    gpu_type = served.engine.state.gpu_types[0]
    said = [(m, line) for m in ("resnet50", "bert", "vgg19", "transformer", "resnet18")
            if (line := batch_outside_profile(perf, m, gpu_type, 4096)) is not None]
    assert said, f"no profiled model on {gpu_type}"
    model, line = said[0]
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    r = mesh("submit", str(script), "--model", model, "--batch-size", "4096")
    assert r.exit_code == 0, r.stderr
    assert line in r.stderr
    quiet = mesh("submit", str(script))  # the default (custom model): nothing to compare with, nothing said
    assert quiet.exit_code == 0 and "profile" not in quiet.stderr
