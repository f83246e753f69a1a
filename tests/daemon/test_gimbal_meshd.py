"""A calibration step through a real meshd process (fake GPUs, a stand-in MPS control tool): the straggling rank
of a job gets fewer samples (LISS, from its ranks' reports) and the squeezed job of a shared GPU restarts with a
lower thread percentage (LGRR), both decided by `sjf-ffs+gimbal` and both visible in `mesh top --json`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.daemon import kill_sessions, poll, remove, short_dir, start_meshd

# Two ranks in step (a barrier stands for the all-reduce); rank 1's forward pass is 3x slower per sample.
STRAGGLER = '''
import os, time
import torch.distributed as dist
from meshsched import job
from meshsched.job.sampler import ElasticSampler
dist.init_process_group("gloo")
rank = int(os.environ["RANK"])
s = ElasticSampler(1_000_000, 64, world_size=2, shuffle=False)
sess = job.attach(sampler=s, rng=False)
sess.resume()
last = None
while sess.step < 100_000:
    with sess.forward_timer():
        time.sleep(0.002 * s.local_batches[rank] * (3.0 if rank == 1 else 1.0))
    dist.barrier()
    if sess.end_step():
        sess.exit()
    if s.local_batches != last:
        last = list(s.local_batches)
        print("local", last, flush=True)
'''

STEPS = '''
import os, time
from meshsched import job
sess = job.attach(rng=False)
print("mps", os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "restart", os.environ["MESH_RESTART_COUNT"], flush=True)
sess.resume()
while sess.step < 20_000:
    time.sleep(0.02)
    if sess.end_step():
        sess.exit()
'''


def mesh(env: dict, *args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "meshsched.cli.main", *args], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def top(env: dict) -> dict[str, dict]:
    """`mesh top --json`'s job rows, by job id."""
    return {j["job_id"]: j for j in json.loads(mesh(env, "top", "--json"))["jobs"]}


@pytest.mark.slow
def test_meshd_calibrates_a_straggler_by_liss_and_a_shared_gpu_by_lgrr(tmp_path, fake_control):
    runtime = short_dir()
    env = {**os.environ, "MESHD_RUNTIME_DIR": str(runtime), "MESHD_USE_MPS": "1", "MESH_REPORT_INTERVAL": "0.05"}
    proc, client = start_meshd(tmp_path / "state", runtime, "--fake-gpus", "2", "--policy", "sjf-ffs+gimbal", env=env)
    scripts = {}
    for name, code in (("straggler", STRAGGLER), ("steps", STEPS), ("filler", "import time\ntime.sleep(120)\n")):
        scripts[name] = tmp_path / f"{name}.py"
        scripts[name].write_text(code)

    def submit(script: str, *args: str) -> str:
        return mesh(env, "submit", str(scripts[script]), *args).split()[-1]

    try:
        # LISS: rank 1 reports a 3x longer forward pass; meshd moves samples off it, in-process
        s = submit("straggler", "--gpus", "2", "--model", "resnet50", "--batch-size", "64", "--iters", "100000")
        row = poll(lambda: (r := top(env).get(s)) and (r.get("exec") or {}).get("local_batches") and r,
                   timeout=40, what="LISS in mesh top")
        lb = row["exec"]["local_batches"]
        assert lb[1] < lb[0] and sum(lb) == 64 and row["exec"]["mps_percentage"] == 100
        assert row["restarts"] == 0 and row["launches"] == 1  # LISS needed no restart
        ranks = row["rank_reports"]
        # what told the straggler: rank 1's forward pass per sample (the reports in the row may come from before or
        # after the move; after it the two ranks' step times are close, which is the point of LISS)
        assert ranks["1"]["forward_time"] / lb[1] > 1.5 * ranks["0"]["forward_time"] / lb[0]
        log = tmp_path / "state" / "jobs" / s / "logs"
        poll(lambda: f"local {lb}" in (log / "rank1.log").read_text(), what="rank 1 trains with fewer samples")
        mesh(env, "cancel", s)
        poll(lambda: s not in top(env), what="the straggler gone")
        # LGRR: a3c and transformer share GPU 0 (the filler holds GPU 1); the JCT objective squeezes a3c
        a = submit("steps", "--model", "a3c", "--batch-size", "1", "--iters", "20000")
        filler = submit("filler")
        poll(lambda: top(env).get(filler, {}).get("state") == "RUNNING", what="filler running")
        b = submit("steps", "--model", "transformer", "--batch-size", "256", "--iters", "20000")
        rows = poll(lambda: (t := top(env)) and (t.get(a, {}).get("exec") or {}).get("mps_percentage", 100) < 100
                    and t[a]["state"] == "RUNNING" and t, timeout=40, what="a3c squeezed in mesh top")
        assert rows[a]["gpu_names"] == rows[b]["gpu_names"] == [0] and rows[a]["partners"] == [b]
        share = rows[a]["exec"]["mps_percentage"]
        assert share % 10 == 0 and rows[b]["exec"]["mps_percentage"] == 100
        a_log = tmp_path / "state" / "jobs" / a / "logs" / "rank0.log"
        poll(lambda: f"mps {share} restart" in a_log.read_text(), what="a3c relaunched with the lower percentage")
        assert a_log.read_text().startswith("mps 100 restart 0\n")  # its first launch had the whole GPU
        assert any(c["stdin"].startswith("terminate_client") for c in fake_control())  # MPS client ended first
    finally:
        pids = [j["supervisor_pid"] for j in client.call("GET", "/v1/jobs?all=1")]
        proc.terminate()
        proc.wait(timeout=30)
        kill_sessions(pids)
        remove(runtime)
