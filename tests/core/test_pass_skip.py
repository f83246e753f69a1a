"""The engine leaves out a greedy stack's arrival pass only when that pass would decide nothing (meshsched.greedy),
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
    """Count the passes the engine leaves out and the arrival passes that tried the newcomer alone (both on)."""
    skipped = [0, 0]
    real, alone = Engine._starts_nothing, QueueScheduler._start_arrived

    def counted(self, spec):
        out = real(self, spec)
        skipped[0] += out
        return out

    def tried(self, view, cycle, job_id):
        skipped[1] += 1
        return alone(self, view, cycle, job_id)

    monkeypatch.setattr(Engine, "_starts_nothing", counted)
    monkeypatch.setattr(QueueScheduler, "_start_arrived", tried)
    return skipped


def _never(monkeypatch) -> None:
    """Every pass run, each walking the whole queue (no index by GPU count: QueueScheduler._start_by_need; no
    newcomer tried alone: the view is never settled)."""
    monkeypatch.setattr(Engine, "_starts_nothing", lambda self, spec: False)
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
    assert skipped[0] > 0 and skipped[1] > 0  # the workload exercises the skip and the newcomer tried alone
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
    assert skipped[0] > 0 and skipped[1] > 0
    assert fast.events == full.events
    assert list(fast.engine.log) == list(full.engine.log)
    assert _outcome(fast.engine) == _outcome(full.engine)


def test_no_skip_under_a_stack_that_is_not_greedy(monkeypatch):
    """fifo (strict: a cancelled head lets the next job start at the next pass), srtf (preemptive): never left out."""
    for name in ("fifo", "srtf", "sjf-strict"):
        eng = Engine(make_policy(name, installed_handle()), None)  # type: ignore[arg-type]
        assert not eng._greedy()
    assert Engine(make_policy("sjf", installed_handle()), None)._greedy()  # type: ignore[arg-type]
