"""The seam between the engine and policies: decisions, triggers, the read-only cluster view, the per-pass
`Cycle`, and one Protocol per layer (placement and sharing, preemption, calibration, plans); the optional
abilities a layer may have are named in meshsched.policies.abilities.

A `PolicyStack` (meshsched.policies.stack) composes one policy per layer; the engine talks to the stack only.
"""

from __future__ import annotations

import bisect
import enum
from operator import itemgetter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from meshsched.policies.placement import Planner
from meshsched.state import CalibrationMemo, ClusterState, ExecConfig, Job, JobState, Node


class Trigger(enum.Enum):
    ARRIVAL = "arrival"  # a job was submitted
    RELEASE = "release"  # GPUs came free (finish, pause, failure, cancel) or a node joined
    TICK = "tick"  # a timer the policy asked for fired


@dataclass(frozen=True, slots=True)
class Start:
    """Start a queued job on these GPUs (some may already hold one job: sharing) training as `exec` says
    (None: the job's default, `ExecConfig.default_for`)."""

    job_id: str
    gpus: tuple[int, ...]
    reason: str
    exec: ExecConfig | None = None


@dataclass(frozen=True, slots=True)
class Evict:
    """Preempt a job holding GPUs (checkpoint, requeue)."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """Record why a queued job stays queued (Slurm-style pending reason)."""

    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Defer:
    """A preemption layer postpones its decision about a queued job until `until` (Lazer's deferral X):
    the engine records it, shows the pending reason and wakes the stack then."""

    job_id: str
    until: float
    reason: str


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """Change how a job holding GPUs trains (calibration, plans); the engine turns it into the action."""

    job_id: str
    exec: ExecConfig
    reason: str
    memo: CalibrationMemo | None = None  # a calibration layer's memory of the job, kept by the engine


@dataclass(frozen=True, slots=True)
class Remember:
    """Replace the preemption layer's memory, kept as engine state (a frozen value the policy reads back as
    `view.memory`): what it must not lose at a restart or a leader change (Lazer's deferral queues and
    observations). Not about one job: `job_id` is empty."""

    memory: object
    job_id: str = ""


@dataclass(frozen=True, slots=True)
class RequestFit:
    """Ask for `fit(request)` off the scheduling loop (seconds of CPU: a GP fit); the result comes back as a
    ModelFitted event and the policy reads it as `view.model`. `fit` is a module-level function."""

    fit: object
    request: object
    job_id: str = ""


Decision = Start | Evict | Defer | Wait | Reconfigure | Remember | RequestFit


_third = itemgetter(2)


class ClusterView:
    """What a policy may read: the cluster, the wait queue in policy order, the jobs holding GPUs.

    It hands out the engine's own objects for speed; policies treat them as read-only
    (tests check that a scheduling pass leaves the state unchanged).
    """

    __slots__ = ("_state", "_queue", "_active", "_queued_gpus", "arrived", "memory", "model", "_needs", "_qkey",
                 "_pausing", "_by_need", "settled")

    def __init__(
        self,
        state: ClusterState,
        queue: list[tuple[tuple, int, str]],
        active: Mapping[str, Job],
        queued_gpus: Mapping[int, int],
        arrived: str | None = None,
        memory: object | None = None,
        model: object | None = None,
        needs: list[int] | None = None,
        qkey: Mapping[str, tuple] | None = None,
        by_need: Mapping[int, list[tuple[tuple, int, str]]] | None = None,
    ) -> None:
        self._state = state
        self._queue = queue
        self._active = active
        self._queued_gpus = queued_gpus
        self.arrived = arrived  # on Trigger.ARRIVAL: the job that just arrived
        # With `arrived`: the engine knows no other queued job can be placed on the free GPUs now (its last pass was
        # a greedy stack's, and since then only this job joined the queue and no GPU came free: meshsched.greedy)
        self.settled = False
        self.memory = memory  # the preemption layer's memory in engine state (`Remember`), None at first
        self.model = model  # the latest model a `RequestFit` produced (ModelFitted), None before one
        self._needs = needs  # GPUs asked for, in queue order (kept by the engine)
        self._qkey = qkey  # job -> its (key, seq) in the queue
        self._pausing: tuple[int, dict[str, int], set[str]] | None = None  # (version, pausing_by_node, its jobs)
        self._by_need = by_need  # GPU count -> the queue's entries of that many, in queue order (kept by the engine)

    def queue(self) -> Iterator[Job]:
        """Queued jobs (PENDING or PREEMPTED), best first by the policy's queue key."""
        jobs = self._state.jobs
        for _key, _seq, job_id in self._queue:
            yield jobs[job_id]

    def queue_demands(self) -> Iterable[tuple[str, int]]:
        """(job id, GPUs asked for) of the queued jobs, best first: `queue()` without reading each job."""
        if self._needs is not None:
            return zip(map(_third, self._queue), self._needs)
        jobs = self._state.jobs
        return ((jid, jobs[jid].spec.gpus) for _key, _seq, jid in self._queue)

    def queue_by_need(self) -> Mapping[int, list[tuple[tuple, int, str]]] | None:
        """GPU count -> the queued (key, seq, job id) asking for that many, best first; None where the engine does
        not keep them. Read-only."""
        return self._by_need

    def demand_ahead(self, job_id: str) -> int:
        """GPUs asked for by the queued jobs before `job_id` in queue order, counting only jobs that fit the
        cluster (without walking the queue when the engine keeps its demands)."""
        total = self._state.total_gpus
        if self._needs is None or self._qkey is None:
            jobs, n = self._state.jobs, 0
            for _key, _seq, jid in self._queue:
                if jid == job_id:
                    return n
                g = jobs[jid].spec.gpus
                n += g if g <= total else 0
            raise KeyError(job_id)
        needs = self._needs[: bisect.bisect_left(self._queue, self._qkey[job_id])]
        if max(self._queued_gpus) <= total:
            return sum(needs)
        return sum(n for n in needs if n <= total)

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    @property
    def has_runnable_queue(self) -> bool:
        """Some queued job fits the cluster (jobs larger than the cluster never run)."""
        return bool(self._queued_gpus) and min(self._queued_gpus) <= self._state.total_gpus

    def queued_gpu_counts(self) -> Iterable[int]:
        """The distinct GPU demands in the queue."""
        return self._queued_gpus.keys()

    @property
    def min_queued_gpus(self) -> int:
        """The smallest GPU demand in the queue (0 when the queue is empty)."""
        return min(self._queued_gpus) if self._queued_gpus else 0

    def holding(self) -> Iterable[Job]:
        """Jobs holding GPUs: LOADING, RUNNING or PAUSING."""
        return self._active.values()

    def job(self, job_id: str) -> Job:
        return self._state.jobs[job_id]

    @property
    def free_gpus(self) -> int:
        return self._state.free_gpus

    @property
    def total_gpus(self) -> int:
        return self._state.total_gpus

    def pausing_by_node(self) -> dict[str, int]:
        """GPUs per node that come free once the jobs now saving a checkpoint are done (a fresh dict; counted
        again only once a job the state's change log names since began or ended a pause)."""
        state = self._state
        memo = self._pausing
        pausing = JobState.PAUSING
        if memo is not None:
            if memo[0] == state.version:
                return dict(memo[1])
            # most changes (starts, finishes) neither begin nor end a pause: the count stands (the change log names
            # every job whose state or GPUs moved)
            changed = state.changed_since(memo[0])
            if changed is not None:
                was, jobs = memo[2], state.jobs
                for jid in changed:
                    if jid in was or ((j := jobs.get(jid)) is not None and j.state is pausing):
                        break
                else:
                    self._pausing = (state.version, memo[1], was)
                    return dict(memo[1])
        out: dict[str, int] = {}
        ids: set[str] = set()
        gpus = state.gpus
        for j in self._active.values():  # (in start order: the order the nodes join a pool)
            if j.state is pausing:
                ids.add(j.spec.job_id)
                for g in j.gpus:
                    node = gpus[g].node
                    out[node] = out.get(node, 0) + 1
        self._pausing = (state.version, out, ids)
        return dict(out)

    def nodes(self) -> list[Node]:
        """The live nodes (GPUs, CPUs and host memory of each)."""
        return [n for n in self._state.nodes.values() if n.alive]

    def gpu_is_free(self, gpu: int) -> bool:
        return not self._state.gpus[gpu].jobs

    def node_of(self, gpu: int) -> str:
        return self._state.gpus[gpu].node

    def gpu_type(self, gpu: int) -> str:
        return self._state.gpus[gpu].gpu_type

    def cluster_state(self) -> ClusterState:
        """The engine's state itself, read-only (the sharing policies follow its GPU occupancy and change log)."""
        return self._state

    def planner(self) -> Planner:
        """A scratch allocator over the free GPUs for one scheduling pass."""
        return Planner(self._state)


