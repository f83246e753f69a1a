"""Engine.handle_many (issue 22 point 8, bulk speed): events that happened together get ONE scheduling pass.

An array submitted in one batch ends as it would submitted one task at a time (same launches in the same order, same
states, same pending reasons); a stack where that would not hold gets the passes one by one; a batch of cancels
starts no task it then cancels.
"""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.actions import Kill, Launch
from meshsched.engine import Engine
from meshsched.policies.registry import make_policy
from meshsched.policies.stack import PolicyStack
from meshsched.state import JobSpec, JobState, NodeSpec


class FixedEstimator:
    def step_time(self, spec, gpu_type, placement, exec=None):
        return 1.0


def cluster(policy: str) -> Engine:
    """Two 4-GPU nodes: a 4-GPU job running, a 2-GPU one running, older jobs queued (one too big to start now)."""
    eng = Engine(make_policy(policy), FixedEstimator())
    eng.handle(ev.NodeJoined("n1", NodeSpec("a", 4, "fake", 1000)), 0.0)
    eng.handle(ev.NodeJoined("n2", NodeSpec("b", 4, "fake", 1000)), 0.0)
    for i, (gpus, iters) in enumerate([(4, 500), (2, 400), (4, 300), (1, 900)]):
        eng.handle(ev.JobSubmitted(f"s{i}", JobSpec(f"old{i}", gpus, "m", 32, iters, submit_time=1.0)), 1.0)
    return eng


def array(head: str, tasks: int, limit: int = 0, gpus: int = 1, held: bool = False) -> list[ev.JobSubmitted]:
    return [ev.JobSubmitted(f"a{head}-{t}", JobSpec(f"{head}_{t}", gpus, "m", 32, 200, submit_time=5.0,
                                                     array_id=head, array_limit=limit), held=held)
            for t in range(tasks)]


def outcome(eng: Engine, actions: list) -> tuple:
    launches = [(a.job_id, a.gpus) for a in actions if isinstance(a, Launch)]
    jobs = eng.state.jobs
    return (launches, {j: (job.state, job.gpus, eng.pending_reason(j)) for j, job in jobs.items()},
            [j for _, _, j in eng.waiting.entries], dict(eng.control.blocked))


def passes(monkeypatch) -> list:
    calls: list = []
    real = PolicyStack.schedule
    monkeypatch.setattr(PolicyStack, "schedule", lambda self, view, now, trigger: calls.append(trigger) or real(
        self, view, now, trigger))
    return calls


@pytest.mark.parametrize("policy", ["sjf", "fifo", "sjf-strict"])
@pytest.mark.parametrize("limit,gpus,held", [(0, 1, False), (3, 1, False), (0, 2, False), (0, 1, True)])
def test_an_array_in_one_batch_ends_as_submitted_task_by_task_with_one_pass(policy, limit, gpus, held,
                                                                            monkeypatch):
    one_by_one, batch = cluster(policy), cluster(policy)
    events = array("9", 12, limit, gpus, held)
    old = [a for e in events for a in one_by_one.handle(e, 6.0)]
    calls = passes(monkeypatch)
    new = batch.handle_many(events, 6.0)
    assert outcome(batch, new) == outcome(one_by_one, old)
    assert len(calls) <= 1  # one pass for the whole array (none when job control kept every task out)
    if policy == "sjf" and not held and gpus == 1:  # (backfilled beside the 4-GPU job that waits)
        assert any(isinstance(a, Launch) for a in new)
    assert set(batch.take_changed()) >= {e.spec.job_id for e in events}


@pytest.mark.parametrize("policy", ["srtf", "lazer"])
def test_a_stack_where_one_pass_could_decide_otherwise_gets_the_passes_one_by_one(policy, monkeypatch):
    one_by_one, batch = cluster(policy), cluster(policy)
    events = array("9", 6)
    old = [a for e in events for a in one_by_one.handle(e, 6.0)]
    calls = passes(monkeypatch)
    new = batch.handle_many(events, 6.0)
    assert outcome(batch, new) == outcome(one_by_one, old)
    assert [e[1:] for e in batch.log] == [e[1:] for e in one_by_one.log]
    assert len(calls) == len(events)


def test_tasks_unlike_each_other_get_the_passes_one_by_one(monkeypatch):
    """A bigger job arriving after a smaller one would take the GPUs first in one pass: not batched."""
    one_by_one, batch = cluster("sjf"), cluster("sjf")
    events = [ev.JobSubmitted("x", JobSpec("x", 1, "m", 32, 900, submit_time=5.0)),
              ev.JobSubmitted("y", JobSpec("y", 2, "m", 32, 100, submit_time=5.0))]
    old = [a for e in events for a in one_by_one.handle(e, 6.0)]
    calls = passes(monkeypatch)
    assert outcome(batch, batch.handle_many(events, 6.0)) == outcome(one_by_one, old)
    assert len(calls) == 2


def test_cancelling_a_throttled_array_in_one_batch_launches_none_of_its_tasks(monkeypatch):
    """One by one, each running task's cancel frees a slot and a GPU, and the next task starts only to be killed
    by the next cancel; in one batch every task is cancelled first, and one pass follows."""
    for way in ("one by one", "batch"):
        eng = Engine(make_policy("sjf"), FixedEstimator())
        eng.handle(ev.NodeJoined("n1", NodeSpec("a", 4, "fake", 1000)), 0.0)
        for e in array("9", 8, limit=2):
            eng.handle(e, 1.0)
        assert [j for j, job in eng.state.jobs.items() if job.state is JobState.LOADING] == ["9_0", "9_1"]
        cancels = [ev.CancelRequested(f"c{t}", f"9_{t}") for t in range(8)]
        calls = passes(monkeypatch)
        if way == "batch":
            actions = eng.handle_many(cancels, 2.0)
            assert not any(isinstance(a, Launch) for a in actions) and len(calls) == 1
        else:
            actions = [a for e in cancels for a in eng.handle(e, 2.0)]
            assert any(isinstance(a, Launch) for a in actions)  # what the batch spares
        assert {a.job_id for a in actions if isinstance(a, Kill)} >= {"9_0", "9_1"}
        assert all(job.state is JobState.CANCELLED for job in eng.state.jobs.values())
        monkeypatch.undo()


def test_cancelling_queued_jobs_in_one_batch_ends_as_one_by_one():
    one_by_one, batch = cluster("sjf"), cluster("sjf")
    for eng in (one_by_one, batch):
        for e in array("9", 5):
            eng.handle(e, 6.0)
    cancels = [ev.CancelRequested(f"c{j}", j) for j in ("old2", "9_4", "9_3", "nosuch")]
    old = [a for e in cancels for a in one_by_one.handle(e, 7.0)]
    assert outcome(batch, batch.handle_many(cancels, 7.0)) == outcome(one_by_one, old)
