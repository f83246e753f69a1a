"""The simulated cluster: carries out the engine's actions and reports back, with the perf model as truth.

Jobs advance by rate, not by ticks: a running job's finish is one scheduled event, replaced whenever
it is preempted. Loading takes the model's load time l, a checkpoint its pause time p (Lazer).
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass

from meshsched import events as ev
from meshsched.actions import Action, Kill, Launch, Preempt, ScheduleTimer
from meshsched.state import JobSpec, NodeSpec


@dataclass(slots=True)
class _Run:
    spec: JobSpec
    resume_from: float
    step_time: float
    started_at: float | None = None  # training start; None while loading
    token: int = 0  # seq of the pending JobStarted / JobFinished; stale events carry another


class SimWorld:
    """Owns the event heap; `push` schedules an event, `pop` returns the next live one."""

    def __init__(self, perf, nodes: list[NodeSpec]) -> None:  # perf: meshsched.perf.PerfModel
        self._perf = perf
        self._gpu_node: list[str] = []
        self._gpu_type: list[str] = []
        for n in nodes:
            self._gpu_node += [n.name] * n.gpus
            self._gpu_type += [n.gpu_type] * n.gpus
        self._heap: list[tuple[float, int, ev.Event]] = []
        self._seq = 0
        self._runs: dict[str, _Run] = {}
        self._specs: dict[str, JobSpec] = {}

    def push(self, at: float, event: ev.Event) -> int:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, event))
        return self._seq

    def pop(self) -> tuple[float, ev.Event] | None:
        heap = self._heap
        while heap:
            at, seq, event = heapq.heappop(heap)
            if isinstance(event, (ev.JobStarted, ev.JobFinished)):
                run = self._runs.get(event.job_id)
                if run is None or run.token != seq:
                    continue  # superseded by a preemption or a kill
            return at, event
        return None

    def submit(self, spec: JobSpec) -> None:
        self._specs[spec.job_id] = spec

    def execute(self, actions: list[Action | ScheduleTimer], now: float) -> None:
        for a in actions:
            if isinstance(a, Launch):
                spec = self._specs[a.job_id]
                step = self._perf.iteration_time(
                    spec.model,
                    self._gpu_type[a.gpus[0]],
                    self._shape(a.gpus),
                    max(1, spec.batch_size // spec.gpus),
                )
                run = _Run(spec, a.resume_from, step)
                self._runs[a.job_id] = run
                run.token = self.push(now + self._perf.load_time(spec.model), ev.JobStarted(f"loaded-{a.job_id}", a.job_id))
            elif isinstance(a, Preempt):
                run = self._runs.pop(a.job_id)
                if run.started_at is None:  # still loading: nothing new to save
                    self.push(now, ev.JobPaused(f"paused-{a.job_id}", a.job_id, run.resume_from))
                else:
                    done = min(run.spec.iterations, run.resume_from + (now - run.started_at) / run.step_time)
                    pause = self._perf.pause_time(run.spec.model)
                    self.push(now + pause, ev.JobPaused(f"paused-{a.job_id}", a.job_id, done))
            elif isinstance(a, Kill):
                self._runs.pop(a.job_id, None)
            elif isinstance(a, ScheduleTimer):
                self.push(a.at, ev.Tick(f"tick-{a.key}", a.key))

    def started(self, job_id: str, now: float) -> None:
        """Loading finished: schedule the finish from the job's true rate."""
        run = self._runs[job_id]
        run.started_at = now
        left = run.spec.iterations - run.resume_from
        run.token = self.push(now + left * run.step_time, ev.JobFinished(f"finished-{job_id}", job_id))

    def finished(self, job_id: str) -> None:
        self._runs.pop(job_id, None)

    def _shape(self, gpus: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(Counter(self._gpu_node[g] for g in gpus).values(), reverse=True))
