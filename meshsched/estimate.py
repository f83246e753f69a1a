"""How long a job's step should take, as the engine estimates it (from the profiles, or a fallback)."""

from __future__ import annotations

from typing import Protocol

from meshsched.state import ExecConfig, JobSpec


class StepTimeEstimator(Protocol):
    def step_time(self, spec: JobSpec, gpu_type: str, placement: tuple[int, ...],
                  exec: ExecConfig | None = None) -> float:
        """Seconds per optimizer step of `spec` alone on `placement` (GPUs used on each node), at `exec`'s
        micro-batch and accumulation (default: its whole per-GPU batch in one step)."""
        ...


class ProfileEstimator:
    """Estimates from the fitted performance model; jobs of unprofiled models get `fallback` seconds/step."""

    def __init__(self, perf, fallback: float = 1.0) -> None:  # perf: meshsched.perf.PerfModel
        self._perf = perf
        self._fallback = fallback

    def step_time(self, spec: JobSpec, gpu_type: str, placement: tuple[int, ...],
                  exec: ExecConfig | None = None) -> float:
        from meshsched.perf import UnknownProfile

        try:
            if exec is not None and exec.plan is None and exec.accumulation > 1:  # (a plan: the plan model's)
                return self._perf.iteration_time(spec.model, gpu_type, placement,
                                                 exec.micro_batch * exec.accumulation, exec.accumulation)
            return self._perf.iteration_time(spec.model, gpu_type, placement, max(1, spec.batch_size // spec.gpus))
        except UnknownProfile:
            return self._fallback
