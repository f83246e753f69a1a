"""The simulator's engine learns a shared job's real step time, as meshd's does from the SDK's reports.

meshd's engine learns each job's real step time from the SDK's reports, so when a partner starts on its GPU
the engine extrapolates the slowed job at its shared rate. The simulated world sends the same event (an
IterationReport with the job's progress and true step time) whenever it re-rates a job; before it did, the
simulator's engine kept the solo estimate and Castor judged its next sharing decisions on progress that was
not there (on the 50-job slice of benchmarks/parity.py the start order then differed from meshd's from the
10th start on). This test failed before the world reported.
"""

from __future__ import annotations

import pytest

from meshsched.perf.loader import installed_handle
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.state import JobSpec, JobState


def test_the_simulators_engine_knows_a_shared_jobs_real_step_time():
    handle = installed_handle()
    perf, inter = handle.perf, handle.interference
    a = JobSpec("a", 1, "resnet18", 16, 200_000)
    b = JobSpec("b", 1, "resnet50", 128, 2_000, submit_time=10.0)  # Castor shares, with accumulation
    seen = {}

    def after(engine) -> None:
        jb = engine.state.jobs.get("b")
        if jb is not None and jb.state is JobState.RUNNING:  # the last event while both train
            assert engine.state.jobs["a"].gpus == jb.gpus
            seen["a_step"] = engine.state.jobs["a"].step_time
            seen["b_micro"] = jb.exec.micro_batch

    simulate([a, b], make_policy("castor", handle), perf, ClusterSpec(1, 1, "v100", 16384), after_event=after)
    assert seen["b_micro"] < 128
    xi_a = inter.xi("resnet18", 16, "resnet50", seen["b_micro"], "v100")[0]
    assert xi_a > 1.05
    true_step = perf.iteration_time("resnet18", "v100", (1,), 16) * xi_a  # what the world runs A at now
    assert seen["a_step"] == pytest.approx(true_step, rel=1e-6)