class Cycle:
    """Scratch for one scheduling pass (the Kubernetes scheduler's CycleState): when and why it runs, the
    pass's allocator, and a slot per policy for what it computes once per pass. Thrown away after the pass."""

    __slots__ = ("now", "trigger", "arrived", "_plan", "_view", "scratch")

    def __init__(self, view: ClusterView, now: float, trigger: Trigger) -> None:
        self.now = now
        self.trigger = trigger
        self.arrived = view.arrived if trigger is Trigger.ARRIVAL else None
        self._view = view
        self._plan: Planner | None = None
        self.scratch: dict[str, object] = {}

    @property
    def plan(self) -> Planner:
        """The pass's allocator over the free GPUs, made when first asked (a pass over an empty queue never is)."""
        plan = self._plan
        if plan is None:
            plan = self._plan = self._view.planner()
        return plan

    def worst_first(self, order) -> list:
        """`order.worst_first` over the view's jobs holding GPUs at `now` (a `RanksVictims` order), ranked once per
        pass: nothing a ranking reads changes during one (callers read the list, never change it)."""
        got = self.scratch.get("worst_first")
        if got is None or got[0] is not order:  # (one order per stack: Castor weighs preemption by Lazer's own)
            got = self.scratch["worst_first"] = (order, order.worst_first(self._view.holding(), self.now))
        return got[1]


