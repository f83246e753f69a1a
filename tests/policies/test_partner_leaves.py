"""Settings follow partners (issue 26, point 4): a job squeezed to fit beside a partner (micro-batch x
accumulation, an MPS share) goes back to its solo settings when its last partner leaves, through a Reconfigure
from the policy stack (so the simulator and meshd, which drive the same engine and stack, both get it)."""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.actions import Reconfigure
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import installed_handle, load_perf_model
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.state import ClusterState, ExecConfig, JobSpec, JobState, NodeSpec

PERF = load_perf_model()


class Snap:
    def __init__(self, stack, gpus=1):
        self.engine = Engine(stack, ProfileEstimator(PERF), ClusterState())
        self.n = 0
        self(ev.NodeJoined("join-n0", NodeSpec("n0", gpus, "v100", 16384)), 0.0)

    def __call__(self, event, now):
        actions = self.engine.handle(event, now)
        self.engine.state.validate()
        return actions

    def sid(self, what):
        self.n += 1
        return f"{what}{self.n}"


def _squeezed_pair(stack):
    """A (long) trains alone; B arrives and Castor shares A's GPU with B at a smaller micro-batch."""
    s = Snap(stack)
    s(ev.JobSubmitted("sA", JobSpec("A", 1, "recommendation", 32, 30_000)), 0.0)
    s(ev.JobStarted("stA", "A"), 30.0)
    acts = s(ev.JobSubmitted("sB", JobSpec("B", 1, "a3c", 64, 3_000, submit_time=40.0)), 40.0)
    (launch,) = acts
    assert launch.job_id == "B" and launch.exec.accumulation > 1, launch  # squeezed to fit beside A
    s(ev.JobStarted("stB", "B"), 60.0)
    return s, launch.exec


def test_castor_partner_finishes_and_the_squeezed_job_goes_back_to_solo():
    s, squeezed = _squeezed_pair(make_policy("castor", installed_handle()))
    acts = s(ev.JobFinished("fA", "A"), 1000.0)
    recs = [a for a in acts if isinstance(a, Reconfigure)]
    assert recs == [Reconfigure("B", ExecConfig(squeezed.per_gpu_batch), False)]  # at a step boundary
    assert "trains alone now" in s.engine.explain("B")[-1].message
    s(ev.ReconfigureApplied("rB", "B", recs[0].exec), 1000.0)
    assert s.engine.state.jobs["B"].exec == ExecConfig(64)
    # the next release finds nothing left to undo (and the stack stops looking)
    acts = s(ev.JobFailed("fB", "B", "gone"), 1002.0)
    assert not [a for a in acts if isinstance(a, Reconfigure)] and not s.engine.policy._squeezed


def test_a_partner_fails_and_an_mps_share_is_reset_by_restart():
    s, squeezed = _squeezed_pair(make_policy("castor", installed_handle()))
    # as a calibration layer would have left it: an MPS share and a memory limit beside A
    shared = ExecConfig(squeezed.micro_batch, squeezed.accumulation, 60, 8000)
    s(ev.ReconfigureApplied("rB", "B", shared), 100.0)
    acts = s(ev.JobFailed("fA", "A", "exit 1"), 200.0)
    recs = [a for a in acts if isinstance(a, Reconfigure)]
    assert recs == [Reconfigure("B", ExecConfig(64), True)]  # the MPS limits need a restart


def test_a_job_still_beside_a_partner_keeps_its_settings():
    s = Snap(make_policy("castor", installed_handle()), gpus=2)
    for i, name in enumerate("AE"):
        s(ev.JobSubmitted(f"s{name}", JobSpec(name, 1, "recommendation", 32, 30_000 + i)), 0.0)
        s(ev.JobStarted(f"st{name}", name), 30.0)
    (launch,) = s(ev.JobSubmitted("sB", JobSpec("B", 1, "a3c", 64, 3_000, submit_time=40.0)), 40.0)
    assert launch.exec.accumulation > 1
    s(ev.JobStarted("stB", "B"), 60.0)
    gpus = s.engine.state.gpus
    (partner,) = set(gpus[launch.gpus[0]].jobs) - {"B"}
    other = ({"A", "E"} - {partner}).pop()
    acts = s(ev.JobFinished(f"f{other}", other), 100.0)  # a release beside, not of, B's partner
    assert not [a for a in acts if isinstance(a, Reconfigure)]
    assert s.engine.state.jobs["B"].exec == launch.exec and s.engine.policy._squeezed
    acts = s(ev.JobFinished(f"f{partner}", partner), 200.0)
    assert [a for a in acts if isinstance(a, Reconfigure)] == [Reconfigure("B", ExecConfig(64), False)]


@pytest.mark.parametrize("policy", ["castor", "castor+gimbal"])
def test_simulated_job_trains_at_its_solo_step_time_after_its_partner_finishes(policy):
    # B (a3c, per-GPU batch 64) is started beside A (recommendation) at micro-batch 4 x 16; A ends first.
    jobs = [JobSpec("A", 1, "recommendation", 32, 30_000, 0.0), JobSpec("B", 1, "a3c", 64, 3_000, 60.0)]
    seen = []

    def after(engine):
        a, b = engine.state.jobs["A"], engine.state.jobs.get("B")
        if b is not None and b.state is JobState.RUNNING:
            seen.append((a.state, b.exec, b.step_time))

    r = simulate(jobs, make_policy(policy, installed_handle()), PERF, ClusterSpec(1, 1, "v100", 16384),
                 after_event=after)
    assert any(x.accumulation > 1 for a, x, _ in seen if a is JobState.RUNNING), "B was not squeezed beside A"
    alone = [(x, t) for a, x, t in seen if a is JobState.COMPLETED]
    assert alone and alone[-1][0] == ExecConfig(64)
    assert alone[-1][1] == pytest.approx(PERF.iteration_time("a3c", "v100", (1,), 64), rel=1e-9)
    log = [e.message for e in r.engine.explain("B")]
    assert any(m.startswith("reconfigure to micro-batch 64 x 1, MPS 100%") for m in log), log
    assert r.engine.state.jobs["B"].state is JobState.COMPLETED


def test_a_newcomer_beside_a_job_going_back_to_solo_fits_next_to_its_solo_micro_batch():
    """B's partner finished: B goes back to micro-batch 64 (asked for, not yet applied) when C arrives. Castor
    judged C beside B's squeezed micro-batch (4), started it at 32 next to B's 64, and the simulator failed C,
    out of GPU memory next to its partner, once loaded (full Philly at 1x, castor+lazer+gimbal: philly-18424)."""
    from meshsched.actions import Launch
    from meshsched.perf.memory import pair_fits

    s, squeezed = _squeezed_pair(make_policy("castor", installed_handle()))
    (rec,) = [a for a in s(ev.JobFinished("fA", "A"), 1000.0) if isinstance(a, Reconfigure)]
    assert rec.exec.micro_batch == 64 and s.engine.state.jobs["B"].exec.micro_batch == squeezed.micro_batch < 64
    acts = s(ev.JobSubmitted("sC", JobSpec("C", 1, "recommendation", 32, 30_000, submit_time=1000.0)), 1000.0)
    beside = [a for a in acts if isinstance(a, Launch) and set(a.gpus) & set(s.engine.state.jobs["B"].gpus)]
    assert all(pair_fits("a3c", 64, "recommendation", a.exec.micro_batch, 16384) for a in beside), beside
