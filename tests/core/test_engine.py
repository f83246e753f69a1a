"""The engine on a bare ClusterState: events in, actions out, `validate()` after every step.

Times are hand-checkable with LinearPerf: a job of G GPUs with batch 100*G steps in 1.0 s on one node
(+10% per extra node); the engine's actions are checked exactly, the world's replies are events we send.
"""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.actions import Kill, Launch, Preempt, ScheduleTimer
from meshsched.state import JobState
from tests.support.engine import Harness
from tests.support.fakes import launch

S = JobState


def launches(actions) -> list[Launch]:
    return [a for a in actions if isinstance(a, Launch)]


def without_timers(actions) -> list:
    return [a for a in actions if not isinstance(a, ScheduleTimer)]


def gpus_of_node(h: Harness, name: str) -> set[int]:
    return set(h.state.nodes[name].gpus)


# ------------------------------------------------------------------ the happy path


def test_submit_launches_on_free_gpus_from_scratch():
    h = Harness(nodes=(("n0", 4), ("n1", 4)))
    actions = h.submit("a", 3, 100, 1.0)
    assert actions == [launch("a", (0, 1, 2), 0.0, 0)]
    a = h.job("a")
    assert a.state is S.LOADING and a.gpus == (0, 1, 2) and a.since == 1.0
    assert a.acct.first_start == 1.0 and a.restarts == 1
    assert a.ideal_step_time == pytest.approx(1.0)
    assert h.state.free_by_node == {"n0": 1, "n1": 4}
    assert h.engine.queue_length == 0
    # the next job goes to the best-fitting node, not across both
    assert h.submit("b", 4, 100, 2.0) == [launch("b", (4, 5, 6, 7), 0.0, 0)]


def test_started_moves_to_running_with_the_estimated_step_time():
    h = Harness()
    h.submit("a", 2, 100, 0.0)
    assert h.started("a", 10.0) == []
    a = h.job("a")
    assert a.state is S.RUNNING and a.step_time == pytest.approx(1.0) and a.progress_time == 10.0
    assert a.acct.load_time == pytest.approx(10.0)
    assert a.iterations_at(40.0) == pytest.approx(30.0)


def test_multi_node_job_step_time_includes_the_node_penalty():
    h = Harness(nodes=(("n0", 2), ("n1", 2)))
    h.submit("a", 4, 100, 0.0)
    h.started("a", 10.0)
    assert h.job("a").step_time == pytest.approx(1.1)  # two nodes: +10%
    assert h.job("a").ideal_step_time == pytest.approx(1.1)


def test_finish_completes_frees_gpus_and_launches_the_next():
    h = Harness()
    h.submit("a", 4, 100, 0.0)
    assert h.submit("b", 2, 50, 5.0) == []  # queued behind a
    assert h.job("b").state is S.PENDING
    h.started("a", 10.0)
    h.report("a", 60.0, 1.0, 70.0)
    actions = h.finished("a", 110.0)
    assert actions == [launch("b", (0, 1), 0.0, 0)]
    a = h.job("a")
    assert a.state is S.COMPLETED and a.gpus == () and a.done_iterations == 100.0
    assert a.acct.finish_time == 110.0 and a.acct.run_time == pytest.approx(100.0)
    assert a.acct.attained_gpu_time == pytest.approx(400.0)
    assert h.job("b").acct.wait_time == pytest.approx(105.0)
    assert h.state.free_by_node == {"n0": 2}
    assert [g.jobs for g in h.state.gpus] == [["b"], ["b"], [], []]


def test_iteration_report_updates_progress_but_not_the_checkpoint():
    h = Harness()
    h.submit("a", 1, 100, 0.0)
    h.report("a", 5.0, 1.0, 5.0)  # still LOADING: ignored
    assert h.job("a").done_iterations == 0.0
    h.started("a", 10.0)
    h.report("a", 30.0, 2.0, 40.0)
    a = h.job("a")
    assert (a.done_iterations, a.progress_time, a.step_time) == (30.0, 40.0, 2.0)
    assert a.checkpoint_iterations == 0.0
    h.report("a", 20.0, 0.0, 50.0)  # progress never goes back; a zero step time is not taken
    assert a.done_iterations == 30.0 and a.step_time == 2.0
    h.report("a", 500.0, 1.0, 60.0)
    assert a.done_iterations == 100.0  # capped at the job's length


