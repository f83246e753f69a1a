"""Rubick's scheduling policy (MLSys'25, Sec. 5, Algorithm 1), and the allocators the paper compares it with,
as knobs of one placement policy: which plans it may pick, whether GPUs are elastic, whether CPUs are tuned,
whether guarantees and quotas hold, and in which order jobs are served.

One pass (on every arrival and release):
1. privileged jobs: queued guaranteed jobs whose minimum demand fits their tenant's remaining quota (a job's
   quota use is its minimum demand), oldest first, are scheduled, shrinking others if they must;
2. best-effort queued jobs and running jobs, steepest GPU slope first, are scheduled (queued: started; running:
   grown). ScheduleJob takes free GPUs first (the fewest nodes; the paper takes a node's free GPUs and then
   shrinks on that node before moving on), then shrinks, one GPU at a time, the job with the lowest slope above
   its minimum demand, while that job loses less per GPU than this one gains (a running job's loss counts
   RUNNING_MARGIN more: it pays a restart) or while this one is a guaranteed job below its minimum (a
   best-effort job's minimum is 0). A job shrunk below its fewest valid GPUs is preempted. The best plan for
   the placement is chosen (ZeRO-Offload plans get the CPUs they gain from), then host memory (AllocMem).
   A job's GPU count is how far its curve stays steep: it grows while a step adds >= THETA of its mean
   throughput per GPU (rubick_curves.Curves.desired); the paper's job takes all free resources and is shrunk
   by steeper ones.
Running jobs carry out changes through the engine: same GPUs with a new plan or CPUs -> Reconfigure (a
checkpoint-restart); other GPUs -> Evict, then Start with the new allocation in the pass after it paused.
Beyond the paper, against restart churn: a change a running job is not forced into happens only if the time
it saves on its remaining work pays PAYBACK restarts (plus what it costs the running jobs it shrinks), and a
job (re)started less than LEASE restart times ago is changed only for a guaranteed job below its minimum.
Guaranteed jobs are never placed or shrunk where their plan model says they would run slower than asked.
CPUs are one count per GPU for a job (uniform over its nodes); memory is per GPU from its plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from meshsched.perf.plans import ExecutionPlan, InvalidPlan, PlanPerfModel, Resources, iteration_time
from meshsched.perf.errors import UnknownProfile
from meshsched.policies.base import ClusterView, Cycle, Decision, Evict, Reconfigure, Start, Wait
from meshsched.policies.rubick_curves import HOST_BASE_GB, MIN_CPUS_PER_GPU, Ask, Curves, PlanSpace
from meshsched.state import ExecConfig, Job, JobSpec, JobState

RUNNING_MARGIN = 1.25  # a running job is shrunk only for a gain this much larger than its loss (it restarts)
PAYBACK = 2.0  # a voluntary change of a running job must save this many restart times on its remaining work
LEASE = 10.0  # a job runs this many restart times after a (re)start before it is changed again, unless a
# guaranteed job needs its GPUs to reach its minimum


@dataclass(frozen=True, slots=True)
class Knobs:
    """What an allocator may change. Rubick: everything; its paper's baselines and variants: less."""

    space: PlanSpace
    elastic: bool  # GPUs may differ from the ask
    tune_cpus: bool  # CPUs per GPU follow the plan's sensitivity (else: as asked)
    guarantees: bool  # guaranteed jobs, quotas, minimum demands (else: every job best-effort)
    preempt: bool  # may shrink running jobs (to zero: preemption)
    by_slope: bool  # serve the steepest curve first (else: oldest first)


VARIANTS: dict[str, Knobs] = {
    "full": Knobs(PlanSpace.ALL, True, True, True, True, True),
    "e": Knobs(PlanSpace.ALL, False, False, True, True, True),  # Rubick-E: plans only, fixed resources
    "r": Knobs(PlanSpace.DP, True, True, True, True, True),  # Rubick-R: resources only, DP size scaled
    "n": Knobs(PlanSpace.FIXED, False, False, True, True, True),  # Rubick-N: neither
}