@runtime_checkable
class PlacementPolicy(Protocol):
    """Admission, placement and sharing: which queued jobs start where (Start / Wait). Never mutates state.

    `try_start` places one job on what the pass has left (used by a preemption layer that owns the pass);
    `monotone` says a failure to place N GPUs means no later job of N or more GPUs on as many nodes at fewest can be
    placed either in the pass (`placement.Unplaced`)."""

    name: str
    periodic: bool  # can run every N seconds (`NAME@SECONDS`) instead of on every event
    monotone: bool

    def queue_key(self, job: Job) -> tuple:
        """Sort key of a queued job (lower first). Must not change while the job stays queued."""
        ...

    def place(self, view: ClusterView, cycle: Cycle) -> list[Decision]: ...

    def try_start(self, view: ClusterView, cycle: Cycle, job: Job) -> Decision | None: ...

    def next_timer(self, view: ClusterView, now: float) -> float | None:
        """When the policy wants to be woken with Trigger.TICK (None: no timer)."""
        ...


@runtime_checkable
class PreemptionPolicy(Protocol):
    """Which running jobs give way and when (Start / Evict / Defer / Wait). It owns the pass: it walks the
    queue in its own order and asks the placement layer to start each job before considering evictions."""

    name: str
    periodic: bool

    def queue_key(self, job: Job) -> tuple: ...

    def schedule(self, view: ClusterView, cycle: Cycle, placement: PlacementPolicy) -> list[Decision]: ...

    def next_timer(self, view: ClusterView, now: float) -> float | None: ...


@runtime_checkable
class CalibrationPolicy(Protocol):
    """Inside a colocation set (node side): reads a job's per-rank reports, answers Reconfigure decisions."""

    name: str

    def calibrate(self, view: ClusterView, job: Job, now: float) -> list[Reconfigure]: ...


@runtime_checkable
class PlanPolicy(Protocol):
    """Execution plans and resources of running jobs (Rubick): Reconfigure decisions."""

    name: str

    def replan(self, view: ClusterView, now: float) -> list[Decision]: ...
