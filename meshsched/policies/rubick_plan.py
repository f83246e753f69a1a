"""Rubick's plan choice as the plan layer of any stack (`castor+lazer+gimbal+rubick`).

The placement layer picks the GPUs; this layer picks, for each job of an execution-plan profile, the plan and
the CPUs per GPU on those GPUs (Rubick's GetBestPlan and its CPU rule: the fastest plan with the CPUs the
job may use, then the fewest CPUs within 1 % of that time), and host memory for the plan:
- a Start of such a job gets that plan (the placement layer's own exec settings for it are replaced), so it
  never starts on its asked plan only to restart;
- a running job is replanned when what it may use changed: its CPUs per GPU are each of its GPUs' share of
  the node's CPUs, split among the jobs on that GPU, so a partner arriving or leaving changes them. A job
  holding more CPUs than its share now is replanned at once; a job that could run faster is replanned only
  if the time saved on its remaining work pays PAYBACK restarts, and not within LEASE restarts of its start.
- a job beside a partner keeps the micro-batch the placement layer sized to fit next to it: only plans with that
  micro-batch are chosen (another one may not fit in the GPU's memory beside the partner, or its slowdown is not
  profiled: the simulator failed such a job as out of memory).
Jobs of other models (no plan profile) are left to the other layers. Without this layer a job of a plan
profile trains on its asked plan with its asked CPUs.
"""

from __future__ import annotations

from dataclasses import replace

from meshsched.perf.errors import UnknownProfile
from meshsched.perf.plans import (
    ExecutionPlan, InvalidPlan, PlanPerfModel, Resources, candidate_plans, fits, host_memory_gb, iteration_time,
)
from meshsched.policies.base import ClusterView, Decision, Reconfigure, Start
from meshsched.policies.rubick import CPU_CAP, LEASE, PAYBACK
from meshsched.policies.rubick_curves import HOST_BASE_GB, MIN_CPUS_PER_GPU
from meshsched.state import ExecConfig, Job, JobState

WITHIN = 1.01  # the fewest CPUs whose time is within 1 % of the best