def test_a_declared_total_replaces_the_estimate_and_reorders_a_queued_job():
    """meshsched.job's hello says how many steps the script runs: progress caps and SJF order follow it."""
    h = Harness(policy="sjf", nodes=(("n0", 1),))
    h.submit("a", 1, 100, 0.0)
    h.started("a", 1.0)
    h(ev.TotalDeclared(h.sid("hello-a"), "a", 3000), 2.0)
    h.report("a", 310.0, 0.1, 3.0)
    assert h.job("a").spec.iterations == 3000 and h.job("a").done_iterations == 310.0  # not capped at 100
    h.submit("b", 1, 50, 4.0)
    h.submit("c", 1, 40, 5.0)
    h(ev.TotalDeclared(h.sid("hello-c"), "c", 80), 6.0)  # a restored queued job re-declares: re-keyed
    assert [j.job_id for j in h.engine.queued()] == ["b", "c"]
    h(ev.TotalDeclared(h.sid("hello-a"), "a", 200), 7.0)  # shorter than done: progress capped, still valid
    assert h.job("a").done_iterations == 200.0


# ------------------------------------------------------------------ preemption


def test_srtf_preemption_checkpoints_requeues_and_resumes_from_the_checkpoint():
    h = Harness("srtf")
    h.submit("long", 4, 1000, 0.0)
    h.started("long", 10.0)
    actions = h.submit("short", 4, 100, 100.0)
    assert actions == [Preempt("long")]
    long = h.job("long")
    assert long.state is S.PAUSING and long.gpus == (0, 1, 2, 3)
    assert long.done_iterations == pytest.approx(90.0)  # extrapolated to the preemption
    assert long.acct.preemptions == 1 and long.acct.futile_preemptions == 0
    assert h.job("short").state is S.PENDING

    actions = h.paused("long", 88.0, 105.0)  # the checkpoint the job actually saved
    assert actions == [launch("short", (0, 1, 2, 3), 0.0, 0)]
    assert long.state is S.PREEMPTED and long.gpus == ()
    assert long.checkpoint_iterations == long.done_iterations == 88.0
    assert long.acct.pause_time == pytest.approx(5.0)
    assert [j.job_id for j in h.engine.queued()] == ["long"]

    h.started("short", 115.0)
    actions = h.finished("short", 215.0)
    assert actions == [launch("long", (0, 1, 2, 3), 88.0, 1)]  # resumes; second launch
    assert long.restarts == 2 and long.state is S.LOADING
    h.started("long", 225.0)
    h.finished("long", 225.0 + 912.0)
    a = long.acct
    assert long.state is S.COMPLETED
    assert a.wait_time == pytest.approx(215.0 - 105.0)
    assert a.load_time == pytest.approx(20.0)
    assert a.pause_time == pytest.approx(5.0)
    assert a.run_time == pytest.approx(90.0 + 912.0)
    assert a.futile_time == 0.0


def test_pause_that_saved_the_last_iteration_completes_the_job():
    h = Harness("srtf")
    h.submit("a", 4, 100, 0.0)
    h.started("a", 10.0)
    h.submit("b", 4, 10, 105.0)  # a has ~5 s left on the estimate, b 10: no preemption
    assert h.job("a").state is S.RUNNING
    h.job("a").done_iterations = 0.0  # pretend the estimate was wrong: a is still at the start
    h.job("a").progress_time = 105.0
    assert h.submit("c", 4, 50, 106.0) == [Preempt("a")]
    actions = h.paused("a", 100.0, 110.0)  # ...but it reached the end before saving
    assert h.job("a").state is S.COMPLETED and h.job("a").done_iterations == 100.0
    assert launches(actions) == [launch("b", (0, 1, 2, 3), 0.0, 0)]  # b (10 s) beats c (50 s)


