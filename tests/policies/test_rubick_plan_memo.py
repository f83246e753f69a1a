"""Rubick's plan layer skips what cannot change (issue 26, speed): a pass with no job of a planned model holding
GPUs walks no job (`RubickPlans._any_held`, kept from the state's change log), and a job whose replan answered
None is not weighed again while its inputs and, for a restart that did not pay back, its progress figures stand
(`_quiet`). A replay with the memo and one without it (`RubickPlans.memo = False`) must decide the same."""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

import pytest

from meshsched.loaders.profiles import installed_handle, load_perf_model, load_plan_catalog
from meshsched.loaders.traces import TraceOptions, load_trace
from meshsched.perf.mixed import MixedPerfModel
from meshsched.perf.plans import PlanPerfModel
from meshsched.policies import rubick_plan
from meshsched.policies.registry import make_policy
from meshsched.policies.rubick_plan import RubickPlans
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.sim.mixed_trace import with_plan_jobs
from meshsched.state import JobState


@cache
def _perf():
    return MixedPerfModel(load_perf_model(), PlanPerfModel(load_plan_catalog()))


def _jobs(share: float, n: int):
    perf = _perf()
    tr = load_trace("philly", perf, TraceOptions(gpu_type="v100", gpus_per_node=8, seed=2, first_n=n, load=3.0))
    return with_plan_jobs(tr.jobs, perf, share, "v100", 8, 16, seed=2)


def _replay(spec: str, jobs, memo: bool, weighed: list | None = None, chosen: list | None = None):
    """The jobs' ends and exec configs, every Reconfigure handed out, Rubick's log lines; `weighed` gets each job
    a pass weighs (`_replan_one`), `chosen` each running job whose best plan was looked up."""
    perf = _perf()
    stack = make_policy(spec, installed_handle(1, True, False, perf))
    assert isinstance(stack.plan, RubickPlans)
    stack.plan.memo = memo
    if weighed is not None:
        inner = stack.plan._replan_one
        stack.plan._replan_one = lambda view, job, now: weighed.append(job.job_id) or inner(view, job, now)
    if chosen is not None:
        choose = stack.plan.choose
        stack.plan.choose = lambda *a: chosen.append(a[0]) or choose(*a)
    log: list[tuple] = []

    def watch(engine):
        for job in engine.view().holding():
            if job.exec_pending is not None:
                log.append((job.job_id, job.exec_pending))

    r = simulate(jobs, stack, perf, ClusterSpec(2, 8, "v100", perf.gpu_memory_mb("v100")), after_event=watch)
    out = {j.job_id: (j.state, j.acct.run_time, j.acct.finish_time, j.exec) for j in r.engine.state.jobs.values()}
    return out, log, [e.message for e in r.engine.log if "rubick" in e.message]


def test_the_plan_memo_decides_what_weighing_every_job_at_every_pass_decides():
    jobs = _jobs(0.5, 120)
    chosen_fast: list = []
    chosen_full: list = []
    fast = _replay("castor+rubick", jobs, True, chosen=chosen_fast)
    full = _replay("castor+rubick", jobs, False, chosen=chosen_full)
    assert fast == full
    assert any("CPUs/GPU (" in m for m in full[2]), "no running job was replanned: the test exercises nothing"
    assert chosen_fast and len(chosen_fast) < len(chosen_full) / 2  # the memo skipped most of the weighing


class _Counting:
    """A view that counts the holding jobs a layer walks."""

    def __init__(self, view, walked: list) -> None:
        self.view, self.walked = view, walked

    def __getattr__(self, name):
        return getattr(self.view, name)

    def holding(self):
        for j in self.view.holding():
            self.walked[0] += 1
            yield j


def test_without_planned_jobs_passes_walk_few_jobs_and_the_replay_is_the_same():
    """No plan job: a pass walks the holding jobs only when the change log cannot tell what moved (a timer)."""
    jobs = _jobs(0.0, 40)
    weighed: list = []
    assert _replay("castor+lazer+rubick", jobs, True, weighed) == _replay("castor+lazer+rubick", jobs, False)
    assert weighed == []
    perf = _perf()
    stack = make_policy("castor+rubick", installed_handle(1, True, False, perf))
    fast, full = RubickPlans(stack.plan.perf), RubickPlans(stack.plan.perf)
    full.memo = False
    walked = {"fast": [0], "full": [0]}

    def watch(engine):
        now, view = (engine.log[-1].time if engine.log else 0.0), engine.view()
        assert fast.replan(_Counting(view, walked["fast"]), now) == full.replan(_Counting(view, walked["full"]), now)

    simulate(jobs, stack, perf, ClusterSpec(2, 8, "v100", perf.gpu_memory_mb("v100")), after_event=watch)
    assert walked["full"][0] > 0 and walked["fast"][0] < walked["full"][0] / 4, walked


def test_at_every_event_and_later_instants_the_memo_answers_what_the_full_path_answers(monkeypatch):
    """Beside a replay, a layer with the memo and one without are asked after every event, at that instant and at
    instants 10 minutes and 3 hours later (each pair asked in time order): leases run out and restarts stop
    paying back while a job's inputs stand, and the answers must stay the same. With no payback asked, every
    job that could run faster is replanned once its lease ends (a memo that outlived a lease would miss it)."""
    monkeypatch.setattr(rubick_plan, "PAYBACK", 0.0)
    jobs = _jobs(0.5, 60)
    perf = _perf()
    stack = make_policy("castor+rubick", installed_handle(1, True, False, perf))
    pairs = {}
    for offset in (0.0, 600.0, 10_800.0):
        fast, full = RubickPlans(stack.plan.perf), RubickPlans(stack.plan.perf)
        full.memo = False
        pairs[offset] = (fast, full)
    asked = [0]

    def watch(engine):
        if not engine.log:
            return
        now, view = engine.log[-1].time, engine.view()
        for offset, (fast, full) in pairs.items():
            got = fast.replan(view, now + offset)
            assert got == full.replan(view, now + offset), (offset, now)
            asked[0] += len(got)

    simulate(jobs, stack, perf, ClusterSpec(2, 8, "v100", perf.gpu_memory_mb("v100")), after_event=watch)
    assert asked[0] > 0


def test_a_lease_memo_lasts_only_while_the_lease_does():
    job = SimpleNamespace(since=100.0, done_iterations=5.0, progress_time=150.0, step_time=2.0,
                          spec=SimpleNamespace(iterations=1000), state=JobState.RUNNING)
    lease = (("inputs",), 60.0, None)
    assert rubick_plan._still_quiet(lease, job, 159.0) and not rubick_plan._still_quiet(lease, job, 160.0)
    assert rubick_plan._still_quiet((("inputs",), None, None), job, 1e12)  # best already, or nothing fits
    paid = (("inputs",), None, rubick_plan._progress(job))
    assert rubick_plan._still_quiet(paid, job, 1e9)
    job.done_iterations = 6.0  # a report: the remaining work is read again
    assert not rubick_plan._still_quiet(paid, job, 1e9)
