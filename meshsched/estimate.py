"""How long a job's step should take, as the engine estimates it (from the profiles, or a fallback): alone
where it runs, or alone on the best placement the live cluster offers (its ideal)."""

from __future__ import annotations

from typing import Protocol

from meshsched.perf import UnknownProfile
from meshsched.perf.placement import ideal_placement
from meshsched.state import ClusterState, ExecConfig, Job, JobSpec, placement_shape


class StepTimeEstimator(Protocol):
    def step_time(self, spec: JobSpec, gpu_type: str, placement: tuple[int, ...],
                  exec: ExecConfig | None = None) -> float:
        """Seconds per optimizer step of `spec` alone on `placement` (GPUs used on each node), at `exec`'s
        micro-batch and accumulation (default: its whole per-GPU batch in one step)."""
        ...


class ProfileEstimator:
    """Estimates from the fitted performance model; jobs of unprofiled models get `fallback` seconds/step.
    Answers are kept per (model, GPU type, placement, per-GPU batch, accumulation): the model is fixed once
    built, and every start and arrival asks."""

    def __init__(self, perf, fallback: float = 1.0) -> None:  # perf: meshsched.perf.PerfModel
        self._perf = perf
        self._fallback = fallback
        self._known: dict[tuple, float] = {}

    def step_time(self, spec: JobSpec, gpu_type: str, placement: tuple[int, ...],
                  exec: ExecConfig | None = None) -> float:
        if exec is not None and exec.plan is None and exec.accumulation > 1:  # (a plan: the plan model's)
            batch, accumulation = exec.micro_batch * exec.accumulation, exec.accumulation
        else:
            batch, accumulation = max(1, spec.batch_size // spec.gpus), 1
        key = (spec.model, gpu_type, placement, batch, accumulation)
        known = self._known.get(key)
        if known is None:
            try:
                if accumulation > 1:
                    known = self._perf.iteration_time(spec.model, gpu_type, placement, batch, accumulation)
                else:
                    known = self._perf.iteration_time(spec.model, gpu_type, placement, batch)
            except UnknownProfile:
                known = self._fallback
            self._known[key] = known
        return known


def ideal_step_time(estimator: StepTimeEstimator, state: ClusterState, spec: JobSpec) -> float:
    """`spec` alone on a compact placement of the fastest GPU type among the live nodes."""
    if not state.total_gpus:
        return estimator.step_time(spec, "", (spec.gpus,))
    placement = ideal_placement(spec.gpus, state.largest_node)
    types = state.gpu_types
    if len(types) == 1:  # (one GPU type: every arrival asks)
        return estimator.step_time(spec, types[0], placement)
    return min(estimator.step_time(spec, t, placement) for t in types)


def step_time_where(estimator: StepTimeEstimator, state: ClusterState, job: Job) -> float:
    """`job` alone where it runs (its GPUs' type, GPUs per node), at its micro-batch and accumulation."""
    gpus = state.gpus
    shape = placement_shape([gpus[g].node for g in job.gpus])
    return estimator.step_time(job.spec, gpus[job.gpus[0]].gpu_type, shape, job.exec)
