"""Queue-ordered baselines: FIFO, SJF, SRTF, Tiresias-style 2D-LAS, and periodic SRTF.

One scheduler walks the wait queue in its ordering's priority, starts what fits on exclusive GPUs
(fewest nodes), and, if preemptive, evicts strictly lower-priority jobs (worst first) to make room.
"""

from __future__ import annotations

import math
from heapq import heapify, heappop, heappush
from operator import itemgetter
from dataclasses import dataclass, field, replace
from typing import Protocol

from meshsched.policies.abilities import RanksVictims, can
from meshsched.policies.base import ClusterView, Cycle, Decision, Evict, Start, Trigger
from meshsched.policies.placement import Unplaced
from meshsched.policies.victim_rank import RemainingRank
from meshsched.state import Job, JobState


class Ordering(Protocol):
    name: str

    def priority(self, job: Job, now: float) -> tuple:
        """Lower runs first. For a queued job it must not depend on `now`."""
        ...


def worst_first(order: Ordering, jobs, now: float) -> list[tuple[tuple, Job]]:
    """Jobs that may be preempted (not already PAUSING), lowest priority first."""
    ranked = [(order.priority(j, now), j) for j in jobs if j.state is not JobState.PAUSING]
    ranked.sort(key=_first, reverse=True)
    return ranked


