"""Gimbal (gimbal.txt sections 4-5), pure: squeeze/swell primitives on workers, mapped onto LGRR (an MPS
active-thread limit in 10% steps) and LISS (samples moved between a job's ranks, the global batch fixed); the
objectives and priorities of eq. 1-6 (JCT, deadline, makespan); Algorithm 1 (CoordinationSearch, early exit
after 3 failed steps, LGRR switches charged, LISS free); and the packing rules (<= 2 workers per GPU, fewest
nodes, J_max packing sets) are in gimbal_packing.py.

Readings of the paper, where it is silent or its equations disagree with its text (we follow the text):
- Priority: a larger value is a higher priority (Alg. 1 lines 3-4 make subset2, the larger Priority, the
  high-priority set). Eq. 2 (JCT, -Utilization) agrees with its text. Eq. 4 and eq. 6 as printed say the
  opposite of their texts ("jobs closer to their deadlines have higher priority"; "shorter jobs are squeezed
  to speed up the completion of longer jobs"), so their signs are flipped: deadline priority =
  -(time to deadline - remaining time), makespan priority = +remaining time.
- Eq. 3 as printed minimises the headroom max(0, D - R/T); its text minimises "the duration of jobs that
  exceed their deadlines": the lateness max(0, R/T - D), which we use. D is the time left to the deadline.
- A subset's priority (line 3) is the mean of its jobs' priorities; swell(subset2) (line 5) is one +10%
  LGRR step for its workers below 100%.
- A step succeeds when it lowers the best objective seen so far; three failures in a row end the search, and
  the best calibration is kept (going back to it may cost one more LGRR switch).
- A slow worker (GetWorkers) takes more than (1 + STRAGGLER_TOLERANCE) x its job's fastest worker's time.
- LISS moves samples in proportion to the measured speeds (LB-BSP): b_w' ~ b_w / t_w. Under LISS, to swell
  a worker is to take samples from it, to squeeze it to give it more.
- Mapping rule 1 of section 4.2 (LGRR on some workers, then LISS for the stragglers it creates): every job
  but J_max whose workers straggle is rebalanced by LISS in the same step.
- One LGRR switch per step however many workers it touches (they switch in parallel: section 7.4).
"""

from __future__ import annotations

import enum
import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, Protocol

from meshsched.perf.mps_share import MpsShareModel, Partner, ShareCurve, job_step_s
from meshsched.policies.gimbal_packing import GpuRef, packing_violation

MPS_STEP = 10  # LGRR granularity, % of the GPU (section 7.4)
MPS_MIN = 10
MPS_MAX = 100
LGRR_SWITCH_S = 3.6  # the paper's measured switch with a CUDA context pool (section 7.4)
COLLECT_MAX_S = 60.0  # runtime information per calibration step: at most 60 s or 5 steps (section 5.2)
COLLECT_MAX_STEPS = 5
MAX_FAILED = 3  # early exit after three consecutive steps without gain (Alg. 1 line 9)
STRAGGLER_TOLERANCE = 0.05  # the H100 measurements' run-to-run spread


class Mechanism(enum.Enum):
    LGRR = "lgrr"  # MPS active-thread percentage
    LISS = "liss"  # local samples per step


class WorkerId(NamedTuple):
    """A job's rank (a tuple: hashed and compared in C, as runtime maps' keys are on every evaluation)."""

    job: str
    rank: int


def _keep_hash(obj, fields: tuple) -> int:
    """hash(fields), kept on the frozen `obj` (its `_hash`; a 0 hash is computed again, harmlessly)."""
    h = hash(fields)
    object.__setattr__(obj, "_hash", h)
    return h


@dataclass(frozen=True, slots=True)
class Squeeze:
    """Slow a worker down: LGRR to a lower MPS %, or LISS to more local samples; `to` is the new value."""

    worker: WorkerId
    via: Mechanism
    to: int


@dataclass(frozen=True, slots=True)
class Swell:
    """Speed a worker up: LGRR to a higher MPS %, or LISS to fewer local samples; `to` is the new value."""

    worker: WorkerId
    via: Mechanism
    to: int


Primitive = Squeeze | Swell


def check_mps_percent(percent: int) -> None:
    if percent not in range(MPS_MIN, MPS_MAX + 1, MPS_STEP):
        raise ValueError(f"MPS share must be one of {MPS_MIN}..{MPS_MAX}% in {MPS_STEP}% steps, got {percent}")


