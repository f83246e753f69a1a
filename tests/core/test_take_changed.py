"""`Engine.take_changed()`: every job whose record (what meshd mirrors) changed in an event is listed, once, in
the order first changed. Checked by diffing every job before and after each event: job control on a bare
engine, then replays with preemption, GPU sharing and a calibration layer."""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.loaders.profiles import installed_handle
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import simulate
from meshsched.state import Dependency, DependencyKind, JobSpec
from tests.support.engine import Harness
from tests.support.sim import perf_model, philly, v100

MIRRORED = ("state", "reason", "gpus", "restarts", "done_iterations", "checkpoint_iterations", "step_time", "exec",
            "exec_pending", "held", "time_limit_at", "calibration", "deferred_until", "progress_time", "spec")


def _snapshot(engine) -> dict[str, tuple]:
    return {j: tuple(getattr(job, f) for f in MIRRORED) for j, job in engine.state.jobs.items()}


class Differ:
    """After each event: the jobs that changed must all be in `take_changed()`, listed once each."""

    def __init__(self) -> None:
        self.before: dict[str, tuple] = {}
        self.events = 0

    def __call__(self, engine) -> None:
        now = _snapshot(engine)
        moved = {j for j, v in now.items() if self.before.get(j) != v}
        taken = engine.take_changed()
        assert len(taken) == len(set(taken)), taken
        assert moved <= set(taken), sorted(moved - set(taken))
        assert set(taken) <= set(now)
        self.before = now
        self.events += 1


def test_job_control_moves_are_all_taken():
    h = Harness(nodes=(("n0", 2),))
    differ = Differ()

    def run(event, now):
        h(event, now)
        differ(h.engine)

    def spec(job_id, **kw):
        return JobSpec(job_id, 1, "m", 100, 100, submit_time=0.0, **kw)

    run(ev.JobSubmitted("s1", spec("a", time_limit=50.0)), 0.0)
    run(ev.JobSubmitted("s2", spec("b", dependencies=(Dependency(DependencyKind.AFTEROK, "a"),))), 1.0)
    for t in range(4):
        run(ev.JobSubmitted(f"s3{t}", spec(f"7_{t}", array_id="7", array_limit=1)), 2.0)
    run(ev.JobSubmitted("s4", spec("c", begin_time=30.0)), 3.0)
    run(ev.JobSubmitted("s5", spec("d"), held=True), 4.0)
    run(ev.JobStarted("st", "a"), 5.0)
    run(ev.HoldRequested("h", "7_2"), 6.0)
    run(ev.Tick("t1", h.engine.timers.key), 30.0)
    run(ev.Tick("t2", h.engine.timers.key), 50.0)
    run(ev.JobPaused("p", "a", 40.0), 51.0)  # timed out: b can never run
    run(ev.ReleaseRequested("r", "d"), 52.0)
    run(ev.CancelRequested("c", "7_0"), 53.0)
    assert h.job("b").reason == "DependencyNeverSatisfied" and differ.events == 15
    h.engine.take_changed()
    h.started("7_1", 54.0)
    assert h.engine.take_changed() == ["7_1"] and h.engine.take_changed() == []


@pytest.mark.parametrize("policy", ["srtf", "castor", "castor+gimbal", "lazer"])
def test_replays_take_every_changed_job(policy):
    differ = Differ()
    simulate(philly(60).jobs, make_policy(policy, installed_handle()), perf_model(), v100(1), after_event=differ)
    assert differ.events > 100