_first = itemgetter(0)  # a pair's priority (a Python key function cost a call per job on every pass)


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

    def worst_first(self, jobs, now: float) -> list[tuple[tuple, Job]]:
        """`worst_first` with Job.remaining_time inlined: it runs over every running job on most passes."""
        running, pausing = JobState.RUNNING, JobState.PAUSING
        ranked = []
        for j in jobs:
            st = j.state
            if st is pausing:
                continue
            spec = j.spec
            done = j.done_iterations
            if st is running and j.step_time > 0:
                done = min(done + (now - j.progress_time) / j.step_time, spec.iterations)
            ranked.append((((spec.iterations - done) * j.ideal_step_time, spec.submit_time), j))
        ranked.sort(key=_first, reverse=True)
        return ranked


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
    # periodic: decided at a tick, waiting on a pause; a dict, in the order chosen, so ties in submit time are
    # broken the same way in every process (a set's order follows the per-process string hash seed)
    _promised: dict[str, None] = field(default_factory=dict, repr=False)
    # SRTF's victims, kept ranked between passes (meshsched.policies.victim_rank); not copied by `replace`
    _victims: RemainingRank = field(default_factory=RemainingRank, init=False, repr=False, compare=False)
    # victim -> (its GPUs, (node, GPUs) pairs), kept between passes (`room_by_eviction`'s memo; checked by the GPUs)
    _nodes_of: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    periodic: bool = field(default=True, init=False)

    @property
    def monotone(self) -> bool:
        return True  # starts only on free GPUs, compactly: failing N GPUs rules out larger jobs as `Unplaced` says

    def queue_key(self, job: Job) -> tuple:
        return self.order.priority(job, job.since)

    def place(self, view: ClusterView, cycle: Cycle) -> list[Decision]:
        """The whole pass as a placement layer (no preemption layer above it)."""
        return self._activate(view, cycle, self)

    def schedule(self, view: ClusterView, cycle: Cycle, placement) -> list[Decision]:
        """The whole pass as a preemption layer: `placement` starts jobs, this policy evicts to make room."""
        return self._activate(view, cycle, placement)

    def try_start(self, view: ClusterView, cycle: Cycle, job: Job) -> Decision | None:
        """Exclusive GPUs on the fewest nodes, if the pass still has them."""
        need = job.spec.gpus
        plan = cycle.plan
        gpus = plan.take(need) if need <= plan.free_total else None
        return None if gpus is None else Start(job.job_id, gpus, f"{self.name}: {need} GPU(s) free")

    def _activate(self, view: ClusterView, cycle: Cycle, placement) -> list[Decision]:
        trigger = cycle.trigger
        if self.interval is not None:
            if trigger is not Trigger.TICK:
                self._dirty = True
                # Jobs this policy already chose at its last activation start as soon as their GPUs are free.
                return self._start_promised(view, cycle, placement) if self._promised and trigger is Trigger.RELEASE else []
            # SRTF: with no arrival or release since the last pass, running jobs only got closer to
            # done, so nothing could have become startable or evictable.
            if not self._dirty and isinstance(self.order, ShortestRemaining):
                return []
            self._dirty = False
        if view.queue_length == 0:
            return []
        # On an arrival only the newcomer can have gained a reason to preempt: nothing was freed, and
        # running jobs only got closer to done since the last pass.
        return self._pass(view, cycle, placement, evict_for=cycle.arrived)

    def _start_promised(self, view: ClusterView, cycle: Cycle, placement) -> list[Decision]:
        out: list[Decision] = []
        for job_id in sorted(self._promised, key=lambda j: view.job(j).spec.submit_time):  # stable: chosen order
            job = view.job(job_id)
            if not job.state.is_queued:
                self._promised.pop(job_id, None)
            elif isinstance(d := placement.try_start(view, cycle, job), Start):
                out.append(replace(d, reason=f"{self.name}: chosen at the last activation; GPUs now free"))
                self._promised.pop(job_id, None)
        return out

    def _pass(self, view: ClusterView, cycle: Cycle, placement, evict_for: str | None = None) -> list[Decision]:
        """Walk the queue best first: start what fits; if preemptive, evict worse jobs to make room.

        Failures are monotone down the queue (later jobs have fewer possible victims and the free
        pool only shrinks), so once N GPUs could not be started or made room for, no later job of N
        or more on as many nodes is tried again in this pass (`Unplaced`). `evict_for` limits eviction to one
        job (the newcomer).
        """
        if not self.preemptive:
            return self._start_pass(view, cycle, placement)
        now, plan = cycle.now, cycle.plan
        monotone = placement.monotone
        soon = view.pausing_by_node()
        total = view.total_gpus
        decisions: list[Decision] = []
        victims: list[tuple[tuple, Job]] | None = None  # evictable, worst first
        evicted: set[str] = set()
        nodes_of = self._nodes_of  # victim -> (its GPUs, (node, GPUs) pairs): room_by_eviction's memo
        if len(nodes_of) > 2 * total + 64:  # (no more jobs hold GPUs at once: the rest have left)
            nodes_of.clear()
        self._promised.clear()
        counts = view.queued_gpu_counts()
        no_start, no_evict = Unplaced(plan.node_size, counts, total), Unplaced(plan.node_size, counts, total)
        no_room = Unplaced(plan.node_size, counts, total)  # no room in free and pausing GPUs (until an eviction)
        newcomer_seen = evict_for is None
        own = type(placement) is QueueScheduler
        jobs = view.cluster_state().jobs
        for job_id, need in view.queue_demands():  # (ids and counts: most jobs walked are ruled out unread)
            if need > total:
                continue  # unschedulable here; never blocks the queue
            if job_id == evict_for:
                newcomer_seen = True
            job = None
            if need not in no_start.ruled_out:  # (`blocks`: every need walked is a queued count)
                job = jobs[job_id]
                d = placement.try_start(view, cycle, job)
                if isinstance(d, Start):
                    decisions.append(d)
                    continue
                if d is not None:
                    decisions.append(d)  # Wait: the placement layer's pending reason (an eviction may follow)
                if monotone:
                    no_start.failed(need)
            may_evict = need not in no_evict.ruled_out and (evict_for is None or job_id == evict_for)
            # whether the pool below (free and pausing GPUs) cannot hold `need`: with no pausing GPUs, where the start
            # that failed (or was ruled out) was this scheduler's own (`take`: the same compact placement); else
            # where the count failed on it already (the pool only shrinks until an eviction)
            no_spot = own if not soon else need in no_room.ruled_out
            if not may_evict and (no_spot or not soon):
                if no_start.every and newcomer_seen and (evict_for is not None or no_evict.every) and \
                        (not soon or no_room.every):
                    break  # nothing later in the queue can start or make room
                continue
            if job is None:
                job = jobs[job_id]
            # Is room coming (checkpoints being saved), or can evictions make it?
            pool, top = _pool(plan, soon)
            spot = None if no_spot else plan.compact(pool, need, top)
            if spot is None and soon:
                no_room.failed(need)
            if spot is None and may_evict:
                if victims is None:
                    victims = self._rank_victims(view, now)
                spot, chosen = room_by_eviction(
                    view, plan, pool, need, self.order.priority(job, now), victims, evicted, nodes_of
                )
                if spot is None:
                    no_evict.failed(need)
                else:
                    decisions += _evictions(self.name, job_id, spot, chosen, evicted, soon)
                    no_room = Unplaced(plan.node_size, counts, total)  # (the pool grows by what the evictions free)
            if spot is None:
                continue
            _reserve(plan, soon, spot)
            if self.interval is not None:
                self._promised[job_id] = None
        return decisions

    def _rank_victims(self, view: ClusterView, now: float):
        """The jobs that may be preempted, worst first: SRTF's kept ranked between passes and read lazily (a pass
        reads only the first few: meshsched.policies.victim_rank), any other ordering's ranked in full."""
        order = self.order
        if type(order) is ShortestRemaining:
            return self._victims.ranked(view, now)
        return (order.worst_first(view.holding(), now) if can(order, RanksVictims)
                else worst_first(order, view.holding(), now))

    def _start_pass(self, view: ClusterView, cycle: Cycle, placement) -> list[Decision]:
        """`_pass` without preemption: start what fits, best first. The queue is walked by demand (ids and GPU
        counts) and a job is read only when it is tried; with this scheduler's own `try_start` (exclusive GPUs),
        a job asking for more GPUs than the pass has left is not tried, and the walk ends once no queued job
        could fit in what is left (the same decisions as trying each)."""
        plan = cycle.plan
        own = type(placement) is QueueScheduler  # try_start: None whenever need > plan.free_total
        strict = self.strict
        if own and not strict:
            if view.settled and cycle.arrived is not None:  # only the newcomer may fit: try it alone
                return self._start_arrived(view, cycle, cycle.arrived)
            if (by_need := view.queue_by_need()) is not None:
                return self._start_by_need(view, cycle, by_need)
        min_need = view.min_queued_gpus
        total = view.total_gpus
        decisions: list[Decision] = []
        self._promised.clear()
        no_start = Unplaced(cycle.plan.node_size, view.queued_gpu_counts(), total)
        for job_id, need in view.queue_demands():
            if need > total:
                continue  # unschedulable here; never blocks the queue
            if need not in no_start.ruled_out:
                if own and need > plan.free_total:
                    d = None
                else:
                    d = placement.try_start(view, cycle, view.job(job_id))
                    if isinstance(d, Start):
                        decisions.append(d)
                        if own and plan.free_total < min_need and not strict:
                            break  # no queued job fits in what is left
                        continue
                    if d is not None:
                        decisions.append(d)
                if placement.monotone:
                    no_start.failed(need)
            if strict or no_start.every:
                break
        return decisions

    def _start_arrived(self, view: ClusterView, cycle: Cycle, job_id: str) -> list[Decision]:
        """`_start_pass` when no queued job but the newcomer can be placed (`ClusterView.settled`): the walk would
        fail every other job without claiming a GPU, so it starts the newcomer where its own try would."""
        d = self.try_start(view, cycle, view.job(job_id))
        return [] if d is None else [d]

    def _start_by_need(self, view: ClusterView, cycle: Cycle, by_need) -> list[Decision]:
        """`_start_pass` with this scheduler's own `try_start`, backfilling, without walking the queue: the queue's
        jobs of each GPU count in queue order (`view.queue_by_need`), merged by a heap of each count's next job.
        The walk would start a job exactly when its count still fits (failures are monotone in the count on as
        many nodes, and the free GPUs only shrink in a pass), so the next start is the best queued job of a count
        that still fits: counts that no longer fit drop out (with every larger one on as many nodes, once `take`
        fails), and the starts come in the walk's order, with its decisions."""
        plan = cycle.plan
        if self._promised:
            self._promised.clear()
        fits = min(view.total_gpus, plan.free_total)
        heads = [(jobs[0], need, 0) for need, jobs in by_need.items() if need <= fits]
        decisions: list[Decision] = []
        if not heads:
            return decisions  # (no queued GPU count fits what is free: most passes after a finish)
        heapify(heads)
        take, name, unplaced = plan.take, self.name, None
        while heads:
            entry, need, i = heappop(heads)
            if need > plan.free_total:
                continue  # (this count no longer fits: its later jobs neither)
            gpus = take(need)  # (`try_start`, inline)
            if gpus is None:  # what this failure rules out for the rest of the pass (`Unplaced`)
                if unplaced is None:
                    unplaced = Unplaced(plan.node_size, (), fits)
                unplaced.failed(need)
                heads = [h for h in heads if not unplaced.blocks(h[1])]
                heapify(heads)
                continue
            decisions.append(Start(entry[2], gpus, f"{name}: {need} GPU(s) free"))
            jobs = by_need[need]
            if i + 1 < len(jobs):
                heappush(heads, (jobs[i + 1], need, i + 1))
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


