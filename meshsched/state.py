"""The nouns of the scheduler: job specs, jobs and their lifecycle, GPUs, nodes, and the cluster.

Everything here is plain data plus the invariants that tie it together (`ClusterState.validate`).
Only the engine mutates these objects; policies read them through `ClusterView`.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field

from meshsched.state_free import FreeMap
from meshsched.state_log import ChangeLog


class InvalidTransition(Exception):
    """A job was asked to move between states its lifecycle does not connect."""


class JobState(enum.Enum):
    PENDING = "PENDING"  # waiting for its first start
    LOADING = "LOADING"  # GPUs allocated, process starting / restoring its checkpoint
    RUNNING = "RUNNING"  # training
    PAUSING = "PAUSING"  # saving a checkpoint before giving its GPUs back
    PREEMPTED = "PREEMPTED"  # queued again after a preemption or a lost node
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"  # stopped when its time limit ran out (Slurm's word)

    # members are singletons: hashed by identity in C (Enum's own hashes the name in Python, and the engine asks
    # `_ALLOWED`, `is_queued`, ... several times per event)
    __hash__ = object.__hash__

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def is_queued(self) -> bool:
        return self in _QUEUED

    @property
    def holds_gpus(self) -> bool:
        return self in _HOLDING


_TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})
_QUEUED = frozenset({JobState.PENDING, JobState.PREEMPTED})
_HOLDING = frozenset({JobState.LOADING, JobState.RUNNING, JobState.PAUSING})

_ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.LOADING, JobState.CANCELLED, JobState.FAILED}),
    JobState.LOADING: frozenset(
        {JobState.RUNNING, JobState.PAUSING, JobState.PREEMPTED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.PAUSING, JobState.PREEMPTED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}
    ),
    JobState.PAUSING: frozenset(
        {JobState.PREEMPTED, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT}
    ),
    JobState.PREEMPTED: frozenset({JobState.LOADING, JobState.CANCELLED, JobState.FAILED}),
    JobState.COMPLETED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.TIMEOUT: frozenset(),
}


class DependencyKind(enum.Enum):
    """Slurm's dependency types: start after the other job ended well, ended at all, or ended badly."""

    AFTEROK = "afterok"
    AFTERANY = "afterany"
    AFTERNOTOK = "afternotok"
    SINGLETON = "singleton"  # no job id: no other unfinished job of its user and name runs or is queued ahead

    def met_by(self, state: JobState) -> bool | None:
        """True: a job in `state` satisfies it; False: it never will; None: not yet (the job has not ended)."""
        if not state.is_terminal:
            return None
        if self is DependencyKind.AFTERANY:
            return True
        return (state is JobState.COMPLETED) == (self is DependencyKind.AFTEROK)


