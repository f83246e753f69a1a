"""GPU sharing carried out by a real meshd (`--policy castor`, fake GPUs), and sim-vs-daemon parity on 10 jobs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.daemon import kill_sessions, poll, remove, short_dir, start_meshd

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def castor_meshd(tmp_path):
    runtime = short_dir()
    proc, client = start_meshd(tmp_path / "state", runtime, "--fake-gpus", "1", "--policy", "castor", "--kill-grace", "1",
                               "--node-name", "pair", env=dict(os.environ, MESHD_SYSTEMD_SCOPE="no"))
    yield client, tmp_path / "state", runtime
    pids = [j["supervisor_pid"] for j in client.call("GET", "/v1/jobs")]
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    kill_sessions(pids)
    remove(runtime)


SHOW_EXEC = (
    "import os, time\nfrom meshsched import job\ns = job.attach(rng=False)\n"
    "print('gpu', os.environ['CUDA_VISIBLE_DEVICES'], 'micro', os.environ['MESH_MICRO_BATCH'],"
    " 'accum', os.environ['MESH_ACCUM_STEPS'], 'session', s.accum_steps, flush=True)\ntime.sleep({sleep})\n"
)


def test_castor_under_meshd_shares_a_gpu_with_the_micro_batch_it_chose(castor_meshd):
    # One fake V100. A (resnet18, batch 16) trains long; B (resnet50, batch 128) arrives: Theorem 1 says sharing
    # beats waiting, with B at micro-batch 32 x 4 accumulation steps (Algorithm 2; 32 x 4 = 128, the same batch).
    client, state, runtime = castor_meshd

    def submit(model: str, batch: int, iters: int, sleep: float) -> str:
        body = {"command": [sys.executable, "-c", SHOW_EXEC.replace("{sleep}", str(sleep))], "cwd": "/tmp",
                "gpus": 1, "name": model, "model": model, "batch_size": batch, "iterations": iters}
        return client.call("POST", "/v1/jobs", body)["job_id"]

    a = submit("resnet18", 16, 20000, 60)
    poll(lambda: client.call("GET", f"/v1/jobs/{a}")["state"] == "RUNNING", what="A running")
    b = submit("resnet50", 128, 2000, 60)
    jb = poll(lambda: (j := client.call("GET", f"/v1/jobs/{b}"))["state"] == "RUNNING" and j, what="B sharing")
    ja = client.call("GET", f"/v1/jobs/{a}")
    assert jb["gpu_names"] == ja["gpu_names"] == [0]  # B's ranks start on the GPU A already holds
    assert jb["partners"] == [a] and ja["partners"] == [b]
    assert jb["exec"]["micro_batch"] == 32 and jb["exec"]["accumulation"] == 4 and jb["exec"]["mps_percentage"] == 100
    assert ja["exec"]["micro_batch"] == 16 and ja["exec"]["accumulation"] == 1
    def log(j: str) -> str:
        path = state / "jobs" / j / "logs" / "rank0.log"
        return path.read_text() if path.exists() else ""

    poll(lambda: "session" in log(a) and "session" in log(b), what="the ranks report their env")
    assert log(b).split() == ["gpu", "0", "micro", "32", "accum", "4", "session", "4"]  # the SDK trains as decided
    assert log(a).split()[:8] == ["gpu", "0", "micro", "16", "accum", "1", "session", "1"]
    env = dict(os.environ, MESH_API_SOCKET=str(runtime / "api.sock"))
    cli = lambda *args: subprocess.run([sys.executable, "-m", "meshsched.cli.main", *args], env=env,  # noqa: E731
                                       capture_output=True, text=True, check=True).stdout
    rows = {line.split()[0]: line.split() for line in cli("ls").splitlines()[1:]}
    assert rows[b][6:9] == [a, "32x4", "100"] and rows[a][6:9] == [b, "16x1", "100"]
    shown = cli("show", b)
    assert f"partners: {a}" in shown and "micro-batch x accum: 32x4" in shown and "MPS %: 100" in shown
    top = cli("top", "--once")
    assert "32x4" in top and "16x1" in top
    explain = client.call("GET", f"/v1/jobs/{b}/explain")
    assert any("share with" in e["message"] and "micro-batch 32 x 4" in e["message"] for e in explain)


def test_parity_ten_jobs_sim_vs_meshd():
    """The 10-job version of benchmarks/parity.py: a real meshd, fake_train.py, sjf and castor, ~15 s each.

    Asserted (what holds on a loaded 2-core machine): every job completes, no job ever runs twice at once, and
    both the simulator and meshd share GPUs under castor. Not asserted, only reported by the benchmark: mean JCT
    differences and start orders. Each launch costs meshd's real start-up (0.3-1 s of wall time, ~10-30 % of a
    job at this compression), which no time compression scales down, and timing on a shared CI machine is not
    something a test may assert.
    """
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "parity.py"), "--jobs", "10", "--gpus", "4",
                          "--policies", "sjf,castor", "--target-seconds", "15", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    report = {p["policy"]: p for p in json.loads(out.stdout)["policies"]}
    for p in report.values():
        assert p["jobs_completed"] == p["jobs"] == 10, p
        assert p["double_runs"] == 0, p
        # JCT differences and the start order are timing: the benchmark reports them (docs/results/parity.md), a
        # test on a shared 2-core CI machine must not assert them.
    assert report["castor"]["sim_shared_starts"] > 0 and report["castor"]["meshd_shared_starts"] > 0