def _reserve(plan, soon: dict[str, int], spot: list[tuple[str, int]]) -> None:
    """Reserve `spot` for a waiting job: its free GPUs are held back, the GPUs being freed there are promised."""
    for node, count in spot:
        rest = count - plan.withhold(node, count)
        if rest:
            if soon[node] > rest:
                soon[node] -= rest
            else:
                del soon[node]


def _pool(plan, soon: dict[str, int]) -> tuple[dict[str, int], int]:
    """The pass's free GPUs and those being freed (`soon`) per node, and the most on one node."""
    pool, top = plan.free_map(), plan.top()
    for node, n in soon.items():
        c = pool[node] = pool.get(node, 0) + n
        if c > top:
            top = c
    return pool, top


def _evictions(name: str, job_id: str, spot: list[tuple[str, int]], chosen: list, evicted: set[str],
               soon: dict[str, int]) -> list[Evict]:
    """The victims `room_by_eviction` read that hold GPUs on `spot`, evicted for `job_id`: their GPUs join `soon`."""
    on_spot = {node for node, _ in spot}
    out: list[Evict] = []
    for vid, held in chosen:
        if any(node in on_spot for node, _ in held):
            evicted.add(vid)
            out.append(Evict(vid, f"{name}: preempted for {job_id}"))
            for node, k in held:
                soon[node] = soon.get(node, 0) + k
    return out


