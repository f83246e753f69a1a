"""Bad input on the calibration path: a per-rank report with impossible figures is refused with an error reply
(protocol.check_report) and moves no calibration; the same job's true reports still do."""

from __future__ import annotations

import math

import pytest

from meshsched.wire.protocol import (
    REPORT_SLACK_S,
    ProtocolError,
    ReportContext,
    ReportRefused,
    check_report,
    decode_body,
    encode_frame,
)

TWO = ReportContext(world_size=2)
AFTER_10 = ReportContext(world_size=2, last_iterations=10.0, elapsed_s=1.0)  # rank said step 10 one second ago


@pytest.mark.parametrize("figures,ctx", [
    ((10.0, 0.1, 0, 0.05), TWO),  # a first report
    ((10.0, 0.1, None, None), TWO),  # the old rank-less report (JobClient.report)
    ((0.0, 0.0, 1, 0.0), TWO),  # nothing done yet
    ((10.0, 0.1, 1, 0.1), AFTER_10),  # the same step again (a ping-like flush)
    ((40.0, 0.1, 1, 0.05), AFTER_10),  # 30 steps of 0.1 s in 1 s: the steps may have begun before the last flush
    ((10_000.0, 1e-5, 1, None), AFTER_10),  # fast steps
    ((12.0, 0.5, 1, None), ReportContext(2, 10.0, 0.0)),  # two steps, reported as fast as the socket goes
])
def test_possible_reports_pass(figures, ctx):
    check_report(*figures, ctx)


@pytest.mark.parametrize("figures,ctx,why", [
    ((10.0, -0.1, 0, None), TWO, "step_time must be a finite number >= 0"),
    ((10.0, math.nan, 0, None), TWO, "step_time must be a finite number >= 0"),
    ((10.0, math.inf, 0, None), TWO, "step_time must be a finite number >= 0"),
    ((math.nan, 0.1, 0, None), TWO, "iterations must be"),
    ((-1.0, 0.1, 0, None), TWO, "iterations must be"),
    ((10.0, 0.1, 0, -0.01), TWO, "forward_time must be"),
    ((10.0, 0.1, 0, 0.2), TWO, "longer than the whole step"),
    ((10.0, 0.1, 2, None), TWO, r"rank 2 is outside the job \(ranks 0..1\)"),
    ((10.0, 0.1, -1, None), TWO, "rank -1 is outside"),
    ((10.0, 0.1, 1.5, None), TWO, "rank must be an integer"),
    ((9.0, 0.1, 1, None), AFTER_10, "goes back from the 10"),
    ((1e6, 0.1, 1, None), AFTER_10, "from the future"),
    ((10.0 + (2 * (1.0 + 3.0) + REPORT_SLACK_S) / 3.0 + 1, 3.0, 1, None), AFTER_10, "from the future"),
])
def test_impossible_reports_are_refused_in_one_line(figures, ctx, why):
    with pytest.raises(ReportRefused, match=why) as info:
        check_report(*figures, ctx)
    assert "\n" not in str(info.value) and str(info.value).startswith("report refused: ")
    assert isinstance(info.value, ProtocolError)  # a JobClient sees it as meshd's refusal (ValueError)


def test_a_fractional_rank_is_refused_when_the_frame_is_decoded():
    body = encode_frame({"type": "report", "iterations": 3, "step_time": 0.1, "rank": 1.5})[4:]
    with pytest.raises(ProtocolError, match="rank must be an integer"):
        decode_body(body)
    whole = encode_frame({"type": "report", "iterations": 3, "step_time": 0.1, "rank": 1.0})[4:]
    assert decode_body(whole)["rank"] == 1


# -- through meshd's job socket (in-process daemon, real job processes) ------------------------------------