@dataclass(frozen=True, slots=True)
class Dependency:
    """Start only once job `job_id` ended as `kind` asks (a job unknown to the engine never satisfies it)."""

    kind: DependencyKind
    job_id: str


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a user asked for. Immutable; times are on the caller's clock (seconds)."""

    job_id: str
    gpus: int
    model: str
    batch_size: int  # global batch per optimizer step; never changed by the scheduler
    iterations: int
    submit_time: float = 0.0
    name: str = ""
    user: str = "nobody"
    tenant: str = "default"
    deadline: float | None = None  # absolute time on the same clock as submit_time
    guaranteed: bool = False
    dependencies: tuple[Dependency, ...] = ()  # every one must be met before it is queued
    time_limit: float | None = None  # seconds each run may last (from its launch); then it ends as TIMEOUT
    array_id: str = ""  # the job array it is a task of ("": none)
    array_limit: int = 0  # at most this many tasks of its array queued or running at once (0: no limit)
    begin_time: float | None = None  # not queued before this time (Slurm's --begin), on submit_time's clock
    plan: str | None = None  # the execution plan asked for (Rubick; meshsched.perf.plans string form)
    cpus: int | None = None  # CPU cores asked for in all (None: the node's share per GPU)
    memory_gb: float | None = None  # host memory asked for in all, GB (None: the node's share per GPU)
    signal: int = 0  # sent to its ranks (SignalJob) signal_time seconds before each run's time limit (0: none)
    signal_time: float = 60.0

    def __post_init__(self) -> None:
        if not self.job_id:
            raise ValueError("job_id must not be empty")
        if self.cpus is not None and self.cpus < 1:
            raise ValueError(f"job {self.job_id}: cpus must be >= 1, got {self.cpus}")
        if self.memory_gb is not None and not self.memory_gb > 0:
            raise ValueError(f"job {self.job_id}: memory_gb must be > 0, got {self.memory_gb}")
        if self.gpus < 1:
            raise ValueError(f"job {self.job_id}: gpus must be >= 1, got {self.gpus}")
        if self.batch_size < 1:
            raise ValueError(f"job {self.job_id}: batch_size must be >= 1, got {self.batch_size}")
        if self.iterations < 1:
            raise ValueError(f"job {self.job_id}: iterations must be >= 1, got {self.iterations}")
        if self.time_limit is not None and not self.time_limit > 0:
            raise ValueError(f"job {self.job_id}: time_limit must be > 0 seconds, got {self.time_limit}")
        if self.signal < 0 or not self.signal_time >= 0:
            raise ValueError(f"job {self.job_id}: signal must be >= 0 and signal_time >= 0 seconds")
        if self.array_limit < 0 or (self.array_limit and not self.array_id):
            raise ValueError(f"job {self.job_id}: array_limit needs an array_id and must be >= 0")


