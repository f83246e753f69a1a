"""The engine leaves out a greedy stack's arrival pass, and its pass after GPUs came free, only when that pass would
decide nothing (meshsched.greedy),
an arrival's pass after a settled queue tries the newcomer alone (ClusterView.settled, QueueScheduler._start_arrived),
and SJF's pass reads the queue by GPU count instead of walking it (QueueScheduler._start_by_need): the same events
give the same actions, decision log and job outcomes as every pass walking the whole queue, on random small
workloads that also hold, release, cancel, fail, drain and lose nodes, and on random small replays."""

from __future__ import annotations

import random

import pytest

from meshsched.engine import Engine
from meshsched.loaders.profiles import installed_handle, load_perf_model
from meshsched.policies.base import ClusterView
from meshsched.policies.queue import QueueScheduler
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.state import JobSpec
from tests.support.workload import record


def _counting(monkeypatch) -> list[int]:
    """Count the arrival passes the engine leaves out, the arrival passes that tried the newcomer alone and the
    release passes left out (all on)."""
    skipped = [0, 0, 0]
    real, alone, released = Engine._starts_nothing, QueueScheduler._start_arrived, Engine._releases_nothing

    def counted(self, spec):
        out = real(self, spec)
        skipped[0] += out
        return out

    def tried(self, view, cycle, job_id):
        skipped[1] += 1
        return alone(self, view, cycle, job_id)

    def left_out(self):
        out = released(self)
        skipped[2] += out
        return out

    monkeypatch.setattr(Engine, "_starts_nothing", counted)
    monkeypatch.setattr(QueueScheduler, "_start_arrived", tried)
    monkeypatch.setattr(Engine, "_releases_nothing", left_out)
    return skipped


def _never(monkeypatch) -> None:
    """Every pass run, each walking the whole queue (no index by GPU count: QueueScheduler._start_by_need; no
    newcomer tried alone: the view is never settled)."""
    monkeypatch.setattr(Engine, "_starts_nothing", lambda self, spec: False)
    monkeypatch.setattr(Engine, "_releases_nothing", lambda self: False)
    monkeypatch.setattr(Engine, "_alone_placeable", lambda self, spec: False)
    monkeypatch.setattr(ClusterView, "queue_by_need", lambda self: None)


def _outcome(eng: Engine) -> list:
    return [(j.job_id, j.state, j.gpus, j.acct.first_start, j.acct.finish_time, j.restarts, j.reason)
            for j in eng.state.jobs.values()]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_workload_same_actions_with_and_without_the_skip(monkeypatch, seed):
    with monkeypatch.context() as m:
        skipped = _counting(m)
        fast = record("sjf", seed, 90)
    with monkeypatch.context() as m:
        _never(m)
        full = record("sjf", seed, 90)
    assert min(skipped) > 0  # the workload exercises both skips and the newcomer tried alone
    assert [repr(a) for a in fast.actions] == [repr(a) for a in full.actions]
    assert list(fast.engine.log) == list(full.engine.log)
    assert _outcome(fast.engine) == _outcome(full.engine)


def _trace(rng: random.Random, n: int) -> list[JobSpec]:
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(1 / 40)
        gpus = rng.choice((1, 1, 1, 2, 2, 4, 4, 8, 12, 16, 40))  # 40: larger than the cluster, never runs
        out.append(JobSpec(f"r{i}", gpus, rng.choice(("resnet18", "resnet50", "lm")), 32 * gpus,
                           rng.randrange(50, 4000), submit_time=round(t, 3)))
    return out


@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_replay_same_log_with_and_without_the_skip(monkeypatch, seed):
    perf = load_perf_model()
    jobs = _trace(random.Random(seed), 150)
    cluster = ClusterSpec(3, 8, "v100", perf.gpu_memory_mb("v100"))
    with monkeypatch.context() as m:
        skipped = _counting(m)
        fast = simulate(jobs, make_policy("sjf", installed_handle()), perf, cluster,
                        after_event=lambda e: e.state.validate())
    with monkeypatch.context() as m:
        _never(m)
        full = simulate(jobs, make_policy("sjf", installed_handle()), perf, cluster)
    assert min(skipped) > 0
    assert fast.events == full.events
    assert list(fast.engine.log) == list(full.engine.log)
    assert _outcome(fast.engine) == _outcome(full.engine)


def test_no_skip_under_a_stack_that_is_not_greedy(monkeypatch):
    """fifo (strict: a cancelled head lets the next job start at the next pass), srtf (preemptive): never left out."""
    for name in ("fifo", "srtf", "sjf-strict"):
        eng = Engine(make_policy(name, installed_handle()), None)  # type: ignore[arg-type]
        assert not eng._greedy()
    assert Engine(make_policy("sjf", installed_handle()), None)._greedy()  # type: ignore[arg-type]


def test_no_count_can_start_is_exact_for_one_node_and_bounded_across_nodes():
    """`none_can_start`: a count up to one node fits where a node has that many free; a larger one is ruled out
    when it is over the free total, or when as few nodes as it needs cannot hold it even at the fullest node's
    count; otherwise it may fit (the pass decides)."""
    from meshsched.greedy import none_can_start
    from meshsched.state import ClusterState, NodeSpec

    state = ClusterState()
    for n in ("a", "b", "c"):
        state.add_node(NodeSpec(n, 8, "v100", 32_000))
    assert not none_can_start(state, [8]) and not none_can_start(state, [24]) and none_can_start(state, [25])
    state.assign("x", tuple(range(0, 2)))  # a: 6 free
    state.assign("y", tuple(range(8, 10)))  # b: 6 free
    state.assign("z", tuple(range(16, 18)))  # c: 6 free (18 in all)
    assert none_can_start(state, [7, 16])  # no node has 7; 16 needs 2 nodes, which hold 12 at most
    assert not none_can_start(state, [7, 12])  # 12 fits on two nodes of 6
    assert not none_can_start(state, [16, 6])
    assert none_can_start(state, [19, 40]) and none_can_start(state, [])
    state.assign("w", tuple(range(2, 8)) + tuple(range(10, 16)) + tuple(range(18, 24)))
    assert none_can_start(state, [1])  # nothing free
