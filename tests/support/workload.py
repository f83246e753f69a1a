"""A seeded workload that answers an engine's actions like a small cluster would (snapshot tests, benchmarks).

`record(policy, seed, jobs)` runs the engine over it and returns every (event, now) it was fed, in order, with
the actions each produced: feeding the same events to another engine must give the same actions. Besides
submits, starts, reports, pauses and exits it has cancels, holds and releases, dependencies, a throttled array,
begin times, time limits with --signal, a drain and resume, and a node lost and joined again.
"""

from __future__ import annotations

import functools
import heapq
import random

from meshsched import events as ev
from meshsched.actions import Kill, Launch, Preempt, Reconfigure, ScheduleTimer
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import installed_handle, load_perf_model
from meshsched.policies.registry import make_policy
from meshsched.state import ClusterState, Dependency, DependencyKind, JobSpec, NodeSpec

MODELS = ("resnet18", "resnet50", "lm", "transformer")


@functools.cache
def _perf():
    return load_perf_model()


def engine(policy: str) -> Engine:
    return Engine(make_policy(policy, installed_handle()), ProfileEstimator(_perf()), ClusterState())


def _spec(rng: random.Random, i: int, now: float) -> JobSpec:
    gpus = rng.choice((1, 1, 2, 4))
    kw: dict = {}
    roll = rng.random()
    if roll < 0.1 and i > 0:
        kw["dependencies"] = (Dependency(rng.choice(list(DependencyKind)[:3]), f"j{rng.randrange(i)}"),)
    elif roll < 0.2:
        kw.update(array_id="arr", array_limit=2)
    elif roll < 0.25:
        kw["begin_time"] = now + rng.uniform(10, 200)
    if rng.random() < 0.15:
        kw.update(time_limit=rng.uniform(50, 400), signal=10, signal_time=20.0)
    return JobSpec(f"j{i}", gpus, rng.choice(MODELS), 32 * gpus, rng.randrange(200, 3000), submit_time=now,
                   user=rng.choice(("ann", "bob")), **kw)


class Cluster:
    """The world around one engine: turns its actions into the events that follow them."""

    def __init__(self, eng: Engine, seed: int, jobs: int, nodes: int = 3) -> None:
        self.engine, self.rng = eng, random.Random(seed)
        self.heap: list[tuple[float, int, ev.Event]] = []
        self.n = 0
        self.fed: list[tuple[ev.Event, float]] = []
        self.actions: list[list] = []
        for k in range(nodes):
            self.push(0.0, ev.NodeJoined(self.sid(), NodeSpec(f"n{k}", 4, "v100", 16384)))
        t = 0.0
        for i in range(jobs):
            t += self.rng.expovariate(1 / 15)
            self.push(t, ev.JobSubmitted(self.sid(), _spec(self.rng, i, t)))
        self.push(t * 0.3, ev.DrainChanged(self.sid(), "n1", (0, 1), True, "maintenance", "ops"))
        self.push(t * 0.5, ev.DrainChanged(self.sid(), "n1", (), False))
        self.push(t * 0.4, ev.NodeLost(self.sid(), "n2"))
        self.push(t * 0.45, ev.NodeJoined(self.sid(), NodeSpec("n2", 4, "v100", 16384)))

    def sid(self) -> str:
        self.n += 1
        return f"s{self.n}"

    def push(self, at: float, event: ev.Event) -> None:
        heapq.heappush(self.heap, (at, self.n, event))
        self.n += 1

    def run(self) -> Cluster:
        while self.heap:
            now, _, event = heapq.heappop(self.heap)
            actions = self.engine.handle(event, now)
            self.fed.append((event, now))
            self.actions.append(actions)
            self._answer(event, actions, now)
        return self

    def _answer(self, event: ev.Event, actions: list, now: float) -> None:
        rng = self.rng
        if type(event) is ev.JobSubmitted and rng.random() < 0.08:
            job_id = event.spec.job_id
            kind = rng.choice((ev.CancelRequested, ev.HoldRequested))
            self.push(now + rng.uniform(1, 30), kind(self.sid(), job_id))
            if kind is ev.HoldRequested:
                self.push(now + rng.uniform(40, 200), ev.ReleaseRequested(self.sid(), job_id))
        for a in actions:
            if isinstance(a, ScheduleTimer):
                self.push(a.at, ev.Tick(self.sid(), a.key))
            elif isinstance(a, Launch):
                self._launched(a, now)
            elif isinstance(a, Preempt):
                job = self.engine.state.jobs[a.job_id]
                self.push(now + rng.uniform(1, 5), ev.JobPaused(self.sid(), a.job_id, job.iterations_at(now)))
            elif isinstance(a, Reconfigure):
                self.push(now + 1.0, ev.ReconfigureApplied(self.sid(), a.job_id, a.exec))
            elif isinstance(a, Kill):
                pass

    def _launched(self, a: Launch, now: float) -> None:
        rng, job = self.rng, self.engine.state.jobs[a.job_id]
        start = now + rng.uniform(2, 12)
        self.push(start, ev.JobStarted(self.sid(), a.job_id))
        left = job.spec.iterations - a.resume_from
        step = job.ideal_step_time * rng.uniform(1.0, 1.3)
        self.push(start + left * step / 2, ev.IterationReport(self.sid(), a.job_id, a.resume_from + left / 2, step))
        self.push(start + left * step / 3, ev.CheckpointSaved(self.sid(), a.job_id, a.resume_from + left / 3))
        if rng.random() < 0.05:
            self.push(start + left * step / 4, ev.JobFailed(self.sid(), a.job_id, "boom", rng.random() < 0.5))
        self.push(start + left * step, ev.JobFinished(self.sid(), a.job_id))


def record(policy: str, seed: int, jobs: int) -> Cluster:
    """The workload run through a fresh engine of `policy`: `fed` (event, now) in order and `actions` per event."""
    return Cluster(engine(policy), seed, jobs).run()
