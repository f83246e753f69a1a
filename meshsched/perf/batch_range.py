"""Whether a job's per-GPU batch lies inside the batches its profile was measured at (issue 26, point 7).

Outside them the iteration model extrapolates (bert at 48 per GPU where the T4 profile stops at 12): the
prediction may be far off, so `mesh simulate` and `mesh submit` say so in one line. Pure: the caller passes the
model it has (a `PerfModel`, or anything with `profiled_batches(model, gpu_type)`).
"""

from __future__ import annotations

from meshsched.perf.errors import UnknownProfile


def batch_outside_profile(perf, model: str, gpu_type: str, per_gpu_batch: int) -> str | None:
    """One line if `per_gpu_batch` is outside the batches `model` was profiled at on `gpu_type`, else None
    (None too for a model or GPU type without a profile: nothing to compare with)."""
    try:
        batches = perf.profiled_batches(model, gpu_type)
    except (UnknownProfile, AttributeError):
        return None
    if not batches or min(batches) <= per_gpu_batch <= max(batches):
        return None
    return (f"{model} at {per_gpu_batch} per GPU is outside its {gpu_type} profile's measured batches "
            f"({min(batches)}-{max(batches)}): its speed there is extrapolated")


def batch_warnings(perf, jobs, gpu_type: str) -> list[str]:
    """`batch_outside_profile` for each job's even per-GPU batch (global batch // GPUs), once per model: the
    first job of each model outside its profile's range, with how many jobs of it are."""
    first: dict[str, str] = {}
    count: dict[str, int] = {}
    for spec in jobs:
        line = batch_outside_profile(perf, spec.model, gpu_type, max(1, spec.batch_size // spec.gpus))
        if line is not None:
            first.setdefault(spec.model, line)
            count[spec.model] = count.get(spec.model, 0) + 1
    return [f"{first[m]} ({count[m]} job(s))" for m in first]
