"""Slurm-grade job control: dependencies, hold/release/requeue, time limits and throttled arrays.

First in the engine on a bare ClusterState (no clock: the times are passed in and the timer is the engine's
ScheduleTimer), then through meshd's API and the `mesh` command line (arrays, --wait, output patterns).
"""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.actions import Launch, Preempt, ScheduleTimer
from meshsched.state import Dependency, DependencyKind, JobSpec, JobState
from tests.test_engine import Harness

S = JobState
OK, ANY, NOTOK = DependencyKind.AFTEROK, DependencyKind.AFTERANY, DependencyKind.AFTERNOTOK


def submit(h: Harness, job_id: str, now: float, gpus: int = 1, iterations: int = 100, held: bool = False,
           deps: tuple = (), time_limit: float | None = None, array: str = "", limit: int = 0) -> list:
    spec = JobSpec(job_id, gpus, "m", 100 * gpus, iterations, submit_time=now, time_limit=time_limit,
                   dependencies=tuple(Dependency(k, j) for k, j in deps), array_id=array, array_limit=limit)
    return h(ev.JobSubmitted(h.sid(f"submit-{job_id}"), spec, held=held), now)


def launched(actions: list) -> list[str]:
    return [a.job_id for a in actions if isinstance(a, Launch)]


# ------------------------------------------------------------------------------------------ dependencies


def test_afterok_waits_for_a_completion_then_joins_the_queue():
    h = Harness()
    submit(h, "a", 0.0)
    out = submit(h, "b", 1.0, deps=[(OK, "a")])
    assert launched(out) == []
    assert h.job("b").state is S.PENDING and h.engine.pending_reason("b") == "Dependency"
    h.started("a", 2.0)
    out = h.finished("a", 10.0)
    assert launched(out) == ["b"]
    assert h.engine.settled == ["b"]  # meshd journals the jobs job control moved


@pytest.mark.parametrize("kind, ending, runs", [
    (OK, "fail", False), (OK, "cancel", False), (NOTOK, "finish", False), (NOTOK, "fail", True),
    (ANY, "fail", True), (ANY, "cancel", True), (ANY, "finish", True), (OK, "finish", True),
])  # fmt: skip
def test_each_kind_is_met_or_cancelled_never_left_waiting(kind, ending, runs):
    h = Harness()
    submit(h, "a", 0.0)
    h.started("a", 1.0)
    submit(h, "b", 1.0, deps=[(kind, "a")])
    {"fail": lambda: h.failed("a", 5.0), "finish": lambda: h.finished("a", 5.0),
     "cancel": lambda: h(ev.CancelRequested(h.sid("c"), "a"), 5.0)}[ending]()
    b = h.job("b")
    if runs:
        assert b.state is S.LOADING
    else:
        assert b.state is S.CANCELLED and b.reason == "DependencyNeverSatisfied"


def test_a_never_satisfiable_dependency_cascades_and_an_unknown_job_is_refused_at_once():
    h = Harness()
    submit(h, "a", 0.0, iterations=10)
    h.started("a", 1.0)
    submit(h, "b", 1.0, deps=[(OK, "a")])
    submit(h, "c", 1.0, deps=[(OK, "b")])
    submit(h, "d", 1.0, deps=[(NOTOK, "b")])  # b ends CANCELLED: not ok, so d runs (as in Slurm)
    h.failed("a", 2.0)
    assert [h.job(j).reason for j in "bc"] == ["DependencyNeverSatisfied"] * 2
    assert h.job("d").state is S.LOADING
    submit(h, "e", 3.0, deps=[(OK, "nope")])
    assert h.job("e").state is S.CANCELLED and h.job("e").reason == "DependencyNeverSatisfied"


def test_a_dependency_on_a_finished_job_is_met_at_submit():
    h = Harness()
    submit(h, "a", 0.0)
    h.started("a", 1.0)
    h.finished("a", 2.0)
    assert launched(submit(h, "b", 3.0, deps=[(OK, "a"), (ANY, "a")])) == ["b"]


# ------------------------------------------------------------------------------------------ hold / release


def test_hold_at_submit_and_release():
    h = Harness()
    assert launched(submit(h, "a", 0.0, held=True)) == []
    assert h.engine.pending_reason("a") == "JobHeldUser"
    out = h(ev.ReleaseRequested(h.sid("rel"), "a"), 1.0)
    assert launched(out) == ["a"]