RANKS = r'''
import json, os, sys, time
from pathlib import Path
from meshsched.job.client import JobClient
from meshsched.wire.protocol import ProtocolError

rank, flags = int(os.environ["RANK"]), Path(sys.argv[1])
c = JobClient.from_env()
c.request({"type": "hello", "rank": rank, "sdk": 1})

def send(**figures):
    try:
        reply = c.request({"type": "report", "rank": rank, **figures})
    except ProtocolError as exc:
        print("refused:", exc, flush=True)
        return
    print("ok", json.dumps(reply.get("directives") or []), flush=True)

send(iterations=1.0, step_time=0.1, forward_time=0.05)
if rank == 1:  # a straggler's figures, each of them impossible: none may move the calibration
    send(iterations=2.0, step_time=0.6, forward_time=0.5, rank=7)
    send(iterations=0.0, step_time=0.6, forward_time=0.5)
    send(iterations=1e6, step_time=0.6, forward_time=0.5)
    send(iterations=2.0, step_time=0.06, forward_time=0.5)
    (flags / "bad-done").touch()
while not (flags / "go").exists():
    time.sleep(0.02)
step, slow = 1, 5.0 if rank == 1 else 1.0  # true figures now: rank 1 straggles 5x
while not (flags / "stop").exists():
    step += 1
    send(iterations=float(step), step_time=0.1 * slow, forward_time=0.05 * slow)
    time.sleep(0.05)
'''


async def test_meshd_refuses_impossible_reports_and_moves_no_calibration(tmp_path):
    from meshsched.daemon.node import NodeDaemon

    from meshsched.wire.protocol import SubmitRequest
    from tests.support.daemon import (
        kill_sessions,
        make_config,
        py,
        remove,
        short_dir,
        wait_for,
    )

    runtime = short_dir()
    d = NodeDaemon(make_config(tmp_path / "state", runtime, gpus=2, policy="sjf+gimbal"))
    await d.start()
    flags = tmp_path / "flags"
    flags.mkdir()
    try:
        rec = d.submit(SubmitRequest(command=[*py(RANKS), str(flags)], cwd="/tmp", gpus=2, batch_size=128,
                                     iterations=100_000, model="resnet50"), "u")
        logs = [d.config.jobs_dir / rec.job_id / "logs" / f"rank{r}.log" for r in (0, 1)]
        await wait_for(lambda: (flags / "bad-done").exists() and logs[0].exists() and "ok" in logs[0].read_text(),
                       what="the bad reports sent")
        lines = logs[1].read_text().splitlines()
        assert lines[0].startswith("ok")
        assert [x.split(":", 2)[2].strip().split(" ")[0:2] for x in lines[1:5]] == [
            ["rank", "7"], ["step", "0"], ["step", "1e+06"], ["forward_time", "0.5"]], lines
        job = d.engine.state.jobs[rec.job_id]
        # what rank 1 said before its impossible reports is all that meshd holds of it; nothing moved
        assert d.throughput[rec.job_id][1]["iterations"] == 1.0 and d.throughput[rec.job_id][1]["step_time"] == 0.1
        assert job.rank_step_times in ((), (0.05, 0.05))
        assert job.exec_pending is None and (job.exec is None or job.exec.local_batches is None)
        assert not any(x.get("kind") == "calibrate" for x in d.directives.get(rec.job_id, []))
        # the connection was kept, and the straggler's true figures do move samples off it (LISS)
        (flags / "go").touch()
        await wait_for(lambda: job.exec is not None and job.exec.local_batches is not None, timeout=20,
                       what="LISS from the true reports")
        assert job.exec.local_batches[1] < job.exec.local_batches[0] and sum(job.exec.local_batches) == 128
        # applied when rank 0 collects it, just before the reply that carries it is written: wait for the print
        await wait_for(lambda: "local_batches" in logs[0].read_text(), what="the calibrate directive at rank 0")
    finally:
        (flags / "stop").touch()
        pids = [r.supervisor_pid for r in d.records.values()]
        await d.close()
        kill_sessions(pids)
        remove(runtime)