@dataclass(frozen=True, slots=True)
class ExecConfig:
    """How a job's ranks train: engine state, journaled with the job, carried by Launch and Reconfigure.

    `micro_batch` x `accumulation` is the per-GPU batch of one optimizer step, so the global batch never
    changes (Castor Algorithm 2). `mps_percentage` is each rank's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
    `memory_limit_mb` its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (None: no limit); both are fixed when a rank's CUDA
    context is created, so changing them (or `plan`, an execution plan such as Rubick's) needs a restart.
    `local_batches` (Gimbal's LISS) gives each rank its own samples per step, summing to `per_gpu_batch` x
    ranks so the global batch is unchanged (None: every rank takes `per_gpu_batch`); it changes in-process.
    An allocator that resizes jobs (Rubick) sets `gpus` (GPUs held when not the request), `cpus_per_gpu` and
    `memory_gb_per_gpu` (host memory); None leaves them unaccounted. Changing any of them needs a restart.
    """

    micro_batch: int
    accumulation: int = 1
    mps_percentage: int = 100
    memory_limit_mb: int | None = None
    plan: str | None = None
    local_batches: tuple[int, ...] | None = None
    gpus: int | None = None
    cpus_per_gpu: int | None = None
    memory_gb_per_gpu: float | None = None

    def __post_init__(self) -> None:
        if (self.gpus is not None and self.gpus < 1) or (self.cpus_per_gpu is not None and self.cpus_per_gpu < 1):
            raise ValueError(f"gpus and cpus_per_gpu must be >= 1, got {self.gpus}, {self.cpus_per_gpu}")
        if self.micro_batch < 1 or self.accumulation < 1:
            raise ValueError(f"micro_batch and accumulation must be >= 1, got {self.micro_batch} x {self.accumulation}")
        if not 1 <= self.mps_percentage <= 100:
            raise ValueError(f"mps_percentage must be in [1, 100], got {self.mps_percentage}")
        if self.memory_limit_mb is not None and self.memory_limit_mb < 1:
            raise ValueError(f"memory_limit_mb must be >= 1, got {self.memory_limit_mb}")
        if self.local_batches is not None:
            lb = self.local_batches
            if not lb or min(lb) < 1 or sum(lb) != self.per_gpu_batch * len(lb):
                raise ValueError(f"local_batches {list(lb)} must be values >= 1 summing to {self.per_gpu_batch} x "
                                 f"{len(lb)} ranks (the per-step batch across ranks is fixed)")

    @classmethod
    def default_for(cls, spec: JobSpec) -> ExecConfig:
        """The job's whole per-GPU batch in one step, a full GPU, no plan (one shared value per batch: frozen)."""
        batch = max(1, spec.batch_size // spec.gpus)
        x = _DEFAULT_EXEC.get(batch)
        if x is None or cls is not ExecConfig:
            x = cls(batch)
            if cls is ExecConfig:
                _DEFAULT_EXEC[batch] = x
        return x

    @property
    def per_gpu_batch(self) -> int:
        return self.micro_batch * self.accumulation

    def needs_restart(self, new: ExecConfig) -> bool:
        """Whether going from self to `new` needs a checkpoint and restart (MPS limits, plan), rather than a
        change at a step boundary through the SDK (micro-batch, accumulation)."""
        return self._restart_key() != new._restart_key()

    def _restart_key(self) -> tuple:
        return (self.mps_percentage, self.memory_limit_mb, self.plan, self.gpus, self.cpus_per_gpu,
                self.memory_gb_per_gpu)

    def describe(self) -> str:
        """One line for logs: `micro-batch 4 x 2, MPS 50%, memory 8000 MB, plan P`."""
        out = f"micro-batch {self.micro_batch} x {self.accumulation}, MPS {self.mps_percentage}%"
        if self.memory_limit_mb:
            out += f", memory {self.memory_limit_mb} MB"
        return out + (f", plan {self.plan}" if self.plan else "")

    def to_dict(self) -> dict:
        out = {"micro_batch": self.micro_batch, "accumulation": self.accumulation,
               "mps_percentage": self.mps_percentage, "memory_limit_mb": self.memory_limit_mb, "plan": self.plan,
               "local_batches": None if self.local_batches is None else list(self.local_batches)}
        for key in ("gpus", "cpus_per_gpu", "memory_gb_per_gpu"):  # only when an allocator set them
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> ExecConfig:
        lb = d.get("local_batches")
        return cls(int(d["micro_batch"]), int(d.get("accumulation", 1)), int(d.get("mps_percentage", 100)),
                   d.get("memory_limit_mb"), d.get("plan"), None if lb is None else tuple(int(b) for b in lb),
                   d.get("gpus"), d.get("cpus_per_gpu"), d.get("memory_gb_per_gpu"))

    def samples(self, ranks: int) -> tuple[int, ...]:
        """Each rank's samples per step."""
        if self.local_batches is None:
            return (self.per_gpu_batch,) * ranks
        if len(self.local_batches) != ranks:
            raise ValueError(f"local_batches {list(self.local_batches)} name {len(self.local_batches)} ranks, not {ranks}")
        return self.local_batches


_DEFAULT_EXEC: dict[int, ExecConfig] = {}  # per-GPU batch -> its default ExecConfig (built once: every start asks)


def placement_shape(nodes: list[str]) -> tuple[int, ...]:
    """GPUs used on each node, largest first (what the performance model is keyed by), from the node of each of
    a job's GPUs. One GPU, or all on one node, without counting."""
    if len(nodes) == 1:
        return (1,)
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n] = counts.get(n, 0) + 1
    return (len(nodes),) if len(counts) == 1 else tuple(sorted(counts.values(), reverse=True))


@dataclass(frozen=True, slots=True)
class CalibrationMemo:
    """What a calibration layer remembers about a job between calls (engine state, so a rebuilt leader keeps
    it): the packing set it last calibrated, when, and the running totals a benchmark reads."""

    packing: tuple  # signature of the packing set last searched ((job, GPUs, length) of each member, sorted)
    at: float  # when it was last searched
    searches: int = 0  # searches run for this job's packing sets
    changes: int = 0  # Reconfigures issued for this job
    lgrr_changes: int = 0  # of which changed its MPS share (LGRR: a restart)
    lgrr_paid_s: float = 0.0  # LGRR switch time charged for them
    search_lgrr_s: float = 0.0  # switch time Algorithm 1 would have paid exploring live (sets this job led)
    done: float = 0.0  # iterations it estimated done at `at` (newer than the engine's when no report came since)
    step_s: float = 0.0  # seconds per step it predicted from `at` on, under the calibration it chose


