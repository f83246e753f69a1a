"""Drain and resume in the engine (issue 23, point 4): a drained GPU gets no new job and no partner, a job
running there finishes, a resume starts placement again, and the pending reason says why a job waits."""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.actions import Launch
from meshsched.state import JobState
from tests.support.engine import Harness


def drain(h: Harness, node: str, now: float, gpus: tuple[int, ...] = (), on: bool = True) -> list:
    return h(ev.DrainChanged(h.sid("drain"), node, gpus, on, "driver update", "root"), now)


def launches(actions) -> dict[str, tuple[int, ...]]:
    return {a.job_id: a.gpus for a in actions if isinstance(a, Launch)}


def test_drained_node_gets_no_new_job_running_finishes_resume_places():
    h = Harness("fifo", nodes=(("n0", 2), ("n1", 2)))
    h.submit("a", 2, 100, 0.0)
    placed = h.job("a").gpus
    busy = h.state.gpus[placed[0]].node
    other = "n1" if busy == "n0" else "n0"
    drain(h, busy, 1.0)
    drain(h, other, 1.0)
    assert h.engine.drains.status(busy)["state"] == "DRAINING"
    assert h.engine.drains.status(other)["state"] == "DRAINED"
    h.started("a", 2.0)
    assert launches(h.submit("b", 1, 100, 3.0)) == {}
    assert h.engine.pending_reason("b").startswith("waiting: node ")
    assert launches(h.finished("a", 4.0)) == {}  # its GPUs come free, but they are drained
    assert h.job("a").state is JobState.COMPLETED
    assert h.job("b").state is JobState.PENDING
    assert h.engine.drains.status(busy)["state"] == "DRAINED"
    started = launches(drain(h, other, 5.0, on=False))  # a resume runs a pass
    assert set(started) == {"b"}
    assert {h.state.gpus[g].node for g in started["b"]} == {other}
    assert h.engine.drains.status(other) is None


def test_drained_gpu_is_skipped_on_its_node():
    h = Harness("fifo", nodes=(("n0", 4),))
    drain(h, "n0", 0.0, gpus=(0, 2))
    started = launches(h.submit("a", 2, 100, 1.0))
    assert sorted(h.state.gpus[g].local_index for g in started["a"]) == [1, 3]
    assert launches(h.submit("b", 1, 100, 2.0)) == {}
    assert h.engine.drains.status("n0")["gpus"] == [0, 2]
    started = launches(drain(h, "n0", 3.0, gpus=(2,), on=False))  # a partial resume
    assert [h.state.gpus[g].local_index for g in started["b"]] == [2]
    assert h.engine.drains.status("n0")["gpus"] == [0]


@pytest.mark.parametrize("policy", ["castor", "srtf", "sjf"])
def test_no_start_or_partner_on_a_drained_gpu(policy):
    h = Harness(policy, nodes=(("n0", 2),))
    h.submit("a", 2, 1000, 0.0)
    h.started("a", 1.0)
    drain(h, "n0", 2.0)
    for i, t in enumerate((3.0, 4.0, 5.0)):
        assert launches(h.submit(f"q{i}", 1, 10, t)) == {}
    assert all(not h.job(f"q{i}").gpus for i in range(3))
