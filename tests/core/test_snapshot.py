"""meshsched.snapshot: an engine's state encoded mid-workload and decoded into a fresh engine decides everything
after it exactly as the engine that never stopped (actions and final state), for several policies and seeds."""

from __future__ import annotations

import json

import pytest

from meshsched import events as ev
from meshsched import snapshot
from meshsched.state import JobSpec, JobState, NodeSpec
from tests.support.workload import engine, record

POLICIES = ("fifo", "sjf", "srtf", "castor")


def _through_json(data: dict) -> dict:
    return json.loads(json.dumps(data))


def _resumed(policy: str, fed, cut: int):
    """An engine fed `fed[:cut]`, snapshotted, and decoded (through JSON) into a fresh engine."""
    first = engine(policy)
    for event, now in fed[:cut]:
        first.handle(event, now)
    data = _through_json(snapshot.encode(first))
    again = snapshot.decode(data, engine(policy))
    assert snapshot.encode(again) == data  # decode then encode gives the same data
    return again


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(4))
def test_every_decision_after_a_snapshot_is_the_same(policy, seed):
    run = record(policy, seed, jobs=40)
    fed, want = run.fed, run.actions
    assert len(fed) > 100 and any(j.state is JobState.COMPLETED for j in run.engine.state.jobs.values())
    for cut in (len(fed) // 4, len(fed) // 2, 3 * len(fed) // 4):
        again = _resumed(policy, fed, cut)
        for i in range(cut, len(fed)):
            event, now = fed[i]
            got = again.handle(event, now)
            assert got == want[i], f"{policy} seed {seed}: event {i} ({type(event).__name__}) after a snapshot at {cut}"
            again.state.validate()
        assert snapshot.encode(again) == snapshot.encode(run.engine)
        assert [j.acct for j in again.state.jobs.values()] == [j.acct for j in run.engine.state.jobs.values()]


def test_the_workload_reaches_what_a_snapshot_must_carry():
    """The round trip above is only as good as its workload: it holds job control, drains and a lost node."""
    run = record("srtf", 1, jobs=40)
    kinds = {type(e).__name__ for e, _ in run.fed}
    assert {"HoldRequested", "ReleaseRequested", "DrainChanged", "NodeLost", "JobPaused", "Tick"} <= kinds
    mid = engine("srtf")
    seen = {"blocked": False, "limits": False, "deferred_or_timer": False, "queue": False}
    for event, now in run.fed:
        mid.handle(event, now)
        seen["blocked"] |= bool(mid.control.blocked)
        seen["limits"] |= bool(mid.control.limits)
        seen["deferred_or_timer"] |= mid.timers.at is not None
        seen["queue"] |= len(mid.waiting) > 1
    assert all(seen.values()), seen


def test_a_periodic_policy_is_refused_in_one_line():
    eng = engine("srtf@360")
    why = snapshot.refusal(eng)
    assert why is not None and "\n" not in why and "srtf@360" in why
    with pytest.raises(snapshot.SnapshotError, match="periodic"):
        snapshot.encode(eng)


@pytest.mark.parametrize("bad, match", [
    ({"version": 99}, "version 99"),
    ("not a dict", "version None"),
])
def test_a_snapshot_of_another_version_is_refused(bad, match):
    with pytest.raises(snapshot.SnapshotError, match=match):
        snapshot.decode(bad, engine("fifo"))


def test_a_damaged_snapshot_is_refused_in_one_line_not_a_traceback():
    eng = engine("fifo")
    eng.handle(ev.NodeJoined("j", NodeSpec("n0", 4, "v100", 16384)), 0.0)
    eng.handle(ev.JobSubmitted("s", JobSpec("a", 2, "resnet18", 64, 100)), 1.0)
    data = _through_json(snapshot.encode(eng))
    del data["jobs"][0]["spec"]
    with pytest.raises(snapshot.SnapshotError, match="unreadable snapshot") as info:
        snapshot.decode(data, engine("fifo"))
    assert "\n" not in str(info.value)
    data = _through_json(snapshot.encode(eng))
    with pytest.raises(snapshot.SnapshotError, match="policy 'fifo', this engine runs 'sjf'"):
        snapshot.decode(data, engine("sjf"))
    with pytest.raises(snapshot.SnapshotError, match="fresh engine"):
        snapshot.decode(data, eng)


def test_every_field_of_a_job_is_in_the_snapshot():
    """A field added to Job (or JobSpec, or job control's tables) must be added to the snapshot too."""
    from dataclasses import fields

    from meshsched.state import Job, JobSpec

    eng = engine("fifo")
    eng.handle(ev.NodeJoined("j", NodeSpec("n0", 4, "v100", 16384)), 0.0)
    eng.handle(ev.JobSubmitted("s", JobSpec("a", 2, "resnet18", 64, 100)), 1.0)
    data = snapshot.encode(eng)
    assert set(data["jobs"][0]) == {f.name for f in fields(Job)}
    assert set(data["jobs"][0]["spec"]) == {f.name for f in fields(JobSpec)}
    assert set(data["control"]) == set(vars(eng.control)) - {"state", "hooks", "ended"}