@dataclass(frozen=True, slots=True)
class WorkerSetting:
    mps_percent: int
    samples: int

    def __post_init__(self) -> None:
        check_mps_percent(self.mps_percent)
        if self.samples < 1:
            raise ValueError(f"a worker needs at least one sample per step, got {self.samples}")


@dataclass(frozen=True, slots=True)
class JobCalibration:
    """One job's per-rank settings; its global batch is the sum of the ranks' samples."""

    job: str
    settings: tuple[WorkerSetting, ...]
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:  # (kept: searches key their evaluations by calibrations)
        return self._hash or _keep_hash(self, (self.job, self.settings))

    @classmethod
    def even(cls, job: str, global_batch: int, world_size: int, mps_percent: int = MPS_MAX) -> JobCalibration:
        samples = split_samples(global_batch, [1.0] * world_size)
        return cls(job, tuple(WorkerSetting(mps_percent, b) for b in samples))

    @property
    def global_batch(self) -> int:
        return sum(s.samples for s in self.settings)


@dataclass(frozen=True, slots=True)
class Calibration:
    """The settings of every job of a packing set."""

    jobs: tuple[JobCalibration, ...]
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        return self._hash or _keep_hash(self, self.jobs)

    def job(self, job: str) -> JobCalibration:
        for jc in self.jobs:
            if jc.job == job:
                return jc
        raise KeyError(f"no calibration for job {job!r}")

    def setting(self, worker: WorkerId) -> WorkerSetting:
        return self.job(worker.job).settings[worker.rank]

    def apply(self, primitives: Iterable[Primitive]) -> Calibration:
        """The calibration after `primitives`; refuses a change of any job's global batch."""
        new: dict[str, list[WorkerSetting]] = {}  # the jobs the primitives change (the others are kept as they are)
        for p in primitives:
            job, rank = p.worker
            settings = new.get(job)
            if settings is None:
                settings = new[job] = list(self.job(job).settings)
            s = settings[rank]
            settings[rank] = (
                WorkerSetting(p.to, s.samples) if p.via is Mechanism.LGRR else WorkerSetting(s.mps_percent, p.to)
            )
        out = Calibration(tuple(jc if jc.job not in new else JobCalibration(jc.job, tuple(new[jc.job]))
                                for jc in self.jobs))
        for before, after in zip(self.jobs, out.jobs):
            if before is not after and before.global_batch != after.global_batch:
                raise ValueError(f"job {before.job}: global batch {before.global_batch} -> {after.global_batch}")
        return out


def plan_between(before: Calibration, after: Calibration) -> tuple[Primitive, ...]:
    """The primitives that take `before` to `after` (what an executor applies)."""
    out: list[Primitive] = []
    for jb in before.jobs:
        for rank, (s0, s1) in enumerate(zip(jb.settings, after.job(jb.job).settings)):
            w = WorkerId(jb.job, rank)
            if s1.mps_percent != s0.mps_percent:
                out.append((Swell if s1.mps_percent > s0.mps_percent else Squeeze)(w, Mechanism.LGRR, s1.mps_percent))
            if s1.samples != s0.samples:
                out.append((Squeeze if s1.samples > s0.samples else Swell)(w, Mechanism.LISS, s1.samples))
    return tuple(out)


def split_samples(total: int, weights: Sequence[float]) -> tuple[int, ...]:
    """`total` samples in proportion to `weights` (largest remainder), at least one each, summing to `total`."""
    n = len(weights)
    if n == 0 or total < n:
        raise ValueError(f"cannot split {total} samples over {n} workers with at least one each")
    if any(not (w > 0 and math.isfinite(w)) for w in weights):
        raise ValueError(f"weights must be positive and finite, got {list(weights)}")
    raw = [total * w / sum(weights) for w in weights]
    out = [max(1, math.floor(r)) for r in raw]
    by_fraction = sorted(range(n), key=lambda i: (-(raw[i] - math.floor(raw[i])), i))
    for i in itertools.islice(itertools.cycle(by_fraction), max(0, total - sum(out))):
        out[i] += 1
    while sum(out) > total:  # the at-least-one floor overshot: take from the largest
        out[max(range(n), key=lambda i: (out[i], -i))] -= 1
    return tuple(out)