def test_eviction_during_loading_counts_futile_time():
    h = Harness("srtf")
    h.submit("a", 4, 1000, 0.0)
    assert h.job("a").state is S.LOADING
    assert h.submit("b", 4, 10, 4.0) == [Preempt("a")]
    a = h.job("a")
    assert a.state is S.PAUSING
    assert a.acct.futile_time == pytest.approx(4.0) and a.acct.futile_preemptions == 1
    assert a.acct.load_time == pytest.approx(4.0) and a.acct.preemptions == 1
    assert h.paused("a", 0.0, 4.0) == [launch("b", (0, 1, 2, 3), 0.0, 0)]
    assert a.state is S.PREEMPTED and a.checkpoint_iterations == 0.0


def test_eviction_while_running_is_not_futile():
    h = Harness("srtf")
    h.submit("a", 4, 1000, 0.0)
    h.started("a", 10.0)
    h.submit("b", 4, 10, 11.0)
    a = h.job("a")
    assert a.acct.preemptions == 1 and a.acct.futile_preemptions == 0 and a.acct.futile_time == 0.0


# ------------------------------------------------------------------ cancel, failure


def test_cancel_a_queued_job_needs_no_action():
    h = Harness()
    h.submit("a", 4, 100, 0.0)
    h.submit("b", 4, 100, 1.0)
    h.started("a", 10.0)
    assert h.cancel("b", 5.0) == []
    b = h.job("b")
    assert b.state is S.CANCELLED and b.reason == "cancelled" and b.acct.finish_time == 5.0
    assert b.acct.wait_time == pytest.approx(4.0)
    assert h.engine.queue_length == 0 and list(h.engine.queued()) == []
    # the cancelled job never starts later
    assert h.finished("a", 100.0) == []


def test_cancel_a_running_job_kills_it_and_reuses_its_gpus():
    h = Harness()
    h.submit("a", 4, 100, 0.0)
    h.started("a", 10.0)
    h.submit("b", 4, 100, 1.0)
    actions = h.cancel("a", 20.0)
    assert actions == [Kill("a"), launch("b", (0, 1, 2, 3), 0.0, 0)]
    assert h.job("a").state is S.CANCELLED and h.job("a").gpus == ()
    assert h.job("a").acct.run_time == pytest.approx(10.0)


def test_cancel_a_pausing_job_kills_it():
    h = Harness("srtf")
    h.submit("a", 4, 1000, 0.0)
    h.started("a", 10.0)
    h.submit("b", 4, 10, 20.0)
    actions = h.cancel("a", 21.0)
    assert actions == [Kill("a"), launch("b", (0, 1, 2, 3), 0.0, 0)]
    assert h.job("a").state is S.CANCELLED
    assert h.paused("a", 10.0, 25.0) == []  # its late pause is stale
    assert h.job("a").state is S.CANCELLED


def test_cancel_twice_or_unknown_is_ignored_and_logged():
    h = Harness()
    h.submit("a", 1, 10, 0.0)
    h.cancel("a", 1.0)
    assert h.cancel("a", 2.0) == []
    assert h.cancel("ghost", 3.0) == []
    assert "ignored CancelRequested" in h.engine.explain("a")[-1].message
    assert any(e.stimulus_id.startswith("cancel-ghost") and "ignored" in e.message for e in h.engine.log)


def test_failure_frees_gpus_and_launches_the_next():
    h = Harness()
    h.submit("a", 4, 100, 0.0)
    h.submit("b", 4, 100, 1.0)
    h.started("a", 10.0)
    actions = h.failed("a", 30.0, reason="exit code 1")
    assert actions == [launch("b", (0, 1, 2, 3), 0.0, 0)]
    a = h.job("a")
    assert a.state is S.FAILED and a.reason == "exit code 1" and a.gpus == () and a.acct.finish_time == 30.0
    assert h.failed("a", 31.0) == []  # already terminal: ignored
    assert a.state is S.FAILED


