"""Queue-ordered baselines: FIFO, SJF, SRTF, Tiresias-style 2D-LAS, and periodic SRTF.

One scheduler walks the wait queue in its ordering's priority, starts what fits on exclusive GPUs
(fewest nodes), and, if preemptive, evicts strictly lower-priority jobs (worst first) to make room.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from meshsched.policies.base import ClusterView, Decision, Evict, Start, Trigger
from meshsched.state import Job, JobState


class Ordering(Protocol):
    name: str

    def priority(self, job: Job, now: float) -> tuple:
        """Lower runs first. For a queued job it must not depend on `now`."""
        ...


class Fifo:
    name = "fifo"

    def priority(self, job: Job, now: float) -> tuple:
        return (job.spec.submit_time,)


class ShortestJob:
    """SJF: expected duration of the whole job alone."""

    name = "sjf"

    def priority(self, job: Job, now: float) -> tuple:
        return (job.expected_duration, job.spec.submit_time)


class ShortestRemaining:
    """SRTF: expected training time left (running jobs' progress extrapolated to `now`)."""

    name = "srtf"

    def priority(self, job: Job, now: float) -> tuple:
        return (job.remaining_time(now), job.spec.submit_time)


@dataclass(frozen=True)
class LeastAttained:
    """Tiresias' discretized 2D-LAS: queue index by attained GPU-time, FIFO within a queue.

    Needs no duration. Thresholds are GPU-seconds (default: 1 and 10 GPU-hours, three queues).
    Tiresias' starvation guard (promotion after a long wait) is not modelled.
    """

    thresholds: tuple[float, ...] = (3600.0, 36000.0)
    name: str = "las"

    def attained(self, job: Job, now: float) -> float:
        a = job.acct.attained_gpu_time
        if job.state is JobState.RUNNING:
            a += (now - job.since) * job.spec.gpus
        return a

    def queue_index(self, attained: float) -> int:
        # A job woken exactly at its crossing may sit a rounding error below the threshold.
        for i, t in enumerate(self.thresholds):
            if attained < t - 1e-6:
                return i
        return len(self.thresholds)

    def priority(self, job: Job, now: float) -> tuple:
        return (self.queue_index(self.attained(job, now)), job.spec.submit_time)

    def next_demotion(self, job: Job, now: float) -> float | None:
        """When a running job crosses into the next queue."""
        a = self.attained(job, now)
        i = self.queue_index(a)
        if i >= len(self.thresholds):
            return None
        return now + (self.thresholds[i] - a) / job.spec.gpus


@dataclass
class QueueScheduler:
    """Greedy start in priority order; optional preemption; event-driven or periodic activation.

    strict: head-of-line blocking (true FCFS); otherwise later jobs that fit may start (backfill).
    interval: seconds between activations (periodic SRTF: Pollux 60 s, Muri 360 s, Optimus 600 s);
    None means the policy runs on every arrival and release.
    """

    name: str
    order: Ordering
    preemptive: bool = False
    strict: bool = False
    interval: float | None = None
    _dirty: bool = field(default=True, repr=False)

    def queue_key(self, job: Job) -> tuple:
        return self.order.priority(job, job.since)

    def schedule(self, view: ClusterView, now: float, trigger: Trigger) -> list[Decision]:
        if self.interval is not None:
            if trigger is not Trigger.TICK:
                self._dirty = True
                return []
            # SRTF: with no arrival or release since the last pass, running jobs only got closer to
            # done, so nothing could have become startable or evictable.
            if not self._dirty and isinstance(self.order, ShortestRemaining):
                return []
            self._dirty = False
        if view.queue_length == 0:
            return []
        return self._pass(view, now)

    def _pass(self, view: ClusterView, now: float) -> list[Decision]:
        plan = view.planner()
        free = plan.free_total
        avail = free + (view.pausing_gpus if self.preemptive else 0)
        min_need = view.min_queued_gpus
        decisions: list[Decision] = []
        victims: list[tuple[tuple, Job]] | None = None  # evictable, worst first
        vi = 0
        total = view.total_gpus
        for job in view.queue():
            need = job.spec.gpus
            if need > total:
                continue  # unschedulable here; never blocks the queue
            if need <= free and need <= avail:
                gpus = plan.take(need)
                assert gpus is not None
                decisions.append(Start(job.job_id, gpus, f"{self.name}: {need} GPU(s) free"))
                free -= need
                avail -= need
                continue
            if need <= avail:  # room arrives when the jobs now saving a checkpoint are done
                avail -= need
                continue
            if self.preemptive:
                prio = self.order.priority(job, now)
                if victims is None:
                    victims = sorted(
                        ((self.order.priority(v, now), v) for v in view.holding() if v.state is not JobState.PAUSING),
                        key=lambda pv: pv[0],
                        reverse=True,
                    )
                got = 0
                k = vi
                while k < len(victims) and victims[k][0] > prio and avail + got < need:
                    got += victims[k][1].spec.gpus
                    k += 1
                if avail + got >= need:
                    for vprio, v in victims[vi:k]:
                        decisions.append(Evict(v.job_id, f"{self.name}: preempted for {job.job_id}"))
                    vi = k
                    avail += got - need
                    continue
                if free < min_need and (vi >= len(victims) or victims[vi][0] <= prio):
                    break  # nothing later in the queue can start or evict
            elif self.strict or free < min_need:
                break
        return decisions

    def next_timer(self, view: ClusterView, now: float) -> float | None:
        if not view.has_runnable_queue:
            return None
        if self.interval is not None:
            return (math.floor(now / self.interval) + 1) * self.interval
        if isinstance(self.order, LeastAttained):
            times = [
                t
                for j in view.holding()
                if j.state is JobState.RUNNING and (t := self.order.next_demotion(j, now)) is not None
            ]
            return min(times) if times else None
        return None