@dataclass(slots=True)
class JobAccounting:
    """Where a job's time went (Lazer Eq. 1: JCT = W + L + T + P) and what it cost."""

    first_start: float | None = None
    finish_time: float | None = None
    wait_time: float = 0.0  # W: queued (PENDING or PREEMPTED)
    load_time: float = 0.0  # L: LOADING
    run_time: float = 0.0  # T: RUNNING
    pause_time: float = 0.0  # P: PAUSING
    futile_time: float = 0.0  # load time thrown away by a preemption during LOADING (Lazer Eq. 2)
    futile_preemptions: int = 0
    preemptions: int = 0
    attained_gpu_time: float = 0.0  # GPU-seconds of training received (Tiresias' attained service)


@dataclass(slots=True)
class Job:
    """A job and where it stands. Only `Engine` changes it."""

    spec: JobSpec
    ideal_step_time: float  # seconds per iteration alone on its best placement (perf model estimate)
    state: JobState = JobState.PENDING
    gpus: tuple[int, ...] = ()  # global GPU indices held while LOADING/RUNNING/PAUSING
    since: float = 0.0  # when the current state began
    done_iterations: float = 0.0  # at `progress_time`, as last known (checkpoint or report)
    checkpoint_iterations: float = 0.0  # progress a restart resumes from
    progress_time: float = 0.0
    step_time: float = 0.0  # current estimate of seconds per iteration while RUNNING
    rate_since: float = 0.0  # when a GPU partner last started or stopped training next to it (its rate changed)
    restarts: int = 0
    reason: str = ""  # pending reason (Slurm-style) or end reason
    acct: JobAccounting = field(default_factory=JobAccounting)
    exec: ExecConfig | None = None  # how it trains now (set at every start; None before the first)
    exec_pending: ExecConfig | None = None  # asked for by a Reconfigure, not yet reported applied
    deferred_until: float | None = None  # a preemption policy deferred its decision until then (Lazer)
    rank_step_times: tuple[float, ...] = ()  # latest per-rank step times reported (calibration reads them)
    reported: tuple[float, float] | None = None  # (iterations, step time) as the job last reported them; None: never
    calibration: CalibrationMemo | None = None  # the calibration layer's memory of this job
    held: bool = False  # a user hold: not queued until released (Slurm's JobHeldUser)
    time_limit_at: float | None = None  # when its current run exceeds the spec's time limit
    timing_out: bool = False  # stopped by its time limit: its pause ends it as TIMEOUT, not queued again
    avoid: frozenset[str] = frozenset()  # jobs it never shares a GPU with again: a GPU fault hit them together

    def may_pair(self, other: Job) -> bool:
        """Whether `other` may share a GPU with it (not a pair a GPU fault hit: meshsched.faults)."""
        return other.job_id not in self.avoid and self.job_id not in other.avoid

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    def transition(self, new: JobState, now: float) -> None:
        """Move to `new`, charging the time spent in the old state to the job's accounting."""
        old = self.state
        if new not in _ALLOWED[old]:
            raise InvalidTransition(f"job {self.job_id}: {old.value} -> {new.value} is not allowed")
        spent = now - self.since
        acct = self.acct
        if old in _QUEUED:
            acct.wait_time += spent
        elif old is JobState.LOADING:
            acct.load_time += spent
        elif old is JobState.RUNNING:
            acct.run_time += spent
            acct.attained_gpu_time += spent * self.spec.gpus
        elif old is JobState.PAUSING:
            acct.pause_time += spent
        self.state = new
        self.since = now

    def iterations_at(self, now: float) -> float:
        """Estimated iterations done by `now` (extrapolated while RUNNING)."""
        if self.state is JobState.RUNNING and self.step_time > 0:
            done = self.done_iterations + (now - self.progress_time) / self.step_time
            return min(done, float(self.spec.iterations))
        return self.done_iterations

    def remaining_time(self, now: float) -> float:
        """Expected seconds of training left, on its ideal placement (SRTF's priority)."""
        return max(0.0, self.spec.iterations - self.iterations_at(now)) * self.ideal_step_time

    @property
    def expected_duration(self) -> float:
        """Expected training seconds for the whole job alone (SJF's priority)."""
        return self.spec.iterations * self.ideal_step_time


