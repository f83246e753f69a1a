"""How long a job's step should take, as the engine estimates it (from the profiles, or a fallback)."""

from __future__ import annotations

from typing import Protocol

from meshsched.state import JobSpec


class StepTimeEstimator(Protocol):
    def step_time(self, spec: JobSpec, gpu_type: str, placement: tuple[int, ...]) -> float:
        """Seconds per optimizer step of `spec` alone on `placement` (GPUs used on each node)."""
        ...


class ProfileEstimator:
    """Estimates from the fitted performance model; jobs of unprofiled models get `fallback` seconds/step."""

    def __init__(self, perf, fallback: float = 1.0) -> None:  # perf: meshsched.perf.PerfModel
        self._perf = perf
        self._fallback = fallback

    def step_time(self, spec: JobSpec, gpu_type: str, placement: tuple[int, ...]) -> float:
        from meshsched.perf import UnknownProfile

        try:
            return self._perf.iteration_time(spec.model, gpu_type, placement, max(1, spec.batch_size // spec.gpus))
        except UnknownProfile:
            return self._fallback
