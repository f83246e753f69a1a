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

from meshsched.loaders.profiles import installed_handle
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


def _shared_pair():
    """A (resnet18) trains alone, then B (resnet50) shares its one GPU under Castor; A reports its shared step."""
    from meshsched import events as ev
    from meshsched.engine import Engine
    from meshsched.estimate import ProfileEstimator
    from meshsched.state import NodeSpec

    handle = installed_handle()
    eng = Engine(make_policy("castor", handle), ProfileEstimator(handle.perf))
    eng.handle(ev.NodeJoined("n", NodeSpec("n", 1, "v100", 16384)), 0.0)
    eng.handle(ev.JobSubmitted("sa", JobSpec("a", 1, "resnet18", 16, 200_000)), 0.0)
    eng.handle(ev.JobStarted("la", "a"), 1.0)
    eng.handle(ev.JobSubmitted("sb", JobSpec("b", 1, "resnet50", 128, 2_000, submit_time=10.0)), 10.0)
    assert eng.state.jobs["b"].gpus == eng.state.jobs["a"].gpus  # Castor shares
    eng.handle(ev.JobStarted("lb", "b"), 11.0)
    eng.handle(ev.IterationReport("ra", "a", 1000.0, 0.5, measured_for=5.0), 20.0)  # A's step next to B
    return eng, ev


def test_a_partner_leaving_drops_the_step_time_measured_next_to_it():
    # When B ends, A trains alone from then on: the engine must not keep judging A (Castor's t_A, progress) by
    # the step time it reported while B slowed it. Before the fix A kept 0.5 s until its next report, and a
    # report measured partly next to B (meshd's SDK averages the steps since its last frame) replaced it again.
    eng, ev = _shared_pair()
    a = eng.state.jobs["a"]
    eng.handle(ev.JobFinished("fb", "b"), 30.0)
    alone = eng.estimator.step_time(a.spec, "v100", (1,), a.exec)
    assert a.step_time == pytest.approx(alone) and alone < 0.4
    assert a.done_iterations == pytest.approx(1000.0 + 10.0 / 0.5)  # banked at the shared rate up to B's end
    eng.handle(ev.IterationReport("ra2", "a", 1030.0, 0.45, measured_for=2.0), 31.0)  # steps from 29 s on: mixed
    assert a.step_time == pytest.approx(alone) and a.done_iterations == 1030.0
    eng.handle(ev.IterationReport("ra3", "a", 1060.0, 0.25, measured_for=0.5), 31.5)  # measured after B left
    assert a.step_time == 0.25


def test_a_partner_starting_drops_the_step_time_measured_before_it():
    eng, ev = _shared_pair()
    a = eng.state.jobs["a"]
    assert a.rate_since == 11.0  # B began training next to A
    eng.handle(ev.IterationReport("ra2", "a", 1010.0, 0.2, measured_for=15.0), 22.0)  # from 7 s: partly alone
    assert a.step_time == 0.5