def test_failure_of_a_queued_job_removes_it_from_the_queue():
    h = Harness()
    h.submit("a", 4, 100, 0.0)
    h.submit("b", 4, 100, 1.0)
    assert h.failed("b", 2.0, reason="bad image") == []
    assert h.job("b").state is S.FAILED and h.engine.queue_length == 0


def test_requeue_failure_resumes_from_the_checkpoint_without_failing():
    h = Harness()
    h.submit("a", 4, 100, 0.0)
    h.started("a", 10.0)
    # the job saved a checkpoint at 40 and gave its GPUs back on its own; it is relaunched at once
    assert h.paused("a", 40.0, 50.0) == [launch("a", (0, 1, 2, 3), 40.0, 1)]
    h.started("a", 60.0)
    h.report("a", 70.0, 1.0, 90.0)
    actions = h.failed("a", 95.0, reason="neighbour crashed the MPS server", requeue=True)
    assert actions == [launch("a", (0, 1, 2, 3), 40.0, 2)]  # from the checkpoint, not from 70
    a = h.job("a")
    assert a.state is S.LOADING and a.restarts == 3
    assert a.done_iterations == 40.0 and a.checkpoint_iterations == 40.0
    assert a.acct.finish_time is None and a.reason == ""
    assert "requeued, not charged" in " ".join(e.message for e in h.engine.explain("a"))


def test_requeue_failure_of_a_job_already_requeued_does_not_fail_it():
    """Regression: a node loss requeues both MPS neighbours; the late requeue=True report must not FAIL one."""
    h = Harness(nodes=(("n0", 2), ("n1", 2)))
    h.submit("a", 4, 100, 0.0)
    h.started("a", 10.0)
    h.lose("n1", 20.0)
    assert h.job("a").state is S.PREEMPTED
    assert h.failed("a", 21.0, reason="MPS server died", requeue=True) == []
    a = h.job("a")
    assert a.state is S.PREEMPTED and a.acct.finish_time is None
    assert [j.job_id for j in h.engine.queued()] == ["a"]
    assert "ignored JobFailed" in h.engine.explain("a")[-1].message
    # it still runs once the node is back
    assert launches(h.join("n1", 2, 30.0)) == [launch("a", (2, 3, 0, 1), 0.0, 1)]


def test_finish_reported_while_loading_completes_the_job():
    """Regression: a JobFinished whose JobStarted never arrived crashed mid-update (LOADING -> COMPLETED)."""
    h = Harness()
    h.submit("a", 2, 10, 0.0)
    h.submit("b", 4, 10, 0.0)
    actions = h.finished("a", 30.0)
    a = h.job("a")
    assert a.state is S.COMPLETED and a.gpus == () and a.done_iterations == 10.0
    assert a.acct.finish_time == 30.0
    assert a.acct.load_time + a.acct.run_time == pytest.approx(30.0)
    assert actions == [launch("b", (0, 1, 2, 3), 0.0, 0)]


# ------------------------------------------------------------------ nodes


def test_node_lost_requeues_its_jobs_from_checkpoint_and_stops_using_its_gpus():
    h = Harness(nodes=(("n0", 4), ("n1", 4)))
    h.submit("a", 2, 100, 0.0)  # n0: GPUs 0,1 (best fit; ties go to the first node)
    h.submit("b", 6, 100, 0.0)  # n1 whole + n0's remaining 2
    assert h.job("a").gpus == (0, 1)
    assert set(h.job("b").gpus) == {2, 3, 4, 5, 6, 7}
    h.started("a", 10.0)
    h.started("b", 10.0)
    h.paused("b", 30.0, 40.0)  # b checkpoints at 30 and is relaunched straight away
    h.started("b", 50.0)
    h.report("b", 45.0, 1.0, 65.0)

    actions = h.lose("n1", 70.0)
    assert Kill("b") in actions  # its workers on n0 must stop too
    assert not any(isinstance(x, Kill) and x.job_id == "a" for x in actions)
    b = h.job("b")
    assert b.state is S.PREEMPTED and b.gpus == () and b.done_iterations == 30.0
    assert h.job("a").state is S.RUNNING
    assert h.state.total_gpus == 4 and h.state.free_by_node == {"n0": 2, "n1": 0}
    assert h.engine.pending_reason("b").startswith("Unschedulable")
    # a 2-GPU job takes n0's free GPUs, never n1's
    assert h.submit("d", 2, 10, 71.0) == [launch("d", (2, 3), 0.0, 0)]
    h.finished("a", 110.0)
    used = {g for j in h.state.jobs.values() for g in j.gpus}
    assert not used & gpus_of_node(h, "n1")
    assert h.lose("n1", 120.0) == []  # already lost: nothing happens
    assert h.lose("nowhere", 120.0) == []


