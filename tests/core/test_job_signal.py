"""`--signal [B:]SIG[@SECONDS]` in the engine (issue 22, point 7): SIG is due SECONDS before each run's time limit,
once per run, and armed again for the run after a requeue; and its text as `mesh submit` and meshd read it."""

from __future__ import annotations

import signal

import pytest

from meshsched import events as ev
from meshsched.actions import Launch, Preempt, ScheduleTimer, SignalJob
from meshsched.executor import ACTION_TYPES
from meshsched.state import JobSpec, JobState
from meshsched.wire.jobsignal import parse_job_signal
from tests.support.engine import Harness

USR1 = int(signal.SIGUSR1)


def _submit(h: Harness, job_id: str, now: float, limit: float | None = 100.0, before: float = 30.0) -> list:
    spec = JobSpec(job_id, 1, "m", 100, 10_000, submit_time=now, time_limit=limit, signal=USR1, signal_time=before)
    return h(ev.JobSubmitted(h.sid(f"submit-{job_id}"), spec), now)


def _tick(h: Harness, now: float) -> list:
    return h(ev.Tick(h.sid("tick"), h.engine.timers.key), now)


def _timers(actions: list) -> list[float]:
    return [a.at for a in actions if isinstance(a, ScheduleTimer)]


def test_the_signal_is_due_before_the_limit_once_per_run_and_again_after_a_requeue():
    h = Harness()
    assert _timers(_submit(h, "a", 0.0)) == [70.0]  # launched at 0: the warning at 100 - 30 comes first
    h.started("a", 1.0)
    out = _tick(h, 70.0)
    assert [a for a in out if isinstance(a, SignalJob)] == [SignalJob("a", USR1)]
    assert not [a for a in out if isinstance(a, (Preempt, Launch))] and h.job("a").state is JobState.RUNNING
    assert _timers(out) == [100.0]  # then the limit itself
    assert [a for a in _tick(h, 99.0) if isinstance(a, SignalJob)] == []  # once per run
    # a requeue before the limit: the new run gets its own warning, 30 s before its own limit
    h(ev.RequeueRequested(h.sid("rq"), "a"), 99.5)
    out = h.paused("a", 10.0, 99.6)
    assert [a.job_id for a in out if isinstance(a, Launch)] == ["a"] and _timers(out) == [99.6 + 70.0]
    h.started("a", 100.0)
    out = _tick(h, 99.6 + 70.0)
    assert [a for a in out if isinstance(a, SignalJob)] == [SignalJob("a", USR1)]
    out = _tick(h, 199.6)
    assert [type(a) for a in out if isinstance(a, (Preempt, SignalJob))] == [Preempt]
    h.paused("a", 20.0, 200.0)
    assert h.job("a").state is JobState.TIMEOUT


def test_a_limit_shorter_than_the_warning_signals_at_once_and_no_limit_never():
    h = Harness()
    assert _timers(_submit(h, "a", 0.0, limit=10.0)) == [0.0]  # due at the launch
    assert [a for a in _tick(h, 0.0) if isinstance(a, SignalJob)] == [SignalJob("a", USR1)]
    h2 = Harness()
    assert _timers(_submit(h2, "b", 0.0, limit=None)) == []  # no time limit: nothing to warn of


def test_a_finished_job_is_not_signalled():
    h = Harness()
    _submit(h, "a", 0.0)
    h.finished("a", 5.0)
    assert h.engine.timers.at is None and _tick(h, 70.0) == []


def test_every_executor_knows_the_action():
    assert SignalJob in ACTION_TYPES


@pytest.mark.parametrize("text, canonical", [
    ("USR1@3", "SIGUSR1@3"), ("SIGUSR2", "SIGUSR2@60"), ("B:10@90", "B:SIGUSR1@90"), ("b:term@0", "B:SIGTERM@0"),
])  # fmt: skip
def test_the_text_as_sbatch_takes_it(text, canonical):
    assert parse_job_signal(text).text == canonical


@pytest.mark.parametrize("bad", ["", "NOPE", "USR1@", "USR1@-1", "USR1@x", "USR1@70000", "R:USR1", "X:USR1",
                                 "KILL@5", "999"])
def test_a_bad_text_says_why(bad):
    with pytest.raises(ValueError):
        parse_job_signal(bad)
