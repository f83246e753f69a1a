"""Trace durations replayed exactly (`SimRules.trace_durations`, part of the `lucid` rules).

A trace row's duration d becomes `iterations = round(d / step)` at the reference GPU's step (trace_synth), so
a job trains iterations x step, not d, and SJF ranks it by iterations x step: two jobs of the same d rank by
their rounding, and a step of several seconds moves the end by seconds. Lucid's simulator runs each job for
exactly d (`end_time = start_time + duration`) and its sjf sorts the queue by d, stably (ties in arrival
order, jobs of one second in trace order). Under `trace_durations` the replay does the same:

- a job of a whole-second duration d is replayed as d iterations of 1 s, wherever it runs (any placement,
  any ExecConfig; only a GPU partner's interference still slows it): it trains exactly d, and SJF's key,
  iterations x ideal step, is exactly d (a float d / n times n is not d for about one pair in ten), so equal
  durations tie and the wait queue keeps them in arrival order (policy key, then arrival sequence);
- a job of another duration keeps its iterations at a fixed step of d / iterations;
- a duration of zero or less keeps the job as it is (Lucid never ends such a job).

The durations are the trace's (`simulate(..., durations=trace.durations)`); without them each job's is
recovered as its iterations x its step on the reference GPU (the cluster's first group, a compact placement),
taken to the nearest time step: exact whenever that step is under one time step, since the rounding to whole
iterations is then under half a time step (each of the first 5,000 jobs of the Philly trace on V100s).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from meshsched.perf.placement import ideal_placement
from meshsched.state import ExecConfig, JobSpec


class FixedStepEstimator:
    """The engine's step-time estimator with the fixed steps of trace-timed jobs (others: `inner`'s answer)."""

    def __init__(self, inner, steps: dict[str, float]) -> None:  # inner: meshsched.estimate.StepTimeEstimator
        self._inner = inner
        self._steps = steps

    def step_time(self, spec: JobSpec, gpu_type: str, placement: tuple[int, ...],
                  exec: ExecConfig | None = None) -> float:
        fixed = self._steps.get(spec.job_id)
        return fixed if fixed is not None else self._inner.step_time(spec, gpu_type, placement, exec)


def trace_timed(jobs: Sequence[JobSpec], durations: Sequence[float] | None, rules, estimator,
                cluster) -> tuple[Sequence[JobSpec], dict[str, float]]:
    """The jobs to replay and each trace-timed job's fixed seconds per step (see the module doc); `jobs` as they
    are and no fixed step unless `rules.trace_durations`. `estimator` answers the reference step when
    `durations` is None; `cluster` is the replay's ClusterSpec."""
    if not rules.trace_durations:
        return jobs, {}
    if durations is not None and len(durations) != len(jobs):
        raise ValueError(f"durations: {len(durations)} given for {len(jobs)} jobs")
    out: list[JobSpec] = []
    steps: dict[str, float] = {}
    for i, spec in enumerate(jobs):
        if durations is not None:
            d = float(durations[i])
        else:
            ref = estimator.step_time(spec, cluster.gpu_type, ideal_placement(spec.gpus, cluster.gpus_per_node))
            d = rules.step_of(spec.iterations * ref)
        if not (d > 0 and math.isfinite(d)):
            out.append(spec)
            continue
        if d == int(d):
            spec = replace(spec, iterations=int(d))
        steps[spec.job_id] = d / spec.iterations
        out.append(spec)
    return out, steps
