"""The sharing policies' array snapshot: remaining work and GPU free times agree with the jobs themselves,
and the snapshot is rebuilt whenever the engine handled anything but a submit."""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.perf import load_perf_model
from meshsched.policies.registry import stack_of
from meshsched.policies.castor import Castor
from meshsched.policies.occupancy import Occupancy
from meshsched.state import ClusterState, JobSpec, NodeSpec

PERF = load_perf_model()


class FixedXi:
    def __init__(self, v=(1.1, 1.1)):
        self.v = v

    def xi(self, *_):
        return self.v


def _engine(xi=(1.1, 1.1)):
    eng = Engine(stack_of(Castor(perf=PERF, interference=FixedXi(xi))), ProfileEstimator(PERF), ClusterState())
    for name in ("n0", "n1"):
        eng.handle(ev.NodeJoined(f"join-{name}", NodeSpec(name, 4, "v100", 16384)), 0.0)
    return eng


def _occ(eng):
    return Occupancy(eng.state, eng.view().holding(), lambda j: j.step_time or j.ideal_step_time, lambda j: (j.spec.model,))


def test_remaining_and_free_times_match_the_jobs():
    eng = _engine()
    for i, (gpus, iters) in enumerate(((4, 50_000), (2, 3_000), (1, 900))):
        eng.handle(ev.JobSubmitted(f"s{i}", JobSpec(f"j{i}", gpus, "resnet18", 64 * gpus, iters, submit_time=0.0)), 0.0)
    eng.handle(ev.JobStarted("st0", "j0"), 20.0)
    eng.handle(ev.JobStarted("st1", "j1"), 25.0)  # j2 still loading
    occ = _occ(eng)
    now = 60.0
    left = dict(zip((j.job_id for j in occ.jobs), occ.remaining_iters(now)))
    for jid in ("j0", "j1", "j2"):
        job = eng.state.jobs[jid]
        assert left[jid] == pytest.approx(job.spec.iterations - job.iterations_at(now))
    mat = occ.free_times(now)
    assert mat.shape == (2, 4)
    ends = sorted(eng.state.jobs[j].remaining_time(now) for j in ("j0", "j1", "j2"))
    finite = sorted(set(mat.ravel()) - {0.0})
    assert finite == pytest.approx(ends)  # each job's GPUs come free when it ends; the free GPU at once
    assert (mat == 0.0).sum() == 1
    assert {h.job.job_id for h in occ.hosts} == {"j0", "j1", "j2"}


def test_snapshot_is_rebuilt_after_any_event_but_a_submit():
    eng = _engine(xi=None)  # no pair may share
    eng.handle(ev.JobSubmitted("s0", JobSpec("a", 1, "resnet18", 64, 1_000, submit_time=0.0)), 0.0)
    occ = _occ(eng)
    assert occ.current(eng.state)
    eng.handle(ev.JobSubmitted("s1", JobSpec("b", 8, "resnet18", 512, 1_000, submit_time=1.0)), 1.0)
    assert eng.state.jobs["b"].state.is_queued  # a submit that starts nothing changes no holder
    assert occ.current(eng.state)
    eng.handle(ev.JobStarted("st", "a"), 2.0)  # progress is now extrapolated: stale
    assert not occ.current(eng.state)
    assert not _occ(eng).current(ClusterState())  # never describes another state
