"""Retention in the engine (issue 23, point 6): `JobsForgotten` drops ended jobs from the state, and a queued job
whose dependency names a forgotten job still resolves as job control's rules say: a dependency the forgotten job met
stays met (the dependent runs once released), one it never will meet stays unmet (DependencyNeverSatisfied)."""

from __future__ import annotations

from meshsched import events as ev
from meshsched.actions import Launch
from meshsched.jobcontrol import NEVER
from meshsched.state import Dependency, DependencyKind, JobSpec, JobState
from tests.support.engine import Harness

OK, NOTOK = DependencyKind.AFTEROK, DependencyKind.AFTERNOTOK


def submit(h: Harness, job_id: str, now: float, held: bool = False, deps: tuple = ()) -> list:
    spec = JobSpec(job_id, 1, "m", 100, 100, submit_time=now, dependencies=tuple(Dependency(k, j) for k, j in deps))
    return h(ev.JobSubmitted(h.sid(f"submit-{job_id}"), spec, held=held), now)


def forget(h: Harness, now: float, *job_ids: str) -> list:
    return h(ev.JobsForgotten(h.sid("forget"), job_ids), now)


def test_forgotten_jobs_leave_the_state_and_unended_ones_stay():
    h = Harness()
    submit(h, "a", 0.0)
    submit(h, "b", 0.0)
    h.started("a", 1.0)
    h.finished("a", 5.0)
    forget(h, 10.0, "a", "b", "nosuch")
    assert "a" not in h.state.jobs and h.state.jobs["b"].state is JobState.LOADING


def test_a_dependency_a_forgotten_job_met_stays_met():
    h = Harness()
    submit(h, "a", 0.0)
    submit(h, "b", 0.0, held=True, deps=[(OK, "a")])
    h.started("a", 1.0)
    h.finished("a", 5.0)  # b stays held, its dependency met
    forget(h, 10.0, "a")
    assert h.job("b").spec.dependencies == ()
    out = h(ev.ReleaseRequested(h.sid("release"), "b"), 11.0)
    assert [a.job_id for a in out if isinstance(a, Launch)] == ["b"]


def test_a_dependency_a_forgotten_job_never_met_is_never_satisfied():
    h = Harness()
    submit(h, "a", 0.0)
    submit(h, "c", 0.0, held=True, deps=[(NOTOK, "a")])
    h.started("a", 1.0)
    h.finished("a", 5.0)  # afternotok on a completed job: never met
    forget(h, 10.0, "a")
    h(ev.ReleaseRequested(h.sid("release"), "c"), 11.0)
    assert h.job("c").state is JobState.CANCELLED and h.job("c").reason == NEVER
