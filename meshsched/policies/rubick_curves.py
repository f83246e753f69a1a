"""Rubick's view of one job (Sec. 5): what it asked for and is guaranteed, the plans it may run, the best plan
for an allocation, and its resource-sensitivity curve (normalised throughput against GPUs). Pure.

Throughput is normalised by the job's asked configuration (its plan on a compact placement of the asked GPUs
and CPUs): 1.0 is the performance a guaranteed job is owed, so slopes of different models compare (the
paper's Fig. 8 normalises the same way). `PlanSpace` says which plans a scheduler may pick: every plan
(Rubick), the asked plan with its data-parallel size scaled (Sia, Rubick-R) or the asked plan only (Synergy,
Rubick-N). Caches live on the `Curves` object, which one policy owns.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from meshsched.perf.placement import ideal_placement
from meshsched.perf.plans import (
    ExecutionPlan, InvalidPlan, PlanPerfModel, Resources, candidate_plans, check_plan, fits, gpu_memory_gb,
    host_memory_gb, iteration_time,
)
from meshsched.state import JobSpec

HOST_BASE_GB = 8.0  # host memory per GPU besides ZeRO-Offload's states (framework, data loader)
MIN_CPUS_PER_GPU = 1  # the fewest CPU cores a GPU's process gets
THETA = 0.5  # a GPU more is worth asking for while it adds >= THETA x the job's throughput per GPU so far


class PlanSpace(enum.Enum):
    ALL = "all"  # every plan the model knows (Rubick)
    DP = "dp"  # the asked plan, its DP size scaled with the GPUs (Sia; Rubick-R)
    FIXED = "fixed"  # the asked plan on the asked GPUs only (Synergy; Rubick-N)


@dataclass(frozen=True, slots=True)
class Ask:
    """What a job asked for: its plan, GPUs and CPUs per GPU; `base_s` the iteration time that gives (the
    guarantee); `min_gpus`/`min_cpus` its minimum demand (minRes: the fewest resources, with any plan, that
    still reach `base_s`; 0 for best-effort jobs)."""

    plan: ExecutionPlan
    gpus: int
    cpus: int
    base_s: float
    min_gpus: int
    min_cpus: int
    guaranteed: bool


@dataclass(frozen=True, slots=True)
class Choice:
    plan: ExecutionPlan
    iter_s: float


class Curves:
    """Best plans and sensitivity curves over one plan-model catalog, cached per (model, plan space, shape)."""

    def __init__(self, perf: PlanPerfModel, space: PlanSpace, node_size: int = 8) -> None:
        self.perf = perf
        self.env = perf.env
        self.space = space
        self.node_size = node_size
        self._best: dict[tuple, Choice | None] = {}
        self._curve: dict[tuple, list[float]] = {}

    # -- asks ----------------------------------------------------------------------------------------------

    def ask_of(self, spec: JobSpec, node_cpus_per_gpu: int) -> Ask:
        """The job's ask (InvalidPlan with one line if it cannot run as asked)."""
        prof = self.perf.profile(spec.model)
        cpus = max(MIN_CPUS_PER_GPU, -(-spec.cpus // spec.gpus)) if spec.cpus else min(4, node_cpus_per_gpu)
        shape = ideal_placement(spec.gpus, self.node_size)
        if spec.plan is None:
            best = self.best_any(spec.model, shape, cpus)
            if best is None:
                raise InvalidPlan(f"no plan of {spec.model} fits GPU memory on {spec.gpus} GPU(s)")
            plan, base = best.plan, best.iter_s
        else:
            plan = ExecutionPlan.parse(spec.plan)
            check_plan(prof.spec, plan, Resources(shape))
            need = gpu_memory_gb(prof.spec, plan, self.env)
            if need > self.env.gpu_memory_gb:
                raise InvalidPlan(f"plan {plan} of {spec.model} needs ~{need:.0f} GB per GPU; a GPU has "
                                  f"{self.env.gpu_memory_gb:g} GB (out of memory)")
            base = iteration_time(prof, plan, Resources(shape, float(cpus)), self.env)
        min_gpus = min_cpus = 0
        if spec.guaranteed:
            min_gpus, min_cpus = self._min_demand(spec, plan, cpus, base)
        return Ask(plan, spec.gpus, cpus, base, min_gpus, min_cpus, spec.guaranteed)

    def _min_demand(self, spec: JobSpec, plan: ExecutionPlan, cpus: int, base: float) -> tuple[int, int]:
        """The fewest GPUs, then CPUs per GPU, no more than asked in each, with a plan of this space reaching
        `base` on a compact placement; the ask itself when none does (Sec. 5, minRes)."""
        ask = Ask(plan, spec.gpus, cpus, base, 0, 0, True)
        for g in range(1, spec.gpus + 1):
            shape = ideal_placement(g, self.node_size)
            if not self._meets(spec.model, ask, shape, cpus, base):
                continue  # more CPUs than asked are not counted on
            for c in range(MIN_CPUS_PER_GPU, cpus + 1):
                if self._meets(spec.model, ask, shape, c, base):
                    return g, c
        return spec.gpus, cpus

    def _meets(self, model: str, ask: Ask, shape: tuple[int, ...], cpus: int, base: float) -> bool:
        got = self.best(model, ask, shape, cpus)
        return got is not None and got.iter_s <= base * (1 + 1e-9)

    def meets_guarantee(self, model: str, ask: Ask, shape: tuple[int, ...], cpus: int) -> bool:
        """Whether some plan of this space on this exact placement reaches the job's asked performance."""
        return self._meets(model, ask, shape, cpus, ask.base_s)

    # -- plans ---------------------------------------------------------------------------------------------

    def plans(self, model: str, ask: Ask | None, gpus: int) -> list[ExecutionPlan]:
        """The plans of this space for `gpus` GPUs that fit GPU memory (`ask` unused for PlanSpace.ALL)."""
        spec = self.perf.profile(model).spec
        if self.space is PlanSpace.ALL or ask is None:
            return [p for p in candidate_plans(spec, gpus) if fits(spec, p, self.env)]
        if self.space is PlanSpace.FIXED:
            return [ask.plan] if gpus == ask.gpus else []
        a = ask.plan
        mp = a.tp * a.pp
        if gpus % mp or spec.global_batch % (gpus // mp):
            return []
        d = gpus // mp
        for ga in range(1, spec.global_batch // d + 1):  # the fewest accumulation steps that fit
            if (spec.global_batch // d) % ga == 0:
                p = replace(a, dp=d, ga=ga)
                if fits(spec, p, self.env):
                    return [p]
        return []

    def best(self, model: str, ask: Ask, shape: tuple[int, ...], cpus: int) -> Choice | None:
        """The fastest plan of this space on `shape` (GPUs per node) with `cpus` per GPU; None if none fits.
        Only ZeRO-Offload plans depend on the CPUs (its optimizer step runs there), so the others are
        searched once per shape."""
        key = (model, self.space, None if self.space is PlanSpace.ALL else (ask.plan, ask.gpus),
               tuple(sorted(shape, reverse=True)))
        gpu = self._search(key, False, cpus)
        off = self._search(key, True, cpus)
        if gpu is None or (off is not None and off.iter_s < gpu.iter_s):
            return off
        return gpu

    def _search(self, key: tuple, offload: bool, cpus: int) -> Choice | None:
        full = (*key, offload, cpus if offload else 0)
        if full not in self._best:
            model, shape = key[0], key[3]
            prof = self.perf.profile(model)
            res = Resources(shape, float(cpus))
            ask = Ask(key[2][0], key[2][1], cpus, 1.0, 0, 0, False) if key[2] is not None else None
            best: Choice | None = None
            for p in self.plans(model, ask, res.gpus):
                if p.offload != offload:
                    continue
                t = iteration_time(prof, p, res, self.env)
                if best is None or t < best.iter_s:
                    best = Choice(p, t)
            self._best[full] = best
        return self._best[full]

    def best_any(self, model: str, shape: tuple[int, ...], cpus: int) -> Choice | None:
        """The fastest plan of any kind (what an unplanned job is taken to ask for)."""
        prof = self.perf.profile(model)
        res = Resources(tuple(shape), float(cpus))
        best: Choice | None = None
        for p in candidate_plans(prof.spec, res.gpus):
            if fits(prof.spec, p, self.env):
                t = iteration_time(prof, p, res, self.env)
                if best is None or t < best.iter_s:
                    best = Choice(p, t)
        return best

    def host_gb_per_gpu(self, model: str, plan: ExecutionPlan) -> float:
        return host_memory_gb(self.perf.profile(model).spec, plan) + HOST_BASE_GB

    # -- sensitivity curves --------------------------------------------------------------------------------

    def speed(self, model: str, ask: Ask, gpus: int, cpus: int, cap: int) -> float:
        """The curve at `gpus`: the best normalised throughput on any valid count <= gpus (flat over invalid
        counts and degraded ones, as the paper's Fig. 6), compact placements, `cpus` per GPU."""
        if gpus <= 0:
            return 0.0
        key = (model, self.space, None if self.space is PlanSpace.ALL else (ask.plan, ask.gpus), cpus)
        curve = self._curve.setdefault(key, [0.0])  # steps per second, envelope
        while len(curve) <= min(gpus, cap):
            got = self.best(model, ask, ideal_placement(len(curve), self.node_size), cpus)
            curve.append(max(curve[-1], 1.0 / got.iter_s if got is not None else 0.0))
        return ask.base_s * curve[min(gpus, cap)]

    def first_valid(self, model: str, ask: Ask, cpus: int, cap: int) -> int:
        """The fewest GPUs any plan of this space runs on (0: none up to `cap`)."""
        for g in range(1, cap + 1):
            if self.speed(model, ask, g, cpus, cap) > 0:
                return g
        return 0

    def up_slope(self, model: str, ask: Ask, have: int, upto: int, cpus: int, cap: int) -> tuple[float, int]:
        """(gain per GPU, GPUs) of the best step up from `have` to at most `upto` GPUs."""
        here = self.speed(model, ask, have, cpus, cap)
        best, to = 0.0, have
        for g in range(have + 1, min(upto, cap) + 1):
            s = (self.speed(model, ask, g, cpus, cap) - here) / (g - have)
            if s > best + 1e-12:
                best, to = s, g
        return best, to

    def down_slope(self, model: str, ask: Ask, have: int, cpus: int, cap: int) -> float:
        """Throughput lost per GPU taken from `have`."""
        return self.speed(model, ask, have, cpus, cap) - self.speed(model, ask, have - 1, cpus, cap)

    def desired(self, model: str, ask: Ask, cpus: int, cap: int) -> int:
        """How many GPUs the job can use well: from its fewest valid count, step up while a step adds at least
        THETA x its throughput per GPU so far (Rubick grows the job with the steepest curve; this is where a
        curve turns flat enough that a GPU is worth more elsewhere)."""
        g = self.first_valid(model, ask, cpus, cap)
        if g == 0:
            return 0
        while g < cap:
            slope, to = self.up_slope(model, ask, g, min(cap, g + 2 * self.node_size), cpus, cap)
            if to == g or slope < THETA * self.speed(model, ask, g, cpus, cap) / g:
                break
            g = to
        return g