@dataclass(slots=True)
class Gpu:
    index: int  # global index in the cluster
    node: str
    local_index: int
    gpu_type: str
    memory_mb: int
    jobs: list[str] = field(default_factory=list)  # at most MAX_JOBS_PER_GPU


MAX_JOBS_PER_GPU = 2
CHANGE_LOG = 1024  # `ClusterState.changes` kept; a cache further behind rebuilds from scratch


@dataclass(slots=True)
class Node:
    name: str
    gpus: list[int]  # global GPU indices
    alive: bool = True
    gpu_type: str = ""
    memory_mb: int = 0
    cpus: int = 0  # CPU cores for jobs
    host_memory_gb: float = 0.0  # host memory for jobs

    @property
    def size(self) -> int:
        return len(self.gpus)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A server. CPUs and host memory default to the Rubick paper's testbed share per GPU (96 vCPUs and
    1,600 GB for 8 A800s: 12 cores and 200 GB per GPU)."""

    name: str
    gpus: int
    gpu_type: str
    gpu_memory_mb: int
    address: str = ""  # where its ranks are reached from other nodes (a mesh's MASTER_ADDR); not for scheduling
    cpus: int | None = None
    memory_gb: float | None = None

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"node {self.name}: needs at least one GPU")
        if (self.cpus is not None and self.cpus < 1) or (self.memory_gb is not None and not self.memory_gb > 0):
            raise ValueError(f"node {self.name}: cpus and memory_gb must be positive, got {self.cpus}, {self.memory_gb}")

    @property
    def cpu_count(self) -> int:
        return self.cpus if self.cpus is not None else CPUS_PER_GPU * self.gpus

    @property
    def host_memory_gb(self) -> float:
        return self.memory_gb if self.memory_gb is not None else HOST_MEMORY_GB_PER_GPU * self.gpus


CPUS_PER_GPU = 12  # the Rubick paper's testbed: 96 vCPUs per 8-GPU server
HOST_MEMORY_GB_PER_GPU = 200.0  # and 1,600 GB of memory



class InvariantViolation(AssertionError):
    """`ClusterState.validate` found the state inconsistent."""


@dataclass(slots=True)
class ClusterState(ChangeLog, FreeMap):
    """All nodes, GPUs and jobs. `free_by_node` caches how many GPUs of each node hold no job."""

    nodes: dict[str, Node] = field(default_factory=dict)
    gpus: list[Gpu] = field(default_factory=list)
    jobs: dict[str, Job] = field(default_factory=dict)
    free_by_node: dict[str, int] = field(default_factory=dict)
    total_gpus: int = 0  # GPUs on live nodes (kept by add_node / mark_lost)
    largest_node: int = 0  # GPUs of the biggest live node
    version: int = 0  # bumped (by `touch`) on every change of who holds which GPU and on every event but a submit
    gpu_types: tuple[str, ...] = ()  # GPU types of the live nodes (kept by add_node / mark_lost)
    changes: deque = field(default_factory=lambda: deque(maxlen=CHANGE_LOG), repr=False, compare=False)
    drained: set = field(default_factory=set)  # GPUs out of service (meshsched.drain): never free for a new job
    shared_gpus: int = 0  # GPUs holding two jobs (kept by assign / release): none, and no job has a GPU partner
    # (_free_version, free_by_node, (its nodes with a free GPU, their free GPUs)): `free_summary` between changes
    _free_memo: tuple | None = field(default=None, init=False, repr=False, compare=False)
    _free_version: int = field(default=0, init=False, repr=False, compare=False)  # bumped where free_by_node moves

    def set_drained(self, gpus: set[int], drained: bool) -> None:
        """Take GPUs out of service or give them back: a drained GPU never counts as free (every placement layer
        reads `free_by_node`), and its node lists it after its other GPUs (so a free one is picked first)."""
        self.drained = self.drained | gpus if drained else self.drained - gpus
        self._free_version += 1
        for name in {self.gpus[g].node for g in gpus}:
            node = self.nodes[name]
            node.gpus.sort(key=lambda g: (g in self.drained, g))
            self.free_by_node[name] = self._free_on(node) if node.alive else 0
        self.touch()

    def _free_on(self, node: Node) -> int:
        return sum(1 for g in node.gpus if not self.gpus[g].jobs and g not in self.drained)

    def add_node(self, spec: NodeSpec) -> Node:
        self._free_version += 1
        if spec.name in self.nodes:
            node = self.nodes[spec.name]
            if node.alive:
                raise ValueError(f"node {spec.name} already joined")
            node.alive = True
            self.free_by_node[spec.name] = self._free_on(node)
            self._resize()
            self.touch_nodes()
            return node
        first = len(self.gpus)
        for i in range(spec.gpus):
            self.gpus.append(Gpu(first + i, spec.name, i, spec.gpu_type, spec.gpu_memory_mb))
        node = Node(spec.name, list(range(first, first + spec.gpus)), True, spec.gpu_type, spec.gpu_memory_mb,
                    spec.cpu_count, spec.host_memory_gb)
        self.nodes[spec.name] = node
        self.free_by_node[spec.name] = spec.gpus
        self._resize()
        self.touch_nodes()
        return node

    def mark_lost(self, name: str) -> None:
        """The node is gone: its GPUs count for nothing (jobs on it must already be released)."""
        self.nodes[name].alive = False
        self._free_version += 1
        self.free_by_node[name] = 0
        self._resize()
        self.touch_nodes()

    def _resize(self) -> None:
        alive = [n.size for n in self.nodes.values() if n.alive]
        self.total_gpus = sum(alive)
        self.largest_node = max(alive, default=0)
        self.gpu_types = tuple(sorted({n.gpu_type for n in self.nodes.values() if n.alive}))

    @property
    def free_gpus(self) -> int:
        return sum(self.free_by_node.values())

    def assign(self, job_id: str, gpus: tuple[int, ...]) -> None:
        self.touch(job_id)
        free = self._free_copy()
        self._free_version += 1
        fbn = self.free_by_node
        taken = 0
        for g in gpus:
            gpu = self.gpus[g]
            if len(gpu.jobs) >= MAX_JOBS_PER_GPU:
                raise InvariantViolation(f"GPU {g} already holds {gpu.jobs}")
            if not gpu.jobs:
                if g not in self.drained:
                    node = gpu.node
                    n = fbn[node] = fbn[node] - 1
                    taken += 1
                    if free is not None:
                        if n:
                            free[node] = n
                        else:
                            del free[node]
            else:
                self.shared_gpus += 1
            gpu.jobs.append(job_id)
        if free is not None:
            self._free_memo = (self._free_version, fbn, (free, self._free_memo[2][1] - taken))

    def release(self, job_id: str, gpus: tuple[int, ...]) -> None:
        self.touch(job_id)
        free = self._free_copy()
        self._free_version += 1
        fbn = self.free_by_node
        freed = 0
        for g in gpus:
            gpu = self.gpus[g]
            gpu.jobs.remove(job_id)
            if gpu.jobs:
                self.shared_gpus -= 1
            elif self.nodes[gpu.node].alive and g not in self.drained:
                node = gpu.node
                n = fbn[node] = fbn[node] + 1
                freed += 1
                if free is not None:
                    if n == 1:
                        free = None  # the node joins the free map, in node order: counted again when asked
                    else:
                        free[node] = n
        if free is not None:
            self._free_memo = (self._free_version, fbn, (free, self._free_memo[2][1] + freed))

    def validate(self) -> None:
        """Check every invariant; raise InvariantViolation naming the first one broken."""

        def fail(msg: str) -> None:
            raise InvariantViolation(msg)

        holders: dict[int, list[str]] = {}
        cpus: dict[str, float] = {}
        memory: dict[str, float] = {}
        for job in self.jobs.values():
            st = job.state
            if st.holds_gpus:
                want = job.exec.gpus if job.exec is not None and job.exec.gpus is not None else job.spec.gpus
                if len(job.gpus) != want:
                    fail(f"{job.job_id} ({st.value}) holds {len(job.gpus)} GPUs, asked for {want}")
                if job.exec is not None:
                    for g in job.gpus:
                        node = self.gpus[g].node
                        cpus[node] = cpus.get(node, 0) + (job.exec.cpus_per_gpu or 0)
                        memory[node] = memory.get(node, 0.0) + (job.exec.memory_gb_per_gpu or 0.0)
                if len(set(job.gpus)) != len(job.gpus):
                    fail(f"{job.job_id} holds a GPU twice: {job.gpus}")
                for g in job.gpus:
                    holders.setdefault(g, []).append(job.job_id)
            elif job.gpus:
                fail(f"{job.job_id} is {st.value} but still holds GPUs {job.gpus}")
            if not 0.0 <= job.done_iterations <= job.spec.iterations + 1e-6:
                fail(f"{job.job_id} progress {job.done_iterations} outside [0, {job.spec.iterations}]")
            if job.checkpoint_iterations > job.done_iterations + 1e-6:
                fail(f"{job.job_id} checkpoint ahead of progress")
            if st is JobState.COMPLETED and job.done_iterations < job.spec.iterations - 1e-6:
                fail(f"{job.job_id} COMPLETED with {job.done_iterations}/{job.spec.iterations} iterations")
        for gpu in self.gpus:
            if len(gpu.jobs) > MAX_JOBS_PER_GPU:
                fail(f"GPU {gpu.index} holds {len(gpu.jobs)} jobs (max {MAX_JOBS_PER_GPU})")
            if sorted(gpu.jobs) != sorted(holders.get(gpu.index, [])):
                fail(f"GPU {gpu.index} lists {gpu.jobs} but jobs holding it are {holders.get(gpu.index, [])}")
            if gpu.jobs and not self.nodes[gpu.node].alive:
                fail(f"GPU {gpu.index} on lost node {gpu.node} still holds {gpu.jobs}")
        for name, used in cpus.items():
            node = self.nodes[name]
            if used > node.cpus or memory[name] > node.host_memory_gb + 1e-6:
                fail(f"node {name}: jobs hold {used} CPUs and {memory[name]:.1f} GB, it has {node.cpus} and "
                     f"{node.host_memory_gb:g} GB")
        if self.shared_gpus != sum(len(gpu.jobs) > 1 for gpu in self.gpus):
            fail(f"cached shared_gpus {self.shared_gpus} but {sum(len(g.jobs) > 1 for g in self.gpus)} GPUs hold two jobs")
        alive = [n.size for n in self.nodes.values() if n.alive]
        if (self.total_gpus, self.largest_node) != (sum(alive), max(alive, default=0)):
            fail(f"cached sizes {self.total_gpus}/{self.largest_node} do not match the live nodes")
        for name, node in self.nodes.items():
            want = self._free_on(node) if node.alive else 0
            if self.free_by_node.get(name, 0) != want:
                fail(f"node {name}: free count {self.free_by_node.get(name)} but {want} GPUs are free")
