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

    memo = True  # skip what cannot change (`_any_held`, `_quiet`); False: every pass walks and weighs every job

    def __init__(self, perf: PlanPerfModel, name: str = "rubick", models=None) -> None:
        self.name = name
        self.perf = perf
        self.catalog = perf.catalog
        # the models it plans (default: the catalog's; beside data-parallel profiles, those with a name of their own)
        self.models = frozenset(perf.catalog.profiles if models is None else models)
        self._best: dict[tuple, tuple[ExecutionPlan, int, float] | None] = {}
        # The jobs of planned models holding GPUs (a superset: `_any_held`), as of the state's `version`: a pass
        # with none of them holding skips the walk over every holding job. Kept from the state's change log.
        self._held: set[str] = set()
        self._seen: tuple[object, int] | None = None  # (the state, its version) `_held` is as of
        # Per job, why `_replan_one` last answered None and for which inputs (`_quiet`): asked again with the same
        # inputs, the answer is the same (see `_still_quiet`).
        self._quiet: dict[str, tuple] = {}

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
        if self.memo and not self._any_held(view):
            return decisions
        models, running = self.models, JobState.RUNNING
        for job in view.holding():
            if job.state is not running or job.exec_pending is not None or job.spec.model not in models:
                continue
            d = self._replan_one(view, job, now)
            if d is not None:
                decisions.append(d)
        return decisions

    def _any_held(self, view: ClusterView) -> bool:
        """Whether a job of a planned model may hold GPUs: the jobs the state's change log names since the last
        pass are re-read (a start or a release touches its job); the whole holding set when the log cannot tell."""
        state = view.cluster_state()
        seen, models = self._seen, self.models
        changed = state.changed_since(seen[1]) if seen is not None and seen[0] is state else None
        if changed is None:
            self._held = held = {j.job_id for j in view.holding() if j.spec.model in models}
            self._quiet = {k: v for k, v in self._quiet.items() if k in held}
        else:
            jobs, held, quiet = state.jobs, self._held, self._quiet
            for job_id in changed:
                j = jobs.get(job_id)
                if j is not None and j.state.holds_gpus and j.spec.model in models:
                    held.add(job_id)
                else:
                    held.discard(job_id)
                    quiet.pop(job_id, None)
        self._seen = (state, state.version)
        return bool(self._held)

    def _replan_one(self, view: ClusterView, job: Job, now: float) -> Reconfigure | None:
        room = _cpu_room(view, job.gpus)
        shape = _shape(view, job.gpus)
        x = job.exec or ExecConfig.default_for(job.spec)
        micro = _partner_micro(view, job.gpus, job, x)
        inputs = (shape, room, micro, x, job.since)
        quiet = self._quiet.get(job.job_id)
        if self.memo and quiet is not None and quiet[0] == inputs and _still_quiet(quiet, job, now):
            return None
        best = self.choose(job.spec.model, shape, room, job.spec.batch_size, micro)
        if best is None:
            self._quiet[job.job_id] = (inputs, None, None)
            return None
        plan, cpus, t = best
        cur_plan = x.plan or job.spec.plan
        cur_cpus = x.cpus_per_gpu or _asked_cpus(job)
        if cur_plan == str(plan) and cur_cpus == cpus:
            self._quiet[job.job_id] = (inputs, None, None)
            return None
        forced = cur_cpus > room
        if not forced:
            restart = self.perf.pause_time(job.spec.model) + self.perf.load_time(job.spec.model)
            if now - job.since < LEASE * restart:
                self._quiet[job.job_id] = (inputs, LEASE * restart, None)
                return None
            try:
                old = iteration_time(self.catalog.profile(job.spec.model), ExecutionPlan.parse(cur_plan),
                                     Resources(shape, float(cur_cpus)), self.perf.env) if cur_plan else t
            except (InvalidPlan, UnknownProfile):
                old = float("inf")
            left = max(0.0, job.spec.iterations - job.iterations_at(now))
            if left * (old - t) <= PAYBACK * restart:
                self._quiet[job.job_id] = (inputs, None, _progress(job))
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


def _progress(job: Job) -> tuple:
    """What a running job's `iterations_at(now)` follows (it never falls as `now` grows while these stand)."""
    return job.done_iterations, job.progress_time, job.step_time, job.spec.iterations, job.state


def _still_quiet(quiet: tuple, job: Job, now: float) -> bool:
    """Whether `_replan_one`'s None, recorded as `quiet` = (inputs, lease, progress) for the same inputs (GPUs'
    node shape, CPU room, partner micro-batch, exec, running since), holds at `now`: a plan already the best or none
    fitting holds for ever; a lease while it lasts; a restart that did not pay back while the job's progress figures
    stand (its remaining work only shrinks as `now` grows, so the saving only shrinks)."""
    _, lease, progress = quiet
    if progress is not None:
        return progress == _progress(job)
    return lease is None or now - job.since < lease


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
    nodes, on_gpus = state.nodes, state.gpus
    room = CPU_CAP
    for g in gpus:
        gpu = on_gpus[g]
        node = nodes[gpu.node]
        if not node.alive:
            raise KeyError(gpu.node)  # (only live nodes have a share)
        on = len(gpu.jobs) + (1 if joining else 0)
        room = min(room, node.cpus // max(node.size, 1) // max(on, 1))
    return max(room, MIN_CPUS_PER_GPU)


def _partner_micro(view: ClusterView, gpus, job: Job, x: ExecConfig | None) -> int | None:
    """The micro-batch a job beside a partner on `gpus` must keep (None: it has no partner there)."""
    state = view.cluster_state()
    if not any(other != job.job_id for g in gpus for other in state.gpus[g].jobs):
        return None
    return x.micro_batch if x is not None else ExecConfig.default_for(job.spec).micro_batch


def _asked_cpus(job: Job) -> int:
    return max(MIN_CPUS_PER_GPU, -(-job.spec.cpus // job.spec.gpus)) if job.spec.cpus else 4