class Rubick:
    """The allocator; `name` and `knobs` pick Rubick, a variant or a baseline (rubick_baselines)."""

    periodic = False
    monotone = False

    def __init__(self, perf: PlanPerfModel, knobs: Knobs = VARIANTS["full"], quotas: dict[str, int] | None = None,
                 name: str = "rubick") -> None:
        self.name = name
        self.perf = perf
        self.knobs = knobs
        self.quotas = dict(quotas or {})
        self.curves = Curves(perf, knobs.space)
        self._asks: dict[tuple, Ask] = {}

    # -- the placement-layer protocol ------------------------------------------------------------------------

    def queue_key(self, job: Job) -> tuple:
        return (job.spec.submit_time,)

    def next_timer(self, view: ClusterView, now: float) -> float | None:
        return None

    def try_start(self, view: ClusterView, cycle: Cycle, job: Job):
        return None  # Rubick owns its pass; it is not a companion of a preemption layer

    def admission_error(self, view: ClusterView, spec: JobSpec) -> str | None:
        """One line saying why `spec` could never run under this allocator, or None."""
        try:
            ask = self.ask(view, spec)
        except (InvalidPlan, UnknownProfile) as e:
            return f"{spec.job_id}: {e}"
        cap = view.total_gpus
        if not self.knobs.elastic and spec.gpus > cap:
            return f"{spec.job_id}: asks for {spec.gpus} GPUs with fixed resources; the cluster has {cap}"
        if self.knobs.elastic and self.curves.first_valid(spec.model, ask, self._curve_cpus(view, ask), max(cap, 1)) == 0:
            return f"{spec.job_id}: no plan of {spec.model} fits on the cluster's {cap} GPUs"
        if self._guaranteed(spec):
            quota = self.quotas.get(spec.tenant, 0)
            if ask.min_gpus > quota:
                return (f"{spec.job_id}: guaranteed job needs at least {ask.min_gpus} GPU(s) of tenant "
                        f"{spec.tenant}'s quota, which is {quota} (submit it best-effort, or raise the quota)")
        return None

    def place(self, view: ClusterView, cycle: Cycle) -> list[Decision]:
        p = _Pass(self, view, cycle.now)
        queued = [j for j in view.queue()]
        used = p.quota_use()
        waiting: dict[str, str] = {}
        rest: list[Job] = []
        for job in sorted(queued, key=lambda j: (j.spec.submit_time, j.job_id)):
            if not self._guaranteed(job.spec):
                rest.append(job)
                continue
            ask = self.ask(view, job.spec)
            quota = self.quotas.get(job.spec.tenant, 0)
            if used.get(job.spec.tenant, 0) + ask.min_gpus > quota:
                waiting[job.job_id] = f"Quota (tenant {job.spec.tenant}: {used.get(job.spec.tenant, 0)} of {quota} GPUs in use)"
                continue
            if p.schedule(job, ask):
                used[job.spec.tenant] = used.get(job.spec.tenant, 0) + ask.min_gpus
        running = [a.job for a in p.allocs.values() if a.movable and a.job.state is JobState.RUNNING]
        replans = self.knobs.elastic or self.knobs.tune_cpus or self.knobs.space is not PlanSpace.FIXED
        pool = rest + (running if replans else [])
        if self.knobs.by_slope:
            pool.sort(key=lambda j: (-p.slope(j), j.spec.submit_time, j.job_id))
        else:
            pool.sort(key=lambda j: (j.spec.submit_time, j.job_id))
        for job in pool:
            p.schedule(job, self.ask(view, job.spec))
        return p.decisions(waiting)

    # -- helpers ---------------------------------------------------------------------------------------------

    def _guaranteed(self, spec: JobSpec) -> bool:
        return self.knobs.guarantees and spec.guaranteed

    def ask(self, view: ClusterView, spec: JobSpec) -> Ask:
        key = (spec.model, spec.gpus, spec.plan, spec.cpus, self._guaranteed(spec))
        if key not in self._asks:
            self._asks[key] = self.curves.ask_of(replace(spec, guaranteed=self._guaranteed(spec)),
                                                 _node_cpus_per_gpu(view))
        return self._asks[key]

    def _curve_cpus(self, view: ClusterView, ask: Ask) -> int:
        """CPUs per GPU the curves assume: a node's share when CPUs are tuned, else the ask."""
        return max(ask.cpus, _node_cpus_per_gpu(view)) if self.knobs.tune_cpus else ask.cpus


