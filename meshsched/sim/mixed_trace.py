"""A workload for all four layers: Philly-shaped arrivals where a share of the jobs are of the execution-plan
profiles (the plan layer's jobs) and the rest keep their data-parallel models (placement, preemption and
calibration work on both).

How it is built, from a replayable trace's jobs (seeded, pure): each job, with probability `share`, becomes a
job of a plan-profile model drawn uniformly from the catalog (those whose name no data-parallel profile has:
not bert, a T4 profile too), keeping its arrival, user and deadline; its GPU
count becomes the nearest one a plan of that model can use (meshsched.sim.rubick_trace.feasible_gpus), its
trace duration (iterations at its data-parallel model's speed on a compact placement) is kept in GPU-hours,
its asked plan is drawn from the plans that fit (no TP/PP for the small models, as in Rubick's workload), its
asked CPUs are 4 per GPU, and its iterations are that duration at the asked plan's modelled speed. A job no
plan of the drawn model fits (more GPUs than the cap) stays as it was. Replay it with a
`meshsched.perf.mixed.MixedPerfModel`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from meshsched.perf.mixed import MixedPerfModel
from meshsched.perf.placement import ideal_placement
from meshsched.perf.plans import Resources, iteration_time
from meshsched.sim.rubick_trace import ASKED_CPUS_PER_GPU, WorkloadOptions, asked_plans, feasible_gpus
from meshsched.state import JobSpec


def with_plan_jobs(jobs: Sequence[JobSpec], perf: MixedPerfModel, share: float, gpu_type: str,
                   gpus_per_node: int, max_gpus: int, seed: int = 0) -> list[JobSpec]:
    """`jobs` with about `share` of them turned into plan-profile jobs (see the module doc), in the same order."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"the share of plan-profile jobs must be in [0, 1], got {share:g}")
    rng = random.Random(seed)
    models = list(perf.planned_models)
    if not models and share:
        raise ValueError("no execution-plan profile has a name of its own beside the data-parallel profiles")
    opts = WorkloadOptions(max_gpus=max(1, max_gpus), gpus_per_node=gpus_per_node)
    out: list[JobSpec] = []
    for spec in jobs:
        if rng.random() >= share:
            out.append(spec)
            continue
        model = rng.choice(models)
        try:
            gpus = feasible_gpus(perf.plans, model, min(spec.gpus, opts.max_gpus), opts)
        except ValueError:
            out.append(spec)
            continue
        step = perf.base.iteration_time(spec.model, gpu_type, ideal_placement(spec.gpus, gpus_per_node),
                                        max(1, spec.batch_size // spec.gpus))
        duration = spec.iterations * step * spec.gpus / gpus
        plan = rng.choice(asked_plans(perf.plans, model, gpus))
        prof = perf.plans.profile(model)
        t = iteration_time(prof, plan, Resources(ideal_placement(gpus, gpus_per_node), float(ASKED_CPUS_PER_GPU)),
                           perf.env)
        out.append(replace(spec, model=model, gpus=gpus, batch_size=prof.spec.global_batch,
                           iterations=max(1, round(duration / t)), plan=str(plan), cpus=ASKED_CPUS_PER_GPU * gpus))
    return out