def test_hold_a_queued_job_keeps_it_out_until_released_and_is_ignored_for_a_running_one():
    h = Harness()
    submit(h, "big", 0.0, gpus=4)
    submit(h, "a", 0.0)
    h(ev.HoldRequested(h.sid("hold"), "a"), 1.0)
    h(ev.HoldRequested(h.sid("hold"), "big"), 1.0)  # running: nothing happens
    assert h.job("big").state is S.LOADING and not h.job("big").held
    out = h.finished("big", 5.0)
    assert launched(out) == [] and h.job("a").state is S.PENDING
    assert launched(h(ev.ReleaseRequested(h.sid("rel"), "a"), 6.0)) == ["a"]


def test_cancel_of_a_held_job():
    h = Harness()
    submit(h, "a", 0.0, held=True)
    h(ev.CancelRequested(h.sid("c"), "a"), 1.0)
    assert h.job("a").state is S.CANCELLED
    assert h.engine.queue_length == 0


def test_requeue_checkpoints_and_queues_again():
    h = Harness()
    submit(h, "a", 0.0)
    h.started("a", 1.0)
    out = h(ev.RequeueRequested(h.sid("rq"), "a"), 2.0)
    assert [type(a) for a in out] == [Preempt] and h.job("a").state is S.PAUSING
    out = h.paused("a", 40.0, 3.0)
    assert launched(out) == ["a"]  # queued again and, the GPUs being free, started from its checkpoint
    assert [a.resume_from for a in out if isinstance(a, Launch)] == [40.0]


# ------------------------------------------------------------------------------------------ time limits


def test_a_time_limit_arms_the_engines_timer_and_ends_the_job_as_timeout():
    h = Harness()
    out = submit(h, "a", 0.0, time_limit=90.0)
    assert [a.at for a in out if isinstance(a, ScheduleTimer)] == [90.0]
    h.started("a", 1.0)
    out = h(ev.Tick(h.sid("tick"), h.engine._timer_key), 90.0)
    assert [type(a) for a in out] == [Preempt]  # a checkpoint first (the SDK's checkpoint-and-exit)
    assert h.job("a").state is S.PAUSING and h.job("a").reason == "TimeLimit"
    h.paused("a", 50.0, 91.0)
    assert h.job("a").state is S.TIMEOUT and h.job("a").state.is_terminal
    assert h.job("a").done_iterations == 50.0


def test_a_job_that_finishes_in_time_disarms_its_limit():
    h = Harness()
    submit(h, "a", 0.0, time_limit=90.0)
    h.started("a", 1.0)
    out = h.finished("a", 10.0)
    assert h.job("a").state is S.COMPLETED
    assert not [a for a in out if isinstance(a, ScheduleTimer)] and h.engine._timer_at is None
    # the stale timer, if it fires, does nothing
    assert h(ev.Tick(h.sid("tick"), h.engine._timer_key), 90.0) == []


def test_timeout_satisfies_afterany_and_afternotok_not_afterok():
    h = Harness()
    submit(h, "a", 0.0, time_limit=5.0)
    h.started("a", 0.5)
    submit(h, "ok", 0.0, deps=[(OK, "a")])
    submit(h, "notok", 0.0, deps=[(NOTOK, "a")])
    h(ev.Tick(h.sid("tick"), h.engine._timer_key), 5.0)
    h.paused("a", 1.0, 6.0)
    assert h.job("ok").reason == "DependencyNeverSatisfied"
    assert h.job("notok").state is S.LOADING


# ------------------------------------------------------------------------------------------ arrays


def test_a_throttled_array_runs_at_most_n_tasks_at_once_in_task_order():
    h = Harness(nodes=(("n0", 8),))
    started = []
    for t in range(6):
        started += launched(submit(h, f"7_{t}", 0.0, array="7", limit=2))
    assert started == ["7_0", "7_1"]
    assert h.engine.pending_reason("7_2") == "JobArrayTaskLimit"
    h.started("7_0", 1.0)
    assert launched(h.finished("7_0", 2.0)) == ["7_2"]
    h(ev.CancelRequested(h.sid("c"), "7_3"), 2.5)  # a waiting task cancelled: never started later
    h(ev.HoldRequested(h.sid("h"), "7_1"), 2.6)  # LOADING: not held
    h.started("7_1", 3.0)
    assert launched(h.failed("7_1", 4.0)) == ["7_4"]
    assert sorted(j for j, job in h.state.jobs.items() if job.state.holds_gpus) == ["7_2", "7_4"]


def test_plain_jobs_take_none_of_the_job_control_paths():
    """Jobs without job-control options are queued as before: nothing blocked, no timer."""
    h = Harness()
    out = submit(h, "a", 0.0)
    assert launched(out) == ["a"] and not [a for a in out if isinstance(a, ScheduleTimer)]
    assert h.engine._blocked == {} and h.engine._limits == {}
