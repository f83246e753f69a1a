"""The sharing policies' array snapshot: remaining work and GPU free times agree with the jobs themselves,
and the snapshot is rebuilt whenever the engine handled anything but a submit."""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import load_perf_model
from meshsched.policies.castor import Castor
from meshsched.policies.occupancy import Occupancy
from meshsched.policies.registry import stack_of
from meshsched.state import ClusterState, JobSpec, NodeSpec
from tests.support.occupancy import snapshot as _snapshot

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
    left = occ.remaining_iters(now)
    for jid in ("j0", "j1", "j2"):
        job = eng.state.jobs[jid]
        assert left[occ.row(jid)] == pytest.approx(job.spec.iterations - job.iterations_at(now))
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


def test_refreshed_snapshot_equals_a_fresh_build_after_every_event():
    """The sharing policies keep one snapshot and refresh it from the state's change log; after every event of
    a busy replay with sharing, it reads exactly as one built from scratch."""
    from meshsched.loaders.profiles import installed_handle, load_interference
    from meshsched.loaders.traces import TraceOptions, load_trace
    from meshsched.policies.registry import make_policy
    from meshsched.sim.loop import ClusterSpec, simulate

    tr = load_trace("philly", PERF, TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, first_n=300, load=2.0))
    inter = load_interference()

    def group(j):
        return (j.spec.model, j.exec.micro_batch if j.exec else 0)

    kept = {}
    checked = [0]

    def check(eng):
        occ = kept.get("occ")
        if occ is None:
            occ = kept["occ"] = Occupancy(eng.state, eng.view().holding(), lambda j: j.step_time or j.ideal_step_time, group)
        occ.refresh(eng.view().holding())
        assert occ.current(eng.state)
        fresh = Occupancy(eng.state, eng.view().holding(), lambda j: j.step_time or j.ideal_step_time, group)
        now = max((j.since for j in eng.state.jobs.values()), default=0.0) + 7.0
        assert _snapshot(occ, now) == _snapshot(fresh, now)
        checked[0] += 1

    r = simulate(tr.jobs, make_policy("castor", installed_handle()), PERF, ClusterSpec(4, 8, "v100", 16384), interference=inter,
                 after_event=check)
    assert checked[0] == r.events
    assert r.engine.policy.placement.share_log  # jobs did share GPUs, so hosts came and went


def test_change_log_names_the_jobs_or_says_it_cannot():
    st = ClusterState()
    st.add_node(NodeSpec("n0", 2, "v100", 16384))
    v = st.version
    assert st.changed_since(v) == set()
    st.touch("a")
    st.touch("b")
    st.touch("a")
    assert st.changed_since(v) == {"a", "b"}
    assert st.changed_since(v + 2) == {"a"}
    st.touch(None)  # anything may have changed
    assert st.changed_since(v) is None
    w = st.version
    st.version += 1  # bumped by hand: the log cannot tell what changed
    assert st.changed_since(w) is None
    u = st.version
    for i in range(5000):
        st.touch(f"j{i}")
    assert st.changed_since(u) is None  # older than the log
    assert st.changed_since(st.version - 3) == {"j4999", "j4998", "j4997"}


def test_demand_ahead_matches_a_walk_of_the_queue():
    """ClusterView.demand_ahead (the engine keeps the queue's GPU demands) equals summing while walking, with jobs
    larger than the cluster left out, as jobs are queued and dequeued."""
    from meshsched.policies.base import ClusterView

    eng = _engine(xi=None)
    sizes = [1, 16, 2, 8, 4, 1, 64, 2, 8, 3]  # the cluster has 8 GPUs: 16 and 64 never fit
    for i, g in enumerate(sizes):
        eng.handle(ev.JobSubmitted(f"s{i}", JobSpec(f"q{i}", g, "resnet18", 64 * g, 500_000 - i, submit_time=float(i))),
                   float(i))
    eng.handle(ev.CancelRequested("c", "q3"), 20.0)

    def walked(view, job_id):
        n = 0
        for j in view.queue():
            if j.job_id == job_id:
                return n
            n += j.spec.gpus if j.spec.gpus <= view.total_gpus else 0
        raise KeyError(job_id)

    view = eng.view()
    plain = ClusterView(eng.state, eng.waiting.entries, {}, eng.waiting.sizes)  # no demands kept: walks
    queued = [j.job_id for j in view.queue()]
    assert len(queued) >= 5
    for jid in queued:
        assert view.demand_ahead(jid) == walked(view, jid) == plain.demand_ahead(jid)


def test_eviction_by_a_preemption_layer_reaches_the_snapshot():
    """castor+srtf: SRTF evicts a running job in the pass in which Castor's snapshot was read. The eviction must be
    in the state's change log, or the snapshot keeps the job (now saving a checkpoint) as a host a newcomer
    could share until some later event (before the fix the engine did not bump the version for an eviction)."""
    from meshsched.policies.registry import make_policy
    from meshsched.policies.stack import PolicyHandle

    stack = make_policy("castor+srtf", PolicyHandle(PERF, FixedXi(None)))
    eng = Engine(stack, ProfileEstimator(PERF), ClusterState())
    eng.handle(ev.NodeJoined("join", NodeSpec("n0", 2, "v100", 16384)), 0.0)
    eng.handle(ev.JobSubmitted("s-long", JobSpec("long", 2, "resnet18", 128, 1_000_000, submit_time=0.0)), 0.0)
    eng.handle(ev.JobStarted("st-long", "long"), 10.0)
    eng.handle(ev.JobSubmitted("s-short", JobSpec("short", 2, "resnet18", 128, 100, submit_time=20.0)), 20.0)
    assert eng.state.jobs["long"].state.value == "PAUSING"  # evicted for the short job
    occ = stack.placement._occupancy(eng.view(), eng.state)  # noqa: SLF001 - the policy's own snapshot
    assert occ.pausing[occ.row("long")]
    assert "long" not in [h.job.job_id for h in occ.hosts]


def test_sharing_policies_on_a_mixed_cluster_keep_each_job_on_one_gpu_type():
    from meshsched.loaders.profiles import installed_handle, load_interference
    from meshsched.loaders.traces import TraceOptions, load_trace
    from meshsched.policies.registry import make_policy
    from meshsched.sim.loop import ClusterSpec, simulate

    tr = load_trace("philly", PERF, TraceOptions(gpu_type="v100", gpus_per_node=4, seed=1, first_n=150, load=2.0))
    cluster = ClusterSpec(2, 4, "v100", PERF.gpu_memory_mb("v100"), extra=(ClusterSpec(2, 4, "k80", PERF.gpu_memory_mb("k80")),))

    def check(eng):
        eng.state.validate()
        for job in eng.view().holding():
            assert len({eng.state.gpus[g].gpu_type for g in job.gpus}) == 1, job.job_id

    for name in ("castor", "sjf-ffs", "lucid"):
        r = simulate(tr.jobs, make_policy(name, installed_handle()), PERF, cluster, interference=load_interference(), after_event=check)
        assert r.engine.state.jobs
