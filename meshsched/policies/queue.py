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
        # Job.remaining_time inlined: this runs for every running job on most passes.
        spec = job.spec
        done = job.done_iterations
        if job.state is JobState.RUNNING and job.step_time > 0:
            done = min(done + (now - job.progress_time) / job.step_time, spec.iterations)
        return ((spec.iterations - done) * job.ideal_step_time, spec.submit_time)


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
    _promised: set[str] = field(default_factory=set, repr=False)  # periodic: decided at a tick, waiting on a pause

    def queue_key(self, job: Job) -> tuple:
        return self.order.priority(job, job.since)

    def schedule(self, view: ClusterView, now: float, trigger: Trigger) -> list[Decision]:
        if self.interval is not None:
            if trigger is not Trigger.TICK:
                self._dirty = True
                # Jobs this policy already chose at its last activation start as soon as their GPUs are free.
                return self._start_promised(view) if self._promised and trigger is Trigger.RELEASE else []
            # SRTF: with no arrival or release since the last pass, running jobs only got closer to
            # done, so nothing could have become startable or evictable.
            if not self._dirty and isinstance(self.order, ShortestRemaining):
                return []
            self._dirty = False
        if view.queue_length == 0:
            return []
        # On an arrival only the newcomer can have gained a reason to preempt: nothing was freed, and
        # running jobs only got closer to done since the last pass.
        return self._pass(view, now, evict_for=view.arrived if trigger is Trigger.ARRIVAL else None)

    def _start_promised(self, view: ClusterView) -> list[Decision]:
        plan = view.planner()
        out: list[Decision] = []
        for job_id in sorted(self._promised, key=lambda j: view.job(j).spec.submit_time):
            job = view.job(job_id)
            if not job.state.is_queued:
                self._promised.discard(job_id)
            elif (gpus := plan.take(job.spec.gpus)) is not None:
                out.append(Start(job_id, gpus, f"{self.name}: chosen at the last activation; GPUs now free"))
                self._promised.discard(job_id)
        return out

    def _pass(self, view: ClusterView, now: float, evict_for: str | None = None) -> list[Decision]:
        plan = view.planner()
        soon = view.pausing_by_node() if self.preemptive else {}
        min_need = view.min_queued_gpus
        total = view.total_gpus
        decisions: list[Decision] = []
        victims: list[tuple[tuple, Job]] | None = None  # evictable, worst first
        evicted: set[str] = set()
        self._promised.clear()
        newcomer_seen = False
        for job in view.queue():
            need = job.spec.gpus
            if need > total:
                continue  # unschedulable here; never blocks the queue
            newcomer_seen = newcomer_seen or job.job_id == evict_for
            gpus = plan.take(need) if need <= plan.free_total else None
            if gpus is not None:
                decisions.append(Start(job.job_id, gpus, f"{self.name}: {need} GPU(s) free"))
                continue
            if not self.preemptive:
                if self.strict or plan.free_total < min_need:
                    break
                continue
            if evict_for is not None and job.job_id != evict_for and not soon:
                if plan.free_total < min_need and newcomer_seen:
                    break  # the newcomer has been handled and nothing else can start
                continue
            # Preemptive: is room coming (checkpoints being saved), or can evictions make it?
            pool = plan.free_map()
            for node, n in soon.items():
                if n:
                    pool[node] = pool.get(node, 0) + n
            spot = plan.compact(pool, need)
            prio = self.order.priority(job, now)
            if spot is None:
                if evict_for is not None and job.job_id != evict_for:
                    continue
                if victims is None:
                    victims = sorted(
                        ((self.order.priority(v, now), v) for v in view.holding() if v.state is not JobState.PAUSING),
                        key=lambda pv: pv[0],
                        reverse=True,
                    )
                chosen: list[Job] = []
                single = need <= plan.node_size
                pooled = sum(pool.values())
                for vprio, v in victims:
                    if v.job_id in evicted:
                        continue
                    if not vprio[0] > prio[0]:
                        break  # only strictly lower-priority jobs are preempted
                    chosen.append(v)
                    touched = False
                    for g in v.gpus:
                        node = view.node_of(g)
                        n = pool[node] = pool.get(node, 0) + 1
                        touched = touched or n >= need
                    pooled += len(v.gpus)
                    # a one-node job can only have become placeable on a node this victim frees
                    if (touched if single else pooled >= need) and (spot := plan.compact(pool, need)) is not None:
                        break
                if spot is None:
                    if plan.free_total < min_need and not self._worse_victim_left(victims, evicted, prio):
                        break  # nothing later in the queue can start or evict
                    continue
                nodes = {node for node, _ in spot}
                for v in chosen:
                    if any(view.node_of(g) in nodes for g in v.gpus):
                        evicted.add(v.job_id)
                        decisions.append(Evict(v.job_id, f"{self.name}: preempted for {job.job_id}"))
                        for g in v.gpus:
                            node = view.node_of(g)
                            soon[node] = soon.get(node, 0) + 1
            # Reserve the spot: its free GPUs are held back, the GPUs being freed there are promised.
            for node, count in spot:
                rest = count - plan.withhold(node, count)
                if rest:
                    if soon[node] > rest:
                        soon[node] -= rest
                    else:
                        del soon[node]
            if self.interval is not None:
                self._promised.add(job.job_id)
        return decisions

    @staticmethod
    def _worse_victim_left(victims: list[tuple[tuple, Job]] | None, evicted: set[str], prio: tuple) -> bool:
        for vprio, v in victims or ():
            if v.job_id not in evicted:
                return vprio[0] > prio[0]
        return False

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
