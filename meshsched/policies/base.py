"""The seam between the engine and policies: decisions, triggers, the read-only cluster view, the Protocol."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from meshsched.policies.placement import Planner
from meshsched.state import ClusterState, Job, JobState


class Trigger(enum.Enum):
    ARRIVAL = "arrival"  # a job was submitted
    RELEASE = "release"  # GPUs came free (finish, pause, failure, cancel) or a node joined
    TICK = "tick"  # a timer the policy asked for fired


@dataclass(frozen=True, slots=True)
class Start:
    job_id: str
    gpus: tuple[int, ...]
    reason: str


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


Decision = Start | Evict | Wait


class ClusterView:
    """What a policy may read: the cluster, the wait queue in policy order, the jobs holding GPUs.

    It hands out the engine's own objects for speed; policies treat them as read-only
    (tests check that a scheduling pass leaves the state unchanged).
    """

    __slots__ = ("_state", "_queue", "_active", "_queued_gpus", "arrived")

    def __init__(
        self,
        state: ClusterState,
        queue: list[tuple[tuple, int, str]],
        active: Mapping[str, Job],
        queued_gpus: Mapping[int, int],
        arrived: str | None = None,
    ) -> None:
        self._state = state
        self._queue = queue
        self._active = active
        self._queued_gpus = queued_gpus
        self.arrived = arrived  # on Trigger.ARRIVAL: the job that just arrived

    def queue(self) -> Iterator[Job]:
        """Queued jobs (PENDING or PREEMPTED), best first by the policy's queue key."""
        jobs = self._state.jobs
        for _key, _seq, job_id in self._queue:
            yield jobs[job_id]

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    @property
    def has_runnable_queue(self) -> bool:
        """Some queued job fits the cluster (jobs larger than the cluster never run)."""
        return bool(self._queued_gpus) and min(self._queued_gpus) <= self._state.total_gpus

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
        """GPUs per node that come free once the jobs now saving a checkpoint are done."""
        out: dict[str, int] = {}
        gpus = self._state.gpus
        for j in self._active.values():
            if j.state is JobState.PAUSING:
                for g in j.gpus:
                    node = gpus[g].node
                    out[node] = out.get(node, 0) + 1
        return out

    def node_of(self, gpu: int) -> str:
        return self._state.gpus[gpu].node

    def planner(self) -> Planner:
        """A scratch allocator over the free GPUs for one scheduling pass."""
        return Planner(self._state)


class SchedulingPolicy(Protocol):
    """Decides which queued jobs start where and which jobs are preempted. Never mutates state."""

    name: str

    def queue_key(self, job: Job) -> tuple:
        """Sort key of a queued job (lower first). Must not change while the job stays queued."""
        ...

    def schedule(self, view: ClusterView, now: float, trigger: Trigger) -> list[Decision]: ...

    def next_timer(self, view: ClusterView, now: float) -> float | None:
        """When the policy wants to be woken with Trigger.TICK (None: no timer)."""
        ...
