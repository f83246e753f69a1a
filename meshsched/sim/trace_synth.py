"""Turns trace rows into `JobSpec`s: a model and batch drawn as Castor, Gimbal and Lazer do, iterations from
the trace's duration through the perf model, and a deadline drawn as in Gimbal's evaluation.

Every random choice comes from one seeded `random.Random`, drawn per job in trace order (model if the row
gives none, per-GPU batch if the row gives no batch, deadline factor if the trace carries no deadlines), so
the same seed gives the same jobs. Perf-model answers are cached per (model, GPU count, per-GPU batch).
"""

from __future__ import annotations

import math
import random

from meshsched.perf import PerfModel, UnknownProfile, ideal_placement
from meshsched.sim.trace_formats import TraceError, TraceRow
from meshsched.state import JobSpec

DEADLINE_FACTOR = (1.5, 2.5)  # deadline = submit + lambda x duration, lambda uniform here (Gimbal, sec. 6)


class JobSynthesizer:
    """Builds one `JobSpec` per trace row for one GPU type and node size; holds the caches and the RNG."""

    def __init__(self, perf: PerfModel, gpu_type: str, gpus_per_node: int, seed: int, label: str) -> None:
        self._perf = perf
        self._gpu_type = gpu_type
        self._gpus_per_node = gpus_per_node
        self._rng = random.Random(seed)
        self._label = label
        self._models: dict[int, tuple[str, ...]] = {}
        self._batches: dict[str, tuple[int, ...]] = {}
        self._step: dict[tuple[str, int, int], float] = {}
        try:
            perf.models(gpu_type)
        except UnknownProfile as exc:
            raise TraceError(f"{label}: {exc}") from None

    def job(self, row: TraceRow, submit: float, draw_deadline: bool) -> tuple[JobSpec, float]:
        """The job for `row` submitted at `submit`, and its duration (the trace's, or the perf model's)."""
        rng = self._rng
        gpus = row.gpus
        model = row.model if row.model is not None else rng.choice(self._candidates(row))
        if row.batch_size is None:
            per_gpu = rng.choice(self._profiled(row, model))
        else:
            per_gpu, rest = divmod(row.batch_size, gpus)
            if rest or not per_gpu:
                raise self._fail(row, f"column 'batch_size': {row.batch_size} is not a multiple of gpus={gpus}")
            self._profiled(row, model)  # checks the model name
        step = self._step_time(row, model, per_gpu)
        if row.duration is not None:
            duration = row.duration
            iterations = max(1, round(duration / step))
        else:
            assert row.iterations is not None  # the parser gives one of the two
            iterations = row.iterations
            duration = iterations * step
        if row.deadline is not None:
            deadline: float | None = submit + row.deadline
        elif draw_deadline:
            # A zero-duration job still runs one iteration: its deadline is drawn on that iteration's time.
            deadline = submit + rng.uniform(*DEADLINE_FACTOR) * (duration if duration > 0 else iterations * step)
        else:
            deadline = None
        spec = JobSpec(
            job_id=row.job_id, gpus=gpus, model=model, batch_size=per_gpu * gpus, iterations=iterations,
            submit_time=submit, name=row.name, user=row.user, tenant=row.tenant, deadline=deadline,
            guaranteed=row.guaranteed,
        )
        return spec, duration

    def _fail(self, row: TraceRow, what: str) -> TraceError:
        return TraceError(f"{self._label}:{row.line}: {what}")

    def _candidates(self, row: TraceRow) -> tuple[str, ...]:
        """Model families usable at the row's GPU count (for any count > 1, the perf model answers with the
        families that have a fitted multi-GPU profile, so every GPU count gets a model)."""
        gpus = row.gpus
        found = self._models.get(gpus)
        if found is None:
            try:
                found = tuple(self._perf.models(self._gpu_type, gpus))
            except UnknownProfile as exc:
                raise self._fail(row, f"no model for {gpus} GPUs of type {self._gpu_type!r}: {exc}") from None
            if not found:
                raise self._fail(row, f"the perf model has no model for {gpus} GPUs of type {self._gpu_type!r}")
            self._models[gpus] = found
        return found

    def _profiled(self, row: TraceRow, model: str) -> tuple[int, ...]:
        found = self._batches.get(model)
        if found is None:
            try:
                found = tuple(self._perf.profiled_batches(model, self._gpu_type))
            except UnknownProfile as exc:
                raise self._fail(row, f"column 'model': {model!r} on {self._gpu_type!r}: {exc}") from None
            if not found:
                raise self._fail(row, f"column 'model': {model!r} has no profiled batch on {self._gpu_type!r}")
            self._batches[model] = found
        return found

    def _step_time(self, row: TraceRow, model: str, per_gpu: int) -> float:
        key = (model, row.gpus, per_gpu)
        step = self._step.get(key)
        if step is None:
            placement = ideal_placement(row.gpus, self._gpus_per_node)
            try:
                step = float(self._perf.iteration_time(model, self._gpu_type, placement, per_gpu))
            except UnknownProfile as exc:
                raise self._fail(
                    row, f"model {model!r} with per-GPU batch {per_gpu} on {row.gpus} GPUs: {exc}"
                ) from None
            if not math.isfinite(step) or step <= 0:
                raise self._fail(row, f"perf model gave iteration time {step} for {model!r} on {row.gpus} GPUs")
            self._step[key] = step
        return step