def _per_node(nodes: list[str]) -> tuple[tuple[str, int], ...]:
    """(node, GPUs on it) for a job's GPUs' nodes, in the order the nodes first appear."""
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node] = counts.get(node, 0) + 1
    return tuple(counts.items())


def room_by_eviction(
    view: ClusterView, plan, pool: dict[str, int], need: int, prio: tuple, victims: list, evicted: set[str],
    nodes_of: dict[str, tuple[tuple[int, ...], tuple[tuple[str, int], ...]]] | None = None,
) -> tuple[list[tuple[str, int]] | None, list[tuple[str, tuple[tuple[str, int], ...]]]]:
    """Add strictly lower-priority jobs' GPUs to `pool`, worst first, until `need` fits compactly; returns the spot
    (or None) and the victims read, each with its (node, GPUs) pairs.

    `nodes_of`: a memo of each victim's GPUs and their (node, GPUs) pairs, kept across calls: an entry counts while
    the job holds the very GPUs tuple it was made for."""
    chosen: list[tuple[str, tuple[tuple[str, int], ...]]] = []
    if nodes_of is None:
        nodes_of = {}
    gpus = view.cluster_state().gpus
    single = need <= plan.node_size
    pooled = sum(pool.values())
    top = -1  # (several nodes: the pool's largest count, once the pool holds `need`)
    most = -(-need // plan.node_size)
    bar = prio[0]
    get = pool.get
    for vprio, v in victims:
        if not vprio[0] > bar:
            break  # only strictly lower-priority jobs are preempted
        vid = v.spec.job_id
        if vid in evicted:
            continue
        got = nodes_of.get(vid)
        if got is None or got[0] is not v.gpus:
            got = nodes_of[vid] = (v.gpus, _per_node([gpus[g].node for g in v.gpus]))
        held = got[1]
        chosen.append((vid, held))
        most_here = 0
        for node, k in held:
            n = pool[node] = get(node, 0) + k
            if n > most_here:
                most_here = n
        pooled += len(v.gpus)
        if single:  # a one-node job can only have become placeable on a node this victim frees
            if most_here >= need and (spot := plan.compact(pool, need)) is not None:
                return spot, chosen
        elif pooled >= need:
            top = max(pool.values()) if top < 0 else max(top, most_here)  # (counts only grow here)
            if most * top >= need and (spot := plan.compact(pool, need, top)) is not None:
                return spot, chosen
    return None, chosen
