"""Gimbal's calibration layer computes each evaluation once per search (issue 26, speed): a calibration asked
again, a drain stage, a worker's step under the same settings; and it finds a job's packing set from the GPUs'
holders instead of every job holding GPUs. Each shortcut must give the decisions of the full path: a replay
with the memo and one without it (`GimbalCalibration.memo = False`, every evaluation from scratch) must decide
the same, and the packing set must be the one the walk over every holding job finds."""

from __future__ import annotations

from functools import cache

import pytest

from meshsched.loaders.profiles import installed_handle, load_mps_share, load_perf_model
from meshsched.loaders.traces import TraceOptions, load_trace
from meshsched.perf.mps_share import ShareCurve
from meshsched.policies import gimbal_policy
from meshsched.policies.gimbal import (
    Calibration,
    JobCalibration,
    PackedJob,
    WorkerSetting,
)
from meshsched.policies.gimbal_policy import GimbalCalibration, JobPerf
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.state import JobState


@cache
def _workload():
    perf = load_perf_model()
    tr = load_trace("philly", perf, TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, first_n=60, load=3.0))
    return perf, tuple(tr.jobs)


def _reference_members(view, job):
    """The packing set as the layer found it before: a walk over every job holding GPUs."""
    on_gpu: dict = {}
    for j in view.holding():
        if j.state is JobState.RUNNING:
            for g in j.gpus:
                on_gpu.setdefault(g, []).append(j)
    seen, todo = {job.job_id: job}, [job]
    while todo:
        j = todo.pop()
        for g in j.gpus:
            for o in on_gpu.get(g, ()):
                if o.job_id not in seen:
                    seen[o.job_id] = o
                    todo.append(o)
    return [seen[k] for k in sorted(seen)]


def _replay(spec: str, memo: bool, check_members: bool = False):
    perf, jobs = _workload()
    stack = make_policy(spec, installed_handle(1, True, False, perf))
    assert isinstance(stack.calibration, GimbalCalibration)
    stack.calibration.memo = memo
    reconfigured: list[tuple] = []
    shared = [0]

    def watch(engine):
        view = engine.view()
        for job in view.holding():
            if job.exec_pending is not None:
                reconfigured.append((job.job_id, job.exec_pending))
            if check_members and job.state is JobState.RUNNING:
                got = GimbalCalibration._packing_members(view, job)
                assert [j.job_id for j in got] == [j.job_id for j in _reference_members(view, job)]
                shared[0] += len(got) > 1

    r = simulate(jobs, stack, perf, ClusterSpec(2, 8, "v100", perf.gpu_memory_mb("v100")), after_event=watch)
    out = {j.job_id: (j.state, j.acct.run_time, j.exec, j.calibration) for j in r.engine.state.jobs.values()}
    return out, reconfigured, shared[0]


@pytest.mark.slow
def test_the_memo_decides_what_every_evaluation_from_scratch_decides():
    fast, fast_log, shared = _replay("castor+lazer+gimbal", memo=True, check_members=True)
    full, full_log, _ = _replay("castor+lazer+gimbal", memo=False)
    assert shared > 0  # packing sets of several jobs were calibrated (the memo had something to keep)
    searched = [m for _s, _t, _x, m in fast.values() if m is not None and m.searches > 0]
    assert searched and any(m.lgrr_changes for m in searched)  # Algorithm 1 ran and squeezed somebody
    assert fast_log == full_log  # every Reconfigure, in order, with its settings
    assert fast == full  # every job's end, run time, settings and calibration memo (its predicted step too)


def _set():
    """A 2-GPU job sharing one GPU with a 1-GPU job, as `_calibrate_set` builds them."""
    big = PackedJob("big", (("n", 0), ("n", 1)), 500.0, 0.9)
    small = PackedJob("small", (("n", 0),), 300.0, 0.4)
    perf_of = {"big": JobPerf(0.02, 0.004, ShareCurve(0.9)), "small": JobPerf(0.01, 0.003, ShareCurve(0.4))}
    return [big, small], perf_of


def _cal(big_share: int, small_share: int, big_samples=(32, 32), small_samples=(16,)) -> Calibration:
    return Calibration((JobCalibration("big", tuple(WorkerSetting(big_share, b) for b in big_samples)),
                        JobCalibration("small", tuple(WorkerSetting(small_share, b) for b in small_samples))))


def _model():
    return load_mps_share()


def test_a_worker_step_kept_for_one_setting_is_not_given_to_another():
    """The worker-step memo is keyed by the worker's samples and share and its partner's share: a memo that
    forgot the partner's share (or the samples) would hand a squeezed partner's figure to a full one."""
    packed, perf_of = _set()
    model = _model()

    def xi(a, b):
        return 1.6 if a == "big" else 1.3

    cache_: dict = {}
    cals = [_cal(s, t, b) for s in (100, 70, 40) for t in (100, 50, 10) for b in ((32, 32), (40, 24))]
    for cal in cals:
        for active in (packed, packed[:1], packed[1:]):
            kept = gimbal_policy._runtime(active, perf_of, xi, model, cal, cache_)
            fresh = gimbal_policy._runtime(active, perf_of, xi, model, cal)
            assert kept.worker_step_s == fresh.worker_step_s, (cal, [j.job for j in active])
    steps = {gimbal_policy._runtime(packed, perf_of, xi, model, c).worker_step_s[packed[0].workers()[0]]
             for c in cals}
    assert len(steps) > 3  # the settings do move the shared worker's step: the key must tell them apart


def test_drain_stages_kept_across_calibrations_give_the_fresh_drain():
    packed, perf_of = _set()
    model = _model()

    def xi(a, b):
        return 1.5

    def runtime_of(active, cal):
        return gimbal_policy._runtime(active, perf_of, xi, model, cal)

    stages: dict = {}
    for cal in (_cal(100, 100), _cal(100, 50), _cal(80, 30, (40, 24)), _cal(100, 100), _cal(100, 50)):
        first = runtime_of(packed, cal)
        assert gimbal_policy._drain(packed, cal, first, runtime_of, stages) == \
            gimbal_policy._drain(packed, cal, first, runtime_of)
    assert stages  # later stages were kept (and reused by the repeated calibrations)


def test_one_share_per_job_returns_an_equal_calibration():
    for cal in (_cal(100, 50), _cal(70, 70, (40, 24))):
        assert gimbal_policy._one_share_per_job(cal) == cal
    mixed = Calibration((JobCalibration("big", (WorkerSetting(100, 32), WorkerSetting(60, 32))),))
    assert gimbal_policy._one_share_per_job(mixed).jobs[0].settings == (WorkerSetting(60, 32), WorkerSetting(60, 32))
