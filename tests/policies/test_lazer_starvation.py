"""A multi-GPU job must not starve behind a stream of 1-GPU jobs under Lazer (issue 26, point 5).

Lazer used to consider preemption only when a job arrived (and when its deferral ended): a 4-GPU job that found
only shorter jobs running waited in WQ, and on every release the longer 1-GPU jobs queued behind it took the GPU
that came free, so its node never drained. Plain SRTF re-decides on every pass; Lazer now runs its orchestrator
(Algorithm 2, with its deferral) on a release for the first queued job SRTF would run that cannot start."""

from __future__ import annotations

import pytest

from meshsched.policies.lazer_opt import OptimizerConfig
from meshsched.policies.registry import make_policy
from meshsched.policies.stack import PolicyHandle
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.state import JobSpec
from tests.support.fakes import LinearPerf


def _spec(job_id: str, gpus: int, seconds: int, submit: float, model: str = "m") -> JobSpec:
    return JobSpec(job_id, gpus, model, 100 * gpus, seconds, submit_time=submit)


def _stream() -> list[JobSpec]:
    """1 node x 4 GPUs: four short 1-GPU jobs run; `big` (4 GPUs, 1,000 s) arrives when all are shorter than it
    (nothing to preempt); then 1-GPU jobs of 5,000 s, longer than `big`, keep coming."""
    jobs = [_spec(f"s{i}", 1, 100 * (i + 1), 0.0) for i in range(4)]
    jobs.append(_spec("big", 4, 1000, 1.0))
    jobs += [_spec(f"l{i:02d}", 1, 5000, 2.0 + 50.0 * i) for i in range(24)]
    return jobs


@pytest.mark.parametrize("policy", ["lazer", "srtf"])
def test_a_multi_gpu_job_is_not_starved_by_longer_one_gpu_jobs(policy):
    perf = LinearPerf(10.0, 5.0)
    r = simulate(_stream(), make_policy(policy, PolicyHandle(perf=perf)), perf, ClusterSpec(1, 4, "fake", 16384),
                 after_event=lambda e: e.state.validate())
    jobs = r.engine.state.jobs
    assert all(j.acct.finish_time is not None for j in jobs.values())
    # Before: `big` started only once the stream had drained (> 20,000 s). Now once the longer 1-GPU jobs that
    # took the freed GPUs can be preempted (the last short job ends at ~410 s), plus a deferral (at most the
    # optimiser's upper bound), a pause and a load.
    bound = 410.0 + OptimizerConfig().high_s + 100.0
    assert jobs["big"].acct.first_start <= bound, jobs["big"].acct.first_start



@pytest.mark.parametrize("policy", ["lazer", "castor+lazer", "srtf"])
def test_the_same_with_measured_models_and_loads(policy):
    """The same stream with a profiled model (V100, Lazer's measured load times: a load is longer than the gap
    between releases, so the longer jobs are still loading when the last short one ends). Before: lazer started
    `big` at ~31,000 s (srtf: ~530 s)."""
    from meshsched.loaders.profiles import installed_handle, load_perf_model

    perf = load_perf_model(overheads="lazer")
    step = 0.0699  # s per iteration of transformer at batch 16 per GPU on one V100 (the profile)
    jobs = [JobSpec(j.job_id, j.gpus, "transformer", 16 * j.gpus, int(j.iterations / step), submit_time=j.submit_time)
            for j in _stream()]
    r = simulate(jobs, make_policy(policy, installed_handle(1, True, False, perf)), perf,
                 ClusterSpec(1, 4, "v100", perf.gpu_memory_mb("v100")), after_event=lambda e: e.state.validate())
    big = r.engine.state.jobs["big"]
    assert big.acct.first_start is not None and big.acct.first_start <= 1500.0, big.acct.first_start