def _node_cpus_per_gpu(view: ClusterView) -> int:
    return min((n.cpus // n.size for n in view.nodes()), default=MIN_CPUS_PER_GPU) or MIN_CPUS_PER_GPU


CPU_CAP = 32  # CPUs per GPU tried at most for a ZeRO-Offload plan


@dataclass(slots=True)
class _Alloc:
    """A job's allocation in this pass (tentative until the pass emits it); `cpus_on`/`mem_on`: what it
    holds of each node's CPUs and host memory."""

    job: Job
    ask: Ask | None  # None: a job this allocator cannot model (left alone)
    gpus: dict[str, list[int]]  # node -> GPU indices
    cpus: int = 0  # per GPU
    memory_gb: float = 0.0  # per GPU
    plan: ExecutionPlan | None = None
    plan_s: float = 0.0  # its plan's iteration time here
    movable: bool = True  # may change in this pass (not loading, pausing or mid-reconfiguration)
    leased: bool = False  # (re)started less than LEASE restarts ago: changed only for a guaranteed job's minimum
    cpus_on: dict[str, int] = field(default_factory=dict)
    mem_on: dict[str, float] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.gpus.values())

    def copy(self) -> _Alloc:
        return _Alloc(self.job, self.ask, {n: list(g) for n, g in self.gpus.items()}, self.cpus, self.memory_gb,
                      self.plan, self.plan_s, self.movable, self.leased, dict(self.cpus_on), dict(self.mem_on))

    def sig(self) -> tuple:
        return (tuple(sorted(g for gs in self.gpus.values() for g in gs)), self.cpus, str(self.plan))

    def shape(self) -> tuple[int, ...]:
        return tuple(sorted((len(v) for v in self.gpus.values() if v), reverse=True))


class _Pass:
    """The tentative allocation of one pass: free GPUs, CPUs and memory per node, every job's allocation."""

    def __init__(self, policy: Rubick, view: ClusterView, now: float) -> None:
        self.policy, self.view, self.now = policy, view, now
        self.knobs, self.curves, self.perf = policy.knobs, policy.curves, policy.perf
        nodes = view.nodes()
        self.cap = max(1, min(view.total_gpus, 64))
        self.free = {n.name: [g for g in n.gpus if view.gpu_is_free(g)] for n in nodes}
        self.free_cpus = {n.name: n.cpus for n in nodes}
        self.free_mem = {n.name: n.host_memory_gb for n in nodes}
        # CPUs per GPU kept for a node's free GPUs (0 on a node with fewer CPUs than GPUs: none to keep)
        self.share = {n.name: n.cpus // n.size for n in nodes}
        self.node_cpus = _node_cpus_per_gpu(view)
        self.allocs: dict[str, _Alloc] = {}
        self.before: dict[str, tuple] = {}
        self.now_cpus: dict[str, int] = {}  # CPUs and memory free now (not in the pass's plan): what a Start may use
        self.now_mem: dict[str, float] = {}
        for job in view.holding():
            x = job.exec_pending or job.exec or ExecConfig.default_for(job.spec)
            a = _Alloc(job, None, {})
            for g in job.gpus:
                a.gpus.setdefault(view.node_of(g), []).append(g)
            a.cpus, a.memory_gb = x.cpus_per_gpu or 0, x.memory_gb_per_gpu or 0.0
            # mid-reconfiguration it holds the larger of its old and new CPUs and memory until it restarted
            old = job.exec or x
            held_cpus = max(a.cpus, old.cpus_per_gpu or 0)
            held_mem = max(a.memory_gb, old.memory_gb_per_gpu or 0.0)
            for node, gs in a.gpus.items():
                a.cpus_on[node], a.mem_on[node] = held_cpus * len(gs), held_mem * len(gs)
                self.free_cpus[node] -= a.cpus_on[node]
                self.free_mem[node] -= a.mem_on[node]
            try:
                a.ask = policy.ask(view, job.spec)
                a.plan = None if x.plan is None else ExecutionPlan.parse(x.plan)
            except (InvalidPlan, UnknownProfile):
                a.ask = None
            a.movable = (a.ask is not None and a.plan is not None and job.state is JobState.RUNNING
                         and job.exec_pending is None)
            a.leased = now - job.since < LEASE * (self.perf.pause_time(job.spec.model) + self.perf.load_time(job.spec.model))
            if a.plan is not None and a.ask is not None:
                a.plan_s = self._time(a, a.plan, a.shape(), max(a.cpus, MIN_CPUS_PER_GPU))
            self.allocs[job.job_id] = a
            self.before[job.job_id] = a.sig()
        self.now_cpus, self.now_mem = dict(self.free_cpus), dict(self.free_mem)

    # -- views of one job -----------------------------------------------------------------------------------

    def _time(self, a: _Alloc, plan: ExecutionPlan, shape: tuple[int, ...], cpus: int) -> float:
        return iteration_time(self.perf.profile(a.job.spec.model), plan, Resources(shape, float(cpus)), self.perf.env)

    def _ccpus(self, a: _Alloc) -> int:
        return max(a.ask.cpus, self.node_cpus) if self.knobs.tune_cpus else a.ask.cpus

    def _speed(self, a: _Alloc, gpus: int) -> float:
        return self.curves.speed(a.job.spec.model, a.ask, gpus, self._ccpus(a), self.cap)

    def _floor(self, a: _Alloc) -> int:
        """GPUs below which the job cannot keep running: its guarantee's, or its fewest valid count."""
        if a.ask.guaranteed:
            return a.ask.min_gpus
        if not self.knobs.elastic:
            return a.ask.gpus
        return self.curves.first_valid(a.job.spec.model, a.ask, self._ccpus(a), self.cap)

    def _target(self, a: _Alloc) -> int:
        if not self.knobs.elastic:
            return a.ask.gpus
        return max(self.curves.desired(a.job.spec.model, a.ask, self._ccpus(a), self.cap), self._floor(a))

    def _gain(self, a: _Alloc, target: int) -> float:
        """What a step up adds per GPU (from nothing: its first valid allocation's throughput per GPU)."""
        if a.count == 0:
            first = max(self._floor(a), 1) if self.knobs.elastic else a.ask.gpus
            return self._speed(a, first) / first
        if not self.knobs.elastic:
            return 0.0
        return self.curves.up_slope(a.job.spec.model, a.ask, a.count, target, self._ccpus(a), self.cap)[0]

    def _loss(self, v: _Alloc) -> float:
        """What taking a GPU from `v` costs per GPU (fixed resources: all of it goes, so its mean per GPU)."""
        if not self.knobs.elastic:
            return self._speed(v, v.count) / v.count
        return self._speed(v, v.count) - self._speed(v, v.count - 1)

    def slope(self, job: Job) -> float:
        a = self.allocs.get(job.job_id) or _Alloc(job, self.policy.ask(self.view, job.spec), {})
        return self._gain(a, self._target(a))

    def quota_use(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for a in self.allocs.values():
            if a.ask is not None and a.ask.guaranteed:
                used[a.job.spec.tenant] = used.get(a.job.spec.tenant, 0) + a.ask.min_gpus
        return used

    # -- ScheduleJob -----------------------------------------------------------------------------------------

    def schedule(self, job: Job, ask: Ask) -> bool:
        """Algorithm 1's ScheduleJob for one job; False (and nothing changed) if it gets no new allocation."""
        a = self.allocs.get(job.job_id)
        if a is not None and (not a.movable or a.leased):
            return False
        saved = self._save()
        if a is None:
            a = self.allocs[job.job_id] = _Alloc(job, ask, {})
        had = a.count
        target, floor = self._target(a), self._floor(a)
        if target <= 0 or (had >= target and not self.knobs.tune_cpus and self.knobs.space is PlanSpace.FIXED):
            self._restore(saved)
            return False
        self._take_free(a, target)
        if self.knobs.preempt:
            self._shrink_others(a, target)
        if a.count < max(floor, 1) or not self._settle(a):
            self._restore(saved)
            return False
        if had and not self._worth_it(a, saved[0]):
            self._restore(saved)
            return False
        return True

    def _per_gpu_cpus(self, a: _Alloc) -> int:
        return MIN_CPUS_PER_GPU if self.knobs.tune_cpus else a.ask.cpus

    def _take_free(self, a: _Alloc, target: int) -> None:
        """Free GPUs up to `target`: the job's own nodes first, then the fullest node that holds the rest,
        else the emptiest nodes. A GPU comes with its CPUs (the fewest, or the ask's when not tuned) and no
        more GPUs are taken on a node than its free memory holds at the least any plan needs per GPU."""
        each = self._per_gpu_cpus(a)
        while a.count < target:
            need = target - a.count
            usable = {n: min(len(f), self.free_cpus[n] // each,
                             int((self.free_mem[n] + a.mem_on.get(n, 0.0)) // HOST_BASE_GB) - len(a.gpus.get(n, ())))
                      for n, f in self.free.items()}
            usable = {n: u for n, u in usable.items() if u > 0}
            if not usable:
                return
            mine = [n for n in usable if n in a.gpus]
            fit = [n for n in usable if usable[n] >= need]
            if mine:
                node = max(mine, key=lambda n: (usable[n], n))
            elif fit:
                node = min(fit, key=lambda n: (usable[n], n))
            else:
                node = max(usable, key=lambda n: (usable[n], n))
            k = min(need, usable[node])
            taken, self.free[node] = self.free[node][:k], self.free[node][k:]
            a.gpus.setdefault(node, []).extend(taken)
            a.cpus_on[node] = a.cpus_on.get(node, 0) + each * k
            self.free_cpus[node] -= each * k

    def _shrink_others(self, a: _Alloc, target: int) -> None:
        """Take GPUs from the job with the lowest slope above its minimum, while it loses less than `a`
        gains or `a` is below its minimum (Algorithm 1, lines 9-17)."""
        while a.count < target:
            gain = self._gain(a, target)
            below_min = a.ask.guaranteed and a.count < a.ask.min_gpus  # best-effort jobs' minimum is 0
            victim, loss = None, 0.0
            for v in self.allocs.values():
                if v is a or not v.movable or v.ask is None or v.count == 0 or (v.leased and not below_min):
                    continue
                if v.ask.guaranteed and (v.count <= v.ask.min_gpus or not self.knobs.elastic):
                    continue  # never below its minimum demand
                d = self._loss(v) * (RUNNING_MARGIN if v.job.state is JobState.RUNNING else 1.0)
                if victim is None or d < loss:
                    victim, loss = v, d
            if victim is None or not (loss < gain or below_min):
                return
            before = a.count
            if not self._take_from(victim, a, target):
                return
            if a.count == before:
                return

    def _take_from(self, v: _Alloc, a: _Alloc, target: int) -> bool:
        """Free one GPU of `v` (all of them with fixed resources) for `a`: on a node `a` uses, else on `v`'s
        node with the fewest of its GPUs; a guaranteed `v` only where it keeps its guarantee."""
        for node in sorted(v.gpus, key=lambda n: (n not in a.gpus, len(v.gpus[n]), n)):
            if v.ask.guaranteed and not self._keeps_guarantee(v, node):
                continue
            if self.knobs.elastic:
                self._give_back(v, node, 1)
                self._settle_victim(v)
            else:
                for n in list(v.gpus):
                    self._give_back(v, n, len(v.gpus[n]))
                v.plan, v.plan_s, v.cpus, v.memory_gb = None, 0.0, 0, 0.0
            self._take_free(a, target)
            return True
        return False

    def _keeps_guarantee(self, v: _Alloc, node: str) -> bool:
        """Whether guaranteed `v`, one GPU fewer on `node`, settles (trimming as _settle_victim does) on GPUs
        no fewer than its minimum demand where a plan still reaches its asked performance."""
        left = {n: len(g) - (n == node) for n, g in v.gpus.items()}
        while sum(left.values()) >= max(v.ask.min_gpus, 1):
            shape = tuple(sorted((k for k in left.values() if k), reverse=True))
            if self.curves.meets_guarantee(v.job.spec.model, v.ask, shape, max(v.cpus, MIN_CPUS_PER_GPU)):
                return True
            fewest = min((n for n in left if left[n]), key=lambda n: (left[n], n))
            left[fewest] -= 1
        return False

    def _give_back(self, v: _Alloc, node: str, k: int) -> None:
        """`v` returns `k` GPUs on `node` with their share of its CPUs and memory there."""
        gs = v.gpus[node]
        back, v.gpus[node] = gs[len(gs) - k:], gs[: len(gs) - k]
        cpus = v.cpus_on.get(node, 0) * k // len(gs)
        mem = v.mem_on.get(node, 0.0) * k / len(gs)
        v.cpus_on[node] = v.cpus_on.get(node, 0) - cpus
        v.mem_on[node] = v.mem_on.get(node, 0.0) - mem
        self.free_cpus[node] += cpus
        self.free_mem[node] += mem
        self.free[node].extend(back)
        if not v.gpus[node]:
            del v.gpus[node]
            self.free_cpus[node] += v.cpus_on.pop(node, 0)
            self.free_mem[node] += v.mem_on.pop(node, 0.0)

    def _settle_victim(self, v: _Alloc) -> None:
        """A shrunk job: the best plan on what it keeps, at its CPUs per GPU; it gives back the GPUs no plan
        can use (all of them when none fits: a preemption)."""
        while v.count and not self._settle(v, keep_cpus=True):
            self._give_back(v, min(v.gpus, key=lambda n: (len(v.gpus[n]), n)), 1)
        if not v.count:
            v.plan, v.plan_s, v.cpus, v.memory_gb = None, 0.0, 0, 0.0

    def _settle(self, a: _Alloc, keep_cpus: bool = False) -> bool:
        """GetBestPlan for the placement, CPUs for it (tuned: the fewest within 1% of the best time on what
        its nodes have), then AllocMem. Nothing changes and False if no plan fits, a node lacks the CPUs or
        memory, or a guaranteed job would run slower than asked."""
        model, shape = a.job.spec.model, a.shape()
        if not shape:
            return False
        # tuned CPUs leave each still-free GPU of the node its proportional share (Synergy's rule: no job gets
        # less than its GPU-proportional CPUs unless it gains nothing from them; extra comes from the rest)
        reserve = {n: self.share[n] * len(self.free[n]) if self.knobs.tune_cpus and not keep_cpus else 0
                   for n in a.gpus}
        room = {n: self.free_cpus[n] + a.cpus_on.get(n, 0) - reserve[n] for n in a.gpus}
        most = min(room[n] // len(gs) for n, gs in a.gpus.items())
        if keep_cpus:
            want = max(a.cpus, MIN_CPUS_PER_GPU)
        elif self.knobs.tune_cpus:
            want = min(most, CPU_CAP)
        else:
            want = a.ask.cpus
        if want > most or want < MIN_CPUS_PER_GPU:
            return False
        best = self.curves.best(model, a.ask, shape, want)
        if best is None:
            return False
        cpus = want
        if self.knobs.tune_cpus and not keep_cpus:
            low = max(a.ask.min_cpus if a.ask.guaranteed else 0, MIN_CPUS_PER_GPU)
            cpus = next((c for c in range(low, want + 1) if self._time(a, best.plan, shape, c) <= best.iter_s * 1.01),
                        want)
        t = self._time(a, best.plan, shape, cpus)
        if a.ask.guaranteed and t > a.ask.base_s * (1 + 1e-9):
            return False
        mem = self.curves.host_gb_per_gpu(model, best.plan)
        if any(self.free_mem[n] + a.mem_on.get(n, 0.0) < mem * len(gs) - 1e-9 for n, gs in a.gpus.items()):
            return False
        for n, gs in a.gpus.items():
            self.free_cpus[n] += a.cpus_on.get(n, 0) - cpus * len(gs)
            self.free_mem[n] += a.mem_on.get(n, 0.0) - mem * len(gs)
            a.cpus_on[n], a.mem_on[n] = cpus * len(gs), mem * len(gs)
        a.plan, a.plan_s, a.cpus, a.memory_gb = best.plan, t, cpus, mem
        return True

    def _worth_it(self, a: _Alloc, old_allocs: dict[str, _Alloc]) -> bool:
        """A running job's voluntary change saves, on its remaining work, PAYBACK restarts of its own plus
        what it costs the running jobs it shrank (their restarts and slowdown)."""
        old = old_allocs[a.job.job_id]
        if a.sig() == old.sig():
            return True
        cost = PAYBACK * self._restart_s(a.job)
        for job_id, o in old_allocs.items():
            b = self.allocs[job_id]
            if b is a or job_id not in self.before or b.sig() == o.sig() or b.job.state is not JobState.RUNNING:
                continue
            slower = b.plan_s - o.plan_s if b.count else o.plan_s  # preempted: charged as if at half speed
            cost += self._restart_s(b.job) + self._left(b.job) * max(0.0, slower)
        return self._left(a.job) * (old.plan_s - a.plan_s) > cost

    def _restart_s(self, job: Job) -> float:
        return self.perf.pause_time(job.spec.model) + self.perf.load_time(job.spec.model)

    def _left(self, job: Job) -> float:
        return max(0.0, job.spec.iterations - job.iterations_at(self.now))

    def _save(self) -> tuple:
        return ({k: v.copy() for k, v in self.allocs.items()}, {n: list(g) for n, g in self.free.items()},
                dict(self.free_cpus), dict(self.free_mem))

    def _restore(self, saved: tuple) -> None:
        allocs, free, cpus, mem = saved
        self.allocs = {k: v.copy() for k, v in allocs.items()}
        self.free, self.free_cpus, self.free_mem = {n: list(g) for n, g in free.items()}, dict(cpus), dict(mem)

    # -- what the pass decided -------------------------------------------------------------------------------

    def _fits_now(self, a: _Alloc) -> bool:
        """Whether the CPUs and memory a new start takes are free now (jobs the pass shrank may still hold
        theirs until they checkpoint); if so they are taken."""
        if any(a.cpus_on[n] > self.now_cpus[n] or a.mem_on[n] > self.now_mem[n] + 1e-9 for n in a.gpus):
            return False
        for n in a.gpus:
            self.now_cpus[n] -= a.cpus_on[n]
            self.now_mem[n] -= a.mem_on[n]
        return True

    def decisions(self, waiting: dict[str, str]) -> list[Decision]:
        out: list[Decision] = []
        name = self.policy.name
        started: set[str] = set()
        for job_id, a in self.allocs.items():
            if a.job.state.is_queued:
                gpus = tuple(sorted(g for gs in a.gpus.values() for g in gs))
                # GPUs taken from a running job come free once it has checkpointed: start in a later pass
                if a.count and a.plan is not None and all(self.view.gpu_is_free(g) for g in gpus) and self._fits_now(a):
                    out.append(Start(job_id, gpus, f"{name}: plan {a.plan}, {a.cpus} CPUs/GPU", _exec(a)))
                    started.add(job_id)
                continue
            if a.sig() == self.before[job_id]:
                continue
            if not a.count:
                out.append(Evict(job_id, f"{name}: preempted, its GPUs went to a steeper job"))
            elif a.sig()[0] != self.before[job_id][0]:
                out.append(Evict(job_id, f"{name}: {len(self.before[job_id][0])} -> {a.count} GPUs; restarts "
                                         f"with plan {a.plan}"))
            else:
                out.append(Reconfigure(job_id, _exec(a), f"{name}: plan {a.plan}, {a.cpus} CPUs/GPU"))
        for job in self.view.queue():
            a = self.allocs.get(job.job_id)
            if job.job_id in waiting:
                out.append(Wait(job.job_id, waiting[job.job_id]))
            elif job.job_id not in started:
                out.append(Wait(job.job_id, "Resources" if a is None or not a.count else
                                "Resources (its GPUs come free when the jobs giving them up have checkpointed)"))
        return out


def _exec(a: _Alloc) -> ExecConfig:
    plan = a.plan
    micro = max(1, a.job.spec.batch_size // (plan.dp * plan.ga))
    return ExecConfig(micro, plan.ga, plan=str(plan), gpus=a.count, cpus_per_gpu=a.cpus,
                      memory_gb_per_gpu=round(a.memory_gb, 3))
