"""Workloads for execution-plan schedulers (Rubick, Sec. 7.3): trace rows turned into jobs of the plan-profile
models, each with an asked plan, CPUs, tenant and iteration count. Pure and seeded (reading a trace file for it:
`meshsched.loaders.traces.load_plan_trace`).

As the paper builds its trace: the busiest 12 hours of the trace (by GPU-seconds asked), down-sampled (here:
to `jobs` jobs, seeded); each job gets a model drawn uniformly from the plan profiles; a GPU count no plan
of that model can use becomes the nearest one that can (the next larger, else the largest smaller), its
duration scaled to keep the GPU-hours; its asked plan is drawn from the plans that fit at that count (without
TP/PP for ViT, RoBERTa, BERT and T5: "mostly unnecessary for these relatively small models"), and its
duration becomes iterations at that plan's modelled speed on a compact placement. Multi-tenant (the paper's
MT trace): each job goes to tenant A (guaranteed) or B (best-effort) at random. Asked CPUs: 4 per GPU (what
the Morphling measurements ran with); durations are capped at `max_hours` to keep replays short.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from meshsched.perf.placement import ideal_placement
from meshsched.perf.plans import PlanPerfModel, Resources, candidate_plans, fits, iteration_time
from meshsched.sim.trace_formats import TraceRow
from meshsched.state import JobSpec

SMALL_MODELS = frozenset({"vit", "roberta", "bert", "t5"})  # no TP/PP in their asked plans (the paper's rule)
ASKED_CPUS_PER_GPU = 4
WINDOW_S = 12 * 3600.0


@dataclass(frozen=True, slots=True)
class WorkloadOptions:
    jobs: int = 120  # down-sampled to this many jobs
    max_gpus: int = 64  # GPU counts above this (the cluster) are cut to it
    gpus_per_node: int = 8
    seed: int = 0
    guaranteed_share: float = 0.5  # share of jobs in tenant A (guaranteed); the rest in B (best-effort)
    max_hours: float = 6.0  # cap on a job's trace duration


def busiest_window(rows: Sequence[TraceRow], max_s: float, span_s: float = WINDOW_S) -> list[TraceRow]:
    """The rows arriving in the `span_s` window with the most GPU-seconds asked, durations capped at `max_s`
    as the jobs will be (a window starts at an arrival)."""
    rows = sorted(rows, key=lambda r: r.submit)
    best, best_i, best_j, j, total = -1.0, 0, 0, 0, 0.0
    weight = [r.gpus * min(r.duration or 0.0, max_s) for r in rows]
    for i, r in enumerate(rows):
        while j < len(rows) and rows[j].submit < r.submit + span_s:
            total += weight[j]
            j += 1
        if total > best:
            best, best_i, best_j = total, i, j
        total -= weight[i]
    return rows[best_i:best_j]


def plan_workload(rows: Sequence[TraceRow], perf: PlanPerfModel, opts: WorkloadOptions) -> list[JobSpec]:
    """Jobs for the rows' busiest 12 hours (see the module doc), sorted by arrival, first at 0."""
    rng = random.Random(opts.seed)
    window = busiest_window(rows, opts.max_hours * 3600.0)
    picked = sorted(rng.sample(window, min(opts.jobs, len(window))), key=lambda r: (r.submit, r.line))
    if not picked:
        return []
    t0 = picked[0].submit
    models = sorted(perf.catalog.profiles)
    jobs: list[JobSpec] = []
    for n, row in enumerate(picked):
        model = rng.choice(models)
        spec = perf.profile(model).spec
        gpus = feasible_gpus(perf, model, min(row.gpus, opts.max_gpus), opts)
        duration = min(row.duration or 0.0, opts.max_hours * 3600.0) * row.gpus / gpus
        plan = rng.choice(asked_plans(perf, model, gpus))
        step = iteration_time(perf.profile(model), plan, Resources(ideal_placement(gpus, opts.gpus_per_node),
                                                                     float(ASKED_CPUS_PER_GPU)), perf.env)
        guaranteed = rng.random() < opts.guaranteed_share
        jobs.append(JobSpec(
            job_id=f"rubick-{n:04d}", gpus=gpus, model=model, batch_size=spec.global_batch,
            iterations=max(1, round(duration / step)), submit_time=row.submit - t0, tenant="A" if guaranteed else "B",
            guaranteed=guaranteed, plan=str(plan), cpus=ASKED_CPUS_PER_GPU * gpus,
        ))  # fmt: skip
    return jobs


def asked_plans(perf: PlanPerfModel, model: str, gpus: int) -> list:
    """The plans a job of `model` on `gpus` GPUs may ask for: those that fit, no TP/PP for the small models."""
    spec = perf.profile(model).spec
    return [p for p in candidate_plans(spec, gpus) if fits(spec, p, perf.env)
            and not (model in SMALL_MODELS and (p.tp > 1 or p.pp > 1))]


def feasible_gpus(perf: PlanPerfModel, model: str, gpus: int, opts: WorkloadOptions) -> int:
    """`gpus` if a plan of `model` fits there, else the next larger count that has one, else the largest smaller."""
    spec = perf.profile(model).spec

    def ok(g: int) -> bool:
        return any(fits(spec, p, perf.env) and not (model in SMALL_MODELS and (p.tp > 1 or p.pp > 1))
                   for p in candidate_plans(spec, g))

    for g in range(gpus, opts.max_gpus + 1):
        if ok(g):
            return g
    for g in range(gpus - 1, 0, -1):
        if ok(g):
            return g
    raise ValueError(f"no plan of {model} fits on up to {opts.max_gpus} GPUs")

