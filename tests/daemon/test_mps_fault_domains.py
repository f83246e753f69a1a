"""meshd under MPS (the stand-in control tool): a shared GPU is one fault domain (issue 24, point 6). The MPS
daemon of a shared GPU dying, or one partner faulting it, requeues the innocent job uncharged."""

from __future__ import annotations

import pytest
from meshsched.daemon import faultwatch
from meshsched.daemon.node import NodeDaemon
from meshsched.state import JobState
from meshsched.wire.protocol import SubmitRequest
from tests.support.daemon import (
    daemon_with_mps,
    kill_sessions,
    make_config,
    py,
    remove,
    short_dir,
    wait_for,
)
from tests.support.fakes import kill_mps_server


def shared_gpu(state):
    """A meshd on one fake GPU under MPS (the stand-in) with a sharing placement."""
    return daemon_with_mps(state, 1, policy="sjf-ffs")


def submit_pair(d, code_a: str, code_b: str) -> tuple[str, str]:
    """a3c and transformer sharing GPU 0 (sjf-ffs), both running."""
    a = d.submit(SubmitRequest(command=py(code_a), cwd="/tmp", gpus=1, model="a3c", batch_size=1, iterations=20000),
                 "u").job_id
    b = d.submit(SubmitRequest(command=py(code_b), cwd="/tmp", gpus=1, model="transformer", batch_size=256,
                               iterations=20000), "u").job_id
    return a, b


def running(d, job_id: str) -> bool:
    return d.records[job_id].state == "RUNNING" and d.launcher.running(job_id)


def told(d, job_id: str) -> list[str]:
    return [e.message for e in d.engine.explain(job_id)]


SLEEP = "import time; time.sleep(120)"


@pytest.mark.slow  # the first meshd of a run with a sharing policy loads the interference models (~10 s)
async def test_a_dead_mps_server_requeues_both_jobs_uncharged_and_restarts_the_server(tmp_path, fake_control,
                                                                                       monkeypatch):
    monkeypatch.setattr(faultwatch, "WATCH_S", 0.1)
    async with shared_gpu(tmp_path / "state") as d:
        a, b = submit_pair(d, SLEEP, SLEEP)
        await wait_for(lambda: running(d, a) and running(d, b), what="a and b sharing GPU 0")
        assert d.engine.state.gpus[0].jobs == [a, b]
        restarts = {j: d.records[j].restarts for j in (a, b)}
        kill_mps_server(d.mps.pipe_dir(0))
        await wait_for(lambda: any(running(d, j) for j in (a, b)) and d.engine.state.gpus[0].jobs != [a, b]
                       and not (d.mps.pipe_dir(0) / "dead").exists(), what="one of them relaunched", timeout=30)
        first = next(j for j in (a, b) if running(d, j))
        second = b if first == a else a
        for j in (a, b):
            assert d.records[j].state != "FAILED"
            assert "requeued uncharged: MPS server of GPU 0 died" in "\n".join(told(d, j))
        assert d.records[first].restarts == restarts[first]  # the relaunch is not a restart charged to it
        job = d.engine.state.jobs[second]
        assert job.state is JobState.PREEMPTED and job.restarts + 1 == restarts[second]
        assert d.records[second].reason.startswith("requeued uncharged: MPS server of GPU 0 died")  # mesh show
        assert d.engine.state.gpus[0].jobs == [first]
        assert [c["argv"] for c in fake_control()].count(["-d"]) == 2  # its MPS daemon was started again


async def test_a_partner_faulting_the_gpu_fails_alone_and_its_partner_is_requeued_uncharged(tmp_path, fake_control,
                                                                                            monkeypatch):
    monkeypatch.setattr(faultwatch, "WATCH_S", 3600.0)  # the daemon lives: only the exits tell
    go = tmp_path / "go"
    wait = f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
    culprit = wait + "print('RuntimeError: CUDA error: an illegal memory access was encountered', flush=True)\nsys.exit(1)"
    victim = wait + ("time.sleep(0.3)\nprint('RuntimeError: CUDA error: the MPS client has been terminated by the "
                     "server', flush=True)\nsys.exit(1)")
    async with shared_gpu(tmp_path / "state") as d:
        a, b = submit_pair(d, culprit, victim)
        await wait_for(lambda: running(d, a) and running(d, b), what="a and b sharing GPU 0")
        restarts = d.records[b].restarts
        go.write_text("")
        await wait_for(lambda: d.records[a].state == "FAILED" and running(d, b), what="a failed, b relaunched",
                       timeout=30)
        assert "illegal memory access" in d.records[a].reason
        assert d.records[b].restarts == restarts and d.records[b].state == "RUNNING"
        assert f"requeued uncharged: partner job {a} faulted GPU 0" in "\n".join(told(d, b))
        assert not d.engine.state.jobs[b].may_pair(d.engine.state.jobs[a])


@pytest.mark.parametrize("mps", [True, False])
async def test_a_fault_whose_partner_lives_on_is_an_ordinary_failure(tmp_path, fake_control, monkeypatch, mps):
    monkeypatch.setattr(faultwatch, "WINDOW_S", 0.5)
    code = "import sys, time; time.sleep(0.5); print('CUDA error: unspecified launch failure', flush=True); sys.exit(3)"
    runtime = short_dir()
    d = NodeDaemon(make_config(tmp_path / "state", runtime, gpus=1, use_mps=mps, policy="sjf-ffs"))
    await d.start()
    try:
        a, b = submit_pair(d, code, SLEEP)
        await wait_for(lambda: d.records[a].state == "FAILED", what="a failed", timeout=30)
        assert "unspecified launch failure" in d.records[a].reason and running(d, b)
        assert d.records[b].restarts == 1 and not any("uncharged" in m for m in told(d, b))
    finally:
        pids = [r.supervisor_pid for r in d.records.values()]
        await d.close()
        kill_sessions(pids)
        remove(runtime)