def test_node_lost_during_loading_requeues_without_counting_a_preemption():
    h = Harness(nodes=(("n0", 2),))
    h.submit("a", 2, 100, 0.0)
    assert h.lose("n0", 5.0) == [Kill("a")]
    a = h.job("a")
    assert a.state is S.PREEMPTED and a.acct.load_time == pytest.approx(5.0)
    assert a.acct.preemptions == 0 and a.acct.futile_time == 0.0
    assert h.started("a", 10.0) == []  # stale
    assert a.state is S.PREEMPTED


def test_node_joined_runs_a_previously_unschedulable_job():
    h = Harness(nodes=(("n0", 2),))
    assert h.submit("big", 4, 100, 0.0) == []
    assert h.engine.pending_reason("big") == "Unschedulable (needs 4 GPUs, cluster has 2)"
    actions = h.join("n1", 2, 50.0)
    assert len(launches(actions)) == 1
    (launch,) = launches(actions)
    assert launch.job_id == "big" and sorted(launch.gpus) == [0, 1, 2, 3] and launch.resume_from == 0.0
    assert h.job("big").acct.wait_time == pytest.approx(50.0)


def test_rejoined_node_is_used_again():
    h = Harness(nodes=(("n0", 2), ("n1", 2)))
    h.lose("n1", 1.0)
    h.submit("a", 4, 10, 2.0)
    assert h.join("n1", 2, 3.0) == [launch("a", (2, 3, 0, 1), 0.0, 0)]
    with pytest.raises(ValueError):
        h.join("n1", 2, 4.0)  # already alive


# ------------------------------------------------------------------ stale events, errors


@pytest.mark.parametrize("setup", ["queued", "running", "completed", "unknown"])
def test_stale_job_events_are_ignored_and_logged(setup):
    h = Harness()
    h.submit("a", 4, 100, 0.0)  # a takes the cluster
    h.submit("q", 4, 100, 0.0)  # q waits
    target = {"queued": "q", "running": "a", "completed": "a", "unknown": "zz"}[setup]
    h.started("a", 10.0)
    if setup == "completed":
        h.finished("a", 20.0)
        target = "a"
    before = {j: (x.state, x.gpus, x.since) for j, x in h.state.jobs.items()}
    log_before = len(h.engine.log)
    events = [ev.JobStarted(f"stale-started-{setup}", target)]
    if setup != "running":
        events += [
            ev.JobFinished(f"stale-finished-{setup}", target),
            ev.JobPaused(f"stale-paused-{setup}", target, 5.0),
        ]
    for e in events:
        assert h(e, 30.0) == []
    after = {j: (x.state, x.gpus, x.since) for j, x in h.state.jobs.items()}
    assert after == before
    new = list(h.engine.log)[log_before:]
    assert [x.stimulus_id for x in new] == [e.stimulus_id for e in events]
    assert all(x.message.startswith(f"ignored {type(e).__name__}") for x, e in zip(new, events))