class RubickPlans:
    """The plan layer: `plan_start` fills a Start's exec, `replan` answers Reconfigure decisions."""

    def __init__(self, perf: PlanPerfModel, name: str = "rubick", models=None) -> None:
        self.name = name
        self.perf = perf
        self.catalog = perf.catalog
        # the models it plans (default: the catalog's; beside data-parallel profiles, those with a name of their own)
        self.models = frozenset(perf.catalog.profiles if models is None else models)
        self._best: dict[tuple, tuple[ExecutionPlan, int, float] | None] = {}

    def planned(self, model: str) -> bool:
        return model in self.models

    # -- starts --------------------------------------------------------------------------------------------

    def plan_start(self, view: ClusterView, d: Start) -> Start:
        job = view.job(d.job_id)
        if not self.planned(job.spec.model):
            return d
        micro = _partner_micro(view, d.gpus, job, d.exec)
        best = self.choose(job.spec.model, _shape(view, d.gpus), _cpu_room(view, d.gpus, joining=True),
                           job.spec.batch_size, micro)
        if best is None:
            return d  # no plan fits these GPUs: the job trains as the placement layer said
        plan, cpus, _ = best
        return replace(d, exec=self._exec(job, plan, cpus, len(d.gpus)),
                       reason=f"{d.reason}; {self.name}: plan {plan}, {cpus} CPUs/GPU")

    # -- running jobs --------------------------------------------------------------------------------------

    def replan(self, view: ClusterView, now: float) -> list[Decision]:
        decisions: list[Decision] = []
        for job in view.holding():
            if (job.state is not JobState.RUNNING or job.exec_pending is not None or not self.planned(job.spec.model)):
                continue
            d = self._replan_one(view, job, now)
            if d is not None:
                decisions.append(d)
        return decisions

    def _replan_one(self, view: ClusterView, job: Job, now: float) -> Reconfigure | None:
        room = _cpu_room(view, job.gpus)
        shape = _shape(view, job.gpus)
        x = job.exec or ExecConfig.default_for(job.spec)
        best = self.choose(job.spec.model, shape, room, job.spec.batch_size, _partner_micro(view, job.gpus, job, x))
        if best is None:
            return None
        plan, cpus, t = best
        cur_plan = x.plan or job.spec.plan
        cur_cpus = x.cpus_per_gpu or _asked_cpus(job)
        if cur_plan == str(plan) and cur_cpus == cpus:
            return None
        forced = cur_cpus > room
        if not forced:
            restart = self.perf.pause_time(job.spec.model) + self.perf.load_time(job.spec.model)
            if now - job.since < LEASE * restart:
                return None
            try:
                old = iteration_time(self.catalog.profile(job.spec.model), ExecutionPlan.parse(cur_plan),
                                     Resources(shape, float(cur_cpus)), self.perf.env) if cur_plan else t
            except (InvalidPlan, UnknownProfile):
                old = float("inf")
            left = max(0.0, job.spec.iterations - job.iterations_at(now))
            if left * (old - t) <= PAYBACK * restart:
                return None
        why = "its CPU share shrank (a partner came)" if forced else "saves more than it costs to restart"
        return Reconfigure(job.job_id, self._exec(job, plan, cpus, len(job.gpus)),
                           f"{self.name}: plan {plan}, {cpus} CPUs/GPU ({why})")

    # -- the choice ----------------------------------------------------------------------------------------

    def choose(self, model: str, shape: tuple[int, ...], room: int, batch: int = 0,
               micro: int | None = None) -> tuple[ExecutionPlan, int, float] | None:
        """(plan, CPUs per GPU, seconds per step): the fastest plan on `shape` with up to `room` CPUs per GPU,
        at the fewest CPUs within 1 % of its time; None if no plan fits. `micro`: only plans whose micro-batch
        (of a global `batch`) is that one."""
        key = (model, shape, room, batch if micro is not None else 0, micro)
        if key not in self._best:
            self._best[key] = self._search(model, shape, room, batch, micro)
        return self._best[key]

    def _search(self, model: str, shape: tuple[int, ...], room: int, batch: int,
                micro: int | None) -> tuple[ExecutionPlan, int, float] | None:
        prof = self.catalog.profile(model)
        gpus = sum(shape)
        best: tuple[ExecutionPlan, float] | None = None
        for p in candidate_plans(prof.spec, gpus):
            if micro is not None and max(1, batch // (p.dp * p.ga)) != micro:
                continue
            if fits(prof.spec, p, self.perf.env):
                t = iteration_time(prof, p, Resources(shape, float(room)), self.perf.env)
                if best is None or t < best[1]:
                    best = (p, t)
        if best is None:
            return None
        plan, t_best = best
        for c in range(MIN_CPUS_PER_GPU, room + 1):
            t = iteration_time(prof, plan, Resources(shape, float(c)), self.perf.env)
            if t <= t_best * WITHIN:
                return plan, c, t
        return plan, room, t_best

    def _exec(self, job: Job, plan: ExecutionPlan, cpus: int, gpus: int) -> ExecConfig:
        micro = max(1, job.spec.batch_size // (plan.dp * plan.ga))
        mem = host_memory_gb(self.catalog.profile(job.spec.model).spec, plan) + HOST_BASE_GB
        return ExecConfig(micro, plan.ga, plan=str(plan), gpus=gpus, cpus_per_gpu=cpus,
                          memory_gb_per_gpu=round(mem, 3))


def _shape(view: ClusterView, gpus) -> tuple[int, ...]:
    count: dict[str, int] = {}
    for g in gpus:
        node = view.node_of(g)
        count[node] = count.get(node, 0) + 1
    return tuple(sorted(count.values(), reverse=True))


def _cpu_room(view: ClusterView, gpus, joining: bool = False) -> int:
    """CPUs per GPU a job on `gpus` may use: each GPU's share of its node's CPUs, split among the jobs on it
    (`joining`: the job is not on them yet), the least over its GPUs, capped at CPU_CAP."""
    state = view.cluster_state()
    share = {n.name: n.cpus // max(n.size, 1) for n in view.nodes()}
    room = CPU_CAP
    for g in gpus:
        on = len(state.gpus[g].jobs) + (1 if joining else 0)
        room = min(room, share[view.node_of(g)] // max(on, 1))
    return max(room, MIN_CPUS_PER_GPU)


def _partner_micro(view: ClusterView, gpus, job: Job, x: ExecConfig | None) -> int | None:
    """The micro-batch a job beside a partner on `gpus` must keep (None: it has no partner there)."""
    state = view.cluster_state()
    if not any(other != job.job_id for g in gpus for other in state.gpus[g].jobs):
        return None
    return x.micro_batch if x is not None else ExecConfig.default_for(job.spec).micro_batch


def _asked_cpus(job: Job) -> int:
    return max(MIN_CPUS_PER_GPU, -(-job.spec.cpus // job.spec.gpus)) if job.spec.cpus else 4