# -- the packing set and its runtime information -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PackedJob:
    """A job of a packing set: rank r runs on gpus[r]."""

    job: str
    gpus: tuple[GpuRef, ...]
    remaining_steps: float
    utilization: float = 1.0  # solo GPU utilisation in (0, 1] (eq. 2)
    time_to_deadline_s: float | None = None  # deadline minus now (eq. 3-4); None: no deadline

    _workers: tuple[WorkerId, ...] = field(init=False, repr=False, compare=False)  # built once (a hot path)

    def __post_init__(self) -> None:
        if not self.gpus or len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"job {self.job}: needs distinct GPUs, one per rank, got {self.gpus}")
        if not (self.remaining_steps >= 0 and math.isfinite(self.remaining_steps)):
            raise ValueError(f"job {self.job}: remaining steps must be finite and >= 0")
        object.__setattr__(self, "_workers", tuple(WorkerId(self.job, r) for r in range(len(self.gpus))))

    @property
    def world_size(self) -> int:
        return len(self.gpus)

    def workers(self) -> tuple[WorkerId, ...]:
        return self._workers


@dataclass(frozen=True, slots=True)
class PackingSet:
    """Jobs packed on shared GPUs: J_max (the largest) shares with every other job, the others only with it."""

    jobs: tuple[PackedJob, ...]

    def __post_init__(self) -> None:
        why = packing_violation({j.job: j.gpus for j in self.jobs})
        if why is not None:
            raise ValueError(why)

    @property
    def j_max(self) -> PackedJob:
        return max(self.jobs, key=lambda j: j.world_size)  # the first listed on a tie

    def job(self, job: str) -> PackedJob:
        for j in self.jobs:
            if j.job == job:
                return j
        raise KeyError(f"job {job!r} is not in this packing set")

    def colocated(self, worker: WorkerId) -> tuple[WorkerId, ...]:
        """The other jobs' workers on this worker's GPU."""
        gpu = self.job(worker.job).gpus[worker.rank]
        return tuple(
            WorkerId(j.job, r) for j in self.jobs if j.job != worker.job for r, g in enumerate(j.gpus) if g == gpu
        )


@dataclass(frozen=True)
class Runtime:
    """Runtime information for one calibration: each worker's step time (compute, s) and each job's all-reduce."""

    worker_step_s: Mapping[WorkerId, float]
    comm_s: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for w, t in self.worker_step_s.items():
            if not (t > 0 and math.isfinite(t)):
                raise ValueError(f"worker {w.job}/{w.rank}: step time must be positive and finite, got {t}")

    def job_step_s(self, job: PackedJob) -> float:
        """The job's step: its slowest worker's (stragglers slow the whole job) plus its all-reduce."""
        return job_step_s((self.worker_step_s[w] for w in job.workers()), self.comm_s.get(job.job, 0.0))

    def remaining_s(self, job: PackedJob) -> float:
        """RemainingSteps / Throughput (eq. 1, 3-6)."""
        return job.remaining_steps * self.job_step_s(job)


def collection_window_s(pset: PackingSet, runtime: Runtime) -> float:
    """How long one calibration step collects runtime information: 5 steps of the slowest job, at most 60 s."""
    return min(COLLECT_MAX_S, COLLECT_MAX_STEPS * max(runtime.job_step_s(j) for j in pset.jobs))


# -- objectives and priorities (eq. 1-6) -------------------------------------------------------------------


class Objective(Protocol):
    name: str

    def value(self, pset: PackingSet, runtime: Runtime) -> float:
        """The local objective, to minimise."""
        ...

    def priority(self, job: PackedJob, runtime: Runtime) -> float:
        """Larger is more important (swelled first)."""
        ...


@dataclass(frozen=True, slots=True)
class JctObjective:
    name: str = "jct"

    def value(self, pset: PackingSet, runtime: Runtime) -> float:  # eq. 1
        return statistics.fmean(runtime.remaining_s(j) for j in pset.jobs)

    def priority(self, job: PackedJob, runtime: Runtime) -> float:  # eq. 2
        return -job.utilization


def _slack_s(job: PackedJob, runtime: Runtime) -> float:
    return math.inf if job.time_to_deadline_s is None else job.time_to_deadline_s - runtime.remaining_s(job)


@dataclass(frozen=True, slots=True)
class DeadlineObjective:
    name: str = "deadline"

    def value(self, pset: PackingSet, runtime: Runtime) -> float:  # eq. 3, as lateness
        return max(max(0.0, -_slack_s(j, runtime)) for j in pset.jobs)

    def priority(self, job: PackedJob, runtime: Runtime) -> float:  # eq. 4, sign as its text
        return -_slack_s(job, runtime)