def test_stale_tick_is_ignored_and_logged():
    h = Harness("srtf@60", nodes=(("n0", 1),))
    (t1,) = [a for a in h.submit("a", 1, 1000, 0.0) if isinstance(a, ScheduleTimer)]
    assert t1.at == 60.0
    assert h(ev.Tick("wrong", t1.key + 7), 30.0) == []  # a key never issued
    assert h.job("a").state is S.PENDING
    assert h(ev.Tick("t1", t1.key), 60.0) == [launch("a", (0,), 0.0, 0)]
    (t2,) = [x for x in h.submit("b", 1, 10, 61.0) if isinstance(x, ScheduleTimer)]
    assert (t2.at, t2.key > t1.key) == (120.0, True)
    before = {j: (x.state, x.gpus, x.since) for j, x in h.state.jobs.items()}
    assert h(ev.Tick("t1-late", t1.key), 70.0) == []  # the old timer delivered again
    assert {j: (x.state, x.gpus, x.since) for j, x in h.state.jobs.items()} == before
    last = h.engine.log[-1]
    assert last.stimulus_id == "t1-late" and last.message.startswith("ignored Tick")
    assert any(e.stimulus_id == "wrong" and "ignored" in e.message for e in h.engine.log)
    # the live key still acts (b is shorter than a's remaining time: a is preempted)
    assert without_timers(h(ev.Tick("t2", t2.key), 120.0)) == [Preempt("a")]
    assert h(ev.Tick("t2-again", t2.key), 121.0) == []  # fired once only


def test_duplicate_submit_raises_and_changes_nothing():
    h = Harness()
    h.submit("a", 4, 100, 0.0)
    h.submit("b", 4, 100, 0.0)
    with pytest.raises(ValueError, match="already exists"):
        h.submit("b", 1, 10, 1.0)
    assert h.engine.queue_length == 1 and h.job("b").spec.gpus == 4
    h.state.validate()


# ------------------------------------------------------------------ queries


def test_pending_reasons():
    h = Harness(nodes=(("n0", 4),))
    h.submit("run", 4, 100, 0.0)
    h.submit("huge", 8, 100, 1.0)
    h.submit("head", 2, 100, 2.0)
    h.submit("behind", 1, 100, 3.0)
    h.started("run", 10.0)
    r = h.engine.pending_reason
    assert r("run") == ""
    assert r("huge") == "Unschedulable (needs 8 GPUs, cluster has 4)"
    assert r("head") == "Resources"  # only an unschedulable job is ahead of it
    assert r("behind") == "Priority"
    h.finished("run", 50.0)
    assert h.job("head").state is S.LOADING and h.job("behind").state is S.LOADING
    assert r("head") == "" and r("behind") == ""
    assert r("huge").startswith("Unschedulable")


def test_explain_returns_the_jobs_decisions_with_their_stimuli():
    h = Harness("srtf")
    h.submit("long", 4, 1000, 0.0)
    h.started("long", 10.0)
    h.submit("short", 4, 100, 100.0)
    h.paused("long", 90.0, 105.0)
    log = h.engine.explain("long")
    assert [e.stimulus_id for e in log] == ["submit-long-2", "submit-long-2", "started-long-3", "submit-short-4", "paused-long-5"]
    assert all(e.job_id == "long" for e in log)
    assert [e.time for e in log] == [0.0, 0.0, 10.0, 100.0, 105.0]
    assert log[0].message.startswith("submitted")
    assert log[1].message.startswith("start on GPUs 0,1,2,3")
    assert "preempted for short" in log[3].message
    assert "checkpointed at 90" in log[4].message
    short = h.engine.explain("short")
    assert [e.stimulus_id for e in short] == ["submit-short-4", "paused-long-5"]  # started by long's pause
    assert h.engine.explain("nobody") == []


def test_log_is_bounded():
    h = Harness(log_size=5)
    for i in range(10):
        h.submit(f"j{i}", 8, 10, float(i))  # unschedulable: one log line each
    assert len(h.engine.log) == 5
    assert [e.job_id for e in h.engine.log] == [f"j{i}" for i in range(5, 10)]
    assert h.engine.explain("j0") == []


def test_multi_node_gpu_listing_in_the_log_is_compact():
    h = Harness(nodes=tuple((f"n{i}", 4) for i in range(3)))
    h.submit("a", 12, 10, 0.0)
    msg = h.engine.explain("a")[-1].message
    assert "(12)" in msg and ".." in msg
