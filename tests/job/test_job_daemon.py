"""meshd's side of meshsched.job, in-process: reports, directives, cooperative preemption, the grace period."""

from __future__ import annotations

import sys

import pytest
from meshsched.daemon.node import NodeDaemon

from meshsched.wire.exitcodes import PREEMPTED_EXIT_CODE
from meshsched.wire.protocol import (
    ProtocolError,
    SubmitRequest,
    decode_body,
    encode_frame,
)
from tests.support.daemon import JOB, kill_sessions, make_config, py, wait_for


def submit(d, command, gpus, iters, **kw):
    return d.submit(SubmitRequest(command=command, cwd="/tmp", gpus=gpus, iterations=iters,
                                  env={"MESH_REPORT_INTERVAL": "0.05"}, **kw), "tester")


def test_report_fields_are_validated():
    body = encode_frame({"type": "report", "iterations": 3, "step_time": 0.1, "rank": 1, "samples": 8.0})[4:]
    assert decode_body(body)["samples"] == 8.0
    with pytest.raises(ProtocolError, match="samples"):
        decode_body(encode_frame({"type": "report", "iterations": 3, "step_time": 0.1, "samples": -1})[4:])
    assert PREEMPTED_EXIT_CODE == 75


async def test_cooperative_preemption_checkpoints_at_a_step_and_resumes(dirs, tmp_path):
    d = NodeDaemon(make_config(*dirs, gpus=1, policy="srtf", preempt_grace=30.0))
    await d.start()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    try:
        long = submit(d, [sys.executable, str(script)], 1, 1000)
        await wait_for(lambda: d.listings.job_view(long).get("samples_per_second", 0) > 0, what="throughput reported")
        assert long.job_id in d.sdk_jobs and d.listings.job_view(long)["rank_reports"]["0"]["step_time"] > 0
        short = submit(d, py("pass"), 1, 1)
        assert long.state == "PAUSING"
        await wait_for(lambda: short.state == "COMPLETED", what="short job done")
        await wait_for(lambda: long.state == "COMPLETED", what="long job resumed and done")
        hist = [s for _, s, _ in d.journal.history(long.job_id)]
        assert hist[:5] == ["PENDING", "LOADING", "RUNNING", "PAUSING", "PREEMPTED"]
        log = (d.config.jobs_dir / long.job_id / "logs" / "rank0.log").read_text()
        stopped = int(log.split("exit at ")[1].split()[0])
        assert "checkpoint-and-exit requested by meshd" in log  # the directive, not SIGTERM
        assert f"resumed at {stopped}" in log and f"done 300 {sum(range(300))}" in log
        assert 0 < stopped < 300 and long.checkpoint_iterations >= stopped
        assert long.job_id not in d.throughput  # forgotten with the run
    finally:
        pids = [r.supervisor_pid for r in d.records.values()]
        await d.close()
        kill_sessions(pids)


async def test_a_job_that_ignores_the_directive_is_terminated_after_the_grace_period(dirs):
    d = NodeDaemon(make_config(*dirs, gpus=1, policy="srtf", preempt_grace=0.2))
    await d.start()
    code = ("import os, sys, time\nfrom meshsched.job.client import JobClient\n"
            "if os.environ['MESH_RESTART_COUNT'] != '0': sys.exit(0)\n"
            "c = JobClient.from_env()\nc.request({'type': 'hello', 'sdk': 1, 'rank': 0})\n"
            "print('ready', flush=True)\ntime.sleep(60)\n")
    try:
        long = submit(d, py(code), 1, 1000)
        await wait_for(lambda: long.job_id in d.sdk_jobs, what="job said hello")
        submit(d, py("pass"), 1, 1)
        assert long.state == "PAUSING" and d.directives[long.job_id] == [{"kind": "checkpoint_exit"}]
        await wait_for(lambda: long.state == "COMPLETED", what="terminated, requeued, done")
        assert "PREEMPTED" in [s for _, s, _ in d.journal.history(long.job_id)]
    finally:
        pids = [r.supervisor_pid for r in d.records.values()]
        await d.close()
        kill_sessions(pids)


async def test_a_resumable_exit_without_preemption_requeues_without_a_failure(dirs):
    d = NodeDaemon(make_config(*dirs))
    await d.start()
    code = f"import os, sys\nsys.exit({PREEMPTED_EXIT_CODE} if os.environ['MESH_RESTART_COUNT'] == '0' else 0)\n"
    try:
        rec = submit(d, py(code), 1, 10)
        await wait_for(lambda: rec.state == "COMPLETED", what="requeued and done")
        assert rec.restarts >= 1 and "FAILED" not in [s for _, s, _ in d.journal.history(rec.job_id)]
    finally:
        pids = [r.supervisor_pid for r in d.records.values()]
        await d.close()
        kill_sessions(pids)