@dataclass(frozen=True, slots=True)
class MakespanObjective:
    name: str = "makespan"

    def value(self, pset: PackingSet, runtime: Runtime) -> float:  # eq. 5
        return max(runtime.remaining_s(j) for j in pset.jobs)

    def priority(self, job: PackedJob, runtime: Runtime) -> float:  # eq. 6, sign as its text
        return runtime.remaining_s(job)


OBJECTIVES: Mapping[str, Objective] = MappingProxyType(
    {o.name: o for o in (JctObjective(), DeadlineObjective(), MakespanObjective())}
)


def subset_priority(objective: Objective, jobs: Sequence[PackedJob], runtime: Runtime) -> float:
    return statistics.fmean(objective.priority(j, runtime) for j in jobs) if jobs else -math.inf


# -- primitives from runtime information -------------------------------------------------------------------


def split_workers(job: PackedJob, runtime: Runtime, tolerance: float = STRAGGLER_TOLERANCE):
    """(slow, fast) workers of a job (GetWorkers): slow = more than (1 + tolerance) x the fastest's time."""
    times = {w: runtime.worker_step_s[w] for w in job.workers()}
    limit = (1.0 + tolerance) * min(times.values())
    slow = tuple(w for w, t in times.items() if t > limit)
    return slow, tuple(w for w in times if w not in slow)


def lgrr(calibration: Calibration, workers: Iterable[WorkerId], delta: int) -> tuple[Primitive, ...]:
    """One LGRR step of `delta` % for each worker that stays within [MPS_MIN, MPS_MAX]."""
    kind = Swell if delta > 0 else Squeeze
    out = []
    for w in workers:
        to = calibration.setting(w).mps_percent + delta
        if MPS_MIN <= to <= MPS_MAX:
            out.append(kind(w, Mechanism.LGRR, to))
    return tuple(out)


def liss(job: PackedJob, calibration: Calibration, runtime: Runtime) -> tuple[Primitive, ...]:
    """Move samples between the job's ranks in proportion to their measured speeds; the global batch is kept."""
    settings = calibration.job(job.job).settings
    workers = job.workers()
    speeds = [s.samples / runtime.worker_step_s[w] for w, s in zip(workers, settings)]
    target = split_samples(sum(s.samples for s in settings), speeds)
    return tuple(
        (Squeeze if b > s.samples else Swell)(w, Mechanism.LISS, b)
        for w, s, b in zip(workers, settings, target)
        if b != s.samples
    )


def generate_primitives(
    pset: PackingSet,
    low: Sequence[PackedJob],
    calibration: Calibration,
    runtime: Runtime,
    tolerance: float = STRAGGLER_TOLERANCE,
) -> tuple[Primitive, ...]:
    """Alg. 1 GeneratingPrimitives (lines 11-20), then LISS for the other straggling jobs (mapping rule 1)."""
    j_max = pset.j_max
    slow, _fast = split_workers(j_max, runtime, tolerance)
    out: list[Primitive] = []
    rebalanced = set()
    if not slow:
        out += lgrr(calibration, (w for j in low for w in j.workers()), -MPS_STEP)
    elif any(j.job == j_max.job for j in low):
        out += liss(j_max, calibration, runtime)  # swell the slow workers, squeeze the fast ones
        rebalanced.add(j_max.job)
    else:
        partners = sorted({p for w in slow for p in pset.colocated(w)})
        out += lgrr(calibration, partners, -MPS_STEP)
    for j in pset.jobs:
        if j.job != j_max.job and j.job not in rebalanced and split_workers(j, runtime, tolerance)[0]:
            out += liss(j, calibration, runtime)
    return tuple(out)


# -- Algorithm 1 -------------------------------------------------------------------------------------------

Evaluate = Callable[[Calibration], Runtime]


@dataclass(frozen=True, slots=True)
class SearchStep:
    primitives: tuple[Primitive, ...]
    objective: float
    improved: bool
    switch_s: float  # LGRR switch cost of this step (LISS is free)
    window_s: float  # runtime information collected after it


@dataclass(frozen=True, slots=True)
class SearchResult:
    initial: Calibration
    best: Calibration
    initial_objective: float
    best_objective: float
    steps: tuple[SearchStep, ...]
    exit: str  # "early-exit" (MAX_FAILED failures), "exhausted" (no primitive left), "max-steps"
    lgrr_back: bool  # going back from the last tried calibration to the best needs an LGRR switch
    lgrr_switch_s: float

    @property
    def plan(self) -> tuple[Primitive, ...]:
        return plan_between(self.initial, self.best)

    @property
    def switch_cost_s(self) -> float:
        return sum(s.switch_s for s in self.steps) + (self.lgrr_switch_s if self.lgrr_back else 0.0)

    @property
    def search_s(self) -> float:
        return self.switch_cost_s + sum(s.window_s for s in self.steps)

    @property
    def lgrr_switches(self) -> int:
        return sum(any(p.via is Mechanism.LGRR for p in s.primitives) for s in self.steps) + self.lgrr_back


