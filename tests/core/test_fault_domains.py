"""A shared GPU is one fault domain (issue 24, point 6): a GpuFault requeues the innocent partner uncharged, fails
the culprit as any failure, and the pair is not formed again while another partner can be."""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.actions import Launch
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import load_perf_model
from meshsched.policies.castor import Castor
from meshsched.policies.registry import stack_of
from meshsched.policies.sharing_baselines import Lucid, SjfFfs
from meshsched.state import ClusterState, JobSpec, JobState, NodeSpec
from tests.support.engine import Harness

PERF = load_perf_model()


class EqualXi:
    """Every pair slows both by 1.1 (sharing always pays; no partner is better than another)."""

    def xi(self, model_a, batch_a, model_b, batch_b, gpu_type):
        return (1.1, 1.1)


class Pairs:
    """An engine with a sharing placement on one node of two V100s."""

    def __init__(self, policy) -> None:
        self.engine = Engine(stack_of(policy), ProfileEstimator(PERF), ClusterState())
        self.n = 0
        self(ev.NodeJoined("join", NodeSpec("n0", 2, "v100", 16384)), 0.0)

    def __call__(self, event, now):
        out = self.engine.handle(event, now)
        self.engine.state.validate()
        return out

    def sid(self) -> str:
        self.n += 1
        return f"s{self.n}"

    def submit(self, job_id, iterations, now):
        return self(ev.JobSubmitted(self.sid(), JobSpec(job_id, 1, "resnet18", 64, iterations, submit_time=now)), now)

    def started(self, job_id, now):
        return self(ev.JobStarted(self.sid(), job_id), now)

    def job(self, job_id):
        return self.engine.state.jobs[job_id]

    def on(self, gpu: int) -> list[str]:
        return self.engine.state.gpus[gpu].jobs


POLICIES = {"sjf-ffs": lambda: SjfFfs(perf=PERF, interference=EqualXi()),
            "castor": lambda: Castor(perf=PERF, interference=EqualXi()),
            "lucid": lambda: Lucid(perf=PERF, interference=EqualXi())}


def _two_pairs(p: Pairs) -> None:
    """x and a on the two GPUs, then b and y share them (two pairs)."""
    its = {"x": 500_000, "a": 400_000, "b": 300_000, "y": 200_000}
    for j in ("x", "a"):
        p.submit(j, its[j], 0.0)
        p.started(j, 20.0)
    for j in ("b", "y"):
        p.submit(j, its[j], 30.0)
        p.started(j, 50.0)
    assert all(len(p.on(i)) == 2 for i in (0, 1))


@pytest.mark.parametrize("name", ["lucid", "sjf-ffs"])  # both would pair b with its old partner again (before)
def test_a_dead_mps_server_requeues_both_uncharged_and_the_pair_is_not_formed_again(name):
    p = Pairs(POLICIES[name]())
    _two_pairs(p)
    g = next(i for i in (0, 1) if "b" in p.on(i))
    partner = next(j for j in p.on(g) if j != "b")
    before = {j: (p.job(j).restarts, p.job(j).acct.preemptions) for j in ("b", partner)}
    p(ev.CheckpointSaved(p.sid(), "b", 40.0), 60.0)
    acts = p(ev.GpuFault(p.sid(), g, None), 70.0)
    for j in ("b", partner):
        job = p.job(j)
        assert job.state is not JobState.FAILED and job.acct.preemptions == before[j][1]
        assert any(f"requeued uncharged: MPS server of GPU {g} died" in e.message for e in p.engine.explain(j))
    assert p.job("b").checkpoint_iterations == 40.0
    (first,) = [a for a in acts if isinstance(a, Launch)]  # the freed GPU takes one; the other GPU holds two
    assert p.job(first.job_id).restarts == before[first.job_id][0]  # the relaunch is the cut-short run again
    assert first.restart == before[first.job_id][0] - 1
    waiting = ({"b", partner} - {first.job_id}).pop()
    p.started(first.job_id, 80.0)
    assert p.job(waiting).state is JobState.PREEMPTED and p.job(waiting).restarts == before[waiting][0] - 1
    other = p.on(1 - g)[0]
    p(ev.JobFinished(p.sid(), other), 100.0)  # a release: two single-job GPUs, one of them its old partner's
    job = p.job(waiting)
    assert job.state is JobState.LOADING and job.restarts == before[waiting][0]
    assert set(p.on(g)) == {first.job_id} and waiting in p.on(1 - g)  # not with its old partner


def test_every_sharing_layer_asks_whether_a_pair_faulted_together():
    p = Pairs(POLICIES["castor"]())
    _two_pairs(p)
    g = p.engine.state.gpus[0]
    a, b = (p.job(j) for j in g.jobs)
    p(ev.GpuFault(p.sid(), 0, None), 70.0)
    assert not a.may_pair(b) and not b.may_pair(a) and a.may_pair(p.job(p.on(1)[0]))
    for policy in POLICIES.values():
        layer = policy()
        assert layer.foreign(a, b) and layer.foreign(b, a) and not layer.foreign(a, p.job(p.on(1)[0]))
        assert "a GPU fault hit with it" in layer.foreign_wait(a, b).reason


def test_a_culprit_fails_and_its_partner_is_requeued_uncharged():
    h = Harness("fifo", nodes=(("n0", 1),))
    h.submit("a", 1, 1_000, 0.0)
    h.started("a", 10.0)
    # fifo never shares: place b next to a by hand, as a sharing layer would
    h.submit("b", 1, 1_000, 11.0)
    assert h.job("b").state is JobState.PENDING
    eng = h.engine
    eng.waiting.remove("b", 1)
    b = h.job("b")
    b.transition(JobState.LOADING, 12.0)
    eng.state.assign("b", (0,))
    b.gpus, b.restarts = (0,), 3
    eng._active["b"] = b
    h.started("b", 13.0)
    h(ev.CheckpointSaved(h.sid("ck"), "b", 200.0), 20.0)
    h.report("b", 300.0, 0.1, 21.0)
    acts = h(ev.GpuFault(h.sid("fault"), 0, "a", "rank 0 failed (exit code 1): CUDA error: an illegal memory access"),
             30.0)
    assert h.job("a").state is JobState.FAILED and "illegal memory access" in h.job("a").reason
    job = h.job("b")
    assert job.state is JobState.LOADING  # requeued and, the GPU free, started again at once
    assert [a for a in acts if isinstance(a, Launch)] == [Launch("b", (0,), 200.0, 2, job.exec)]
    assert job.restarts == 3 and job.acct.preemptions == 0  # as before the fault
    assert "requeued uncharged: partner job a faulted GPU 0" in [e.message.split(";")[0] for e in eng.explain("b")]
    assert job.avoid == frozenset({"a"}) and h.job("a").avoid == frozenset({"b"})


def test_a_fault_on_an_empty_or_unknown_gpu_changes_nothing():
    h = Harness("fifo", nodes=(("n0", 2),))
    h(ev.GpuFault(h.sid("f"), 1, None), 1.0)
    assert any("GPU 1 faulted with no job on it" in e.message for e in h.engine.log)
    h(ev.GpuFault(h.sid("f"), 9, "x"), 2.0)
    assert any("unknown GPU 9" in e.message for e in h.engine.log)