def coordination_search(
    pset: PackingSet,
    initial: Calibration,
    evaluate: Evaluate,
    objective: Objective,
    *,
    max_failed: int = MAX_FAILED,
    max_steps: int | None = None,
    lgrr_switch_s: float = LGRR_SWITCH_S,
    tolerance: float = STRAGGLER_TOLERANCE,
    min_gain: float = 0.0,
) -> SearchResult:
    """Algorithm 1 over one packing set. `evaluate(calibration)` applies a calibration and returns the runtime
    information collected under it (a measurement, or the share model in the simulator). A step counts as a
    gain when it lowers the best objective by more than `min_gain` of it (0: any gain, as in the paper; set it
    to the measurement noise so that noise is not taken for a gain)."""
    if not 0.0 <= min_gain < 1.0:
        raise ValueError(f"min_gain must be in [0, 1), got {min_gain}")
    limit = 10 * len(pset.jobs) if max_steps is None else max_steps
    runtime = evaluate(initial)
    j_max = pset.j_max
    low: Sequence[PackedJob] = (j_max,)
    high: Sequence[PackedJob] = tuple(j for j in pset.jobs if j.job != j_max.job)
    if subset_priority(objective, high, runtime) < subset_priority(objective, low, runtime):
        low, high = high, low  # lines 3-4: `high` (subset2) is the high-priority subset
    best, best_obj = initial, objective.value(pset, runtime)
    initial_obj, current, steps, failed = best_obj, initial, [], 0

    def step(primitives: tuple[Primitive, ...]) -> bool:
        nonlocal current, runtime, best, best_obj
        current = current.apply(primitives)
        runtime = evaluate(current)
        value = objective.value(pset, runtime)
        improved = value < best_obj - max(min_gain * abs(best_obj), 1e-12 * max(1.0, abs(best_obj)))
        if improved:
            best, best_obj = current, value
        switch = lgrr_switch_s if any(p.via is Mechanism.LGRR for p in primitives) else 0.0
        steps.append(SearchStep(primitives, value, improved, switch, collection_window_s(pset, runtime)))
        return improved

    swell = lgrr(current, (w for j in high for w in j.workers()), +MPS_STEP)  # line 5
    if swell:
        step(swell)
    exit_reason = "max-steps"
    while len(steps) < limit:
        primitives = generate_primitives(pset, low, current, runtime, tolerance)
        if not primitives:
            exit_reason = "exhausted"
            break
        failed = 0 if step(primitives) else failed + 1
        if failed >= max_failed:
            exit_reason = "early-exit"
            break
    back = any(
        a.mps_percent != b.mps_percent
        for jc in current.jobs
        for a, b in zip(jc.settings, best.job(jc.job).settings)
    )
    return SearchResult(initial, best, initial_obj, best_obj, tuple(steps), exit_reason, back, lgrr_switch_s)


# -- the share model as an evaluator (simulator, benchmarks) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class JobPerf:
    """What the share model needs about one job: solo compute alpha + beta * samples at 100%, its curve, comm."""

    alpha_s: float
    beta_s: float
    curve: ShareCurve
    comm_s: float = 0.0


def model_evaluator(
    pset: PackingSet, perf: Mapping[str, JobPerf], xi: Callable[[str, str], float], model: MpsShareModel
) -> Evaluate:
    """An Evaluate from perf/mps_share.py; xi(job, partner) is the job's interference ratio at 100%/100%."""

    def evaluate(calibration: Calibration) -> Runtime:
        steps = {}
        for j in pset.jobs:
            p = perf[j.job]
            for w in j.workers():
                s = calibration.setting(w)
                partner = None
                for o in pset.colocated(w):
                    partner = Partner(xi(j.job, o.job), perf[o.job].curve, calibration.setting(o).mps_percent / 100)
                steps[w] = model.worker_step_s(p.alpha_s, p.beta_s, s.samples, p.curve, s.mps_percent / 100, partner)
        return Runtime(steps, {j.job: perf[j.job].comm_s for j in pset.jobs})

    return evaluate
