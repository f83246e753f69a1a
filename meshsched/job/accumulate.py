"""Gradient accumulation (Castor) and unequal local batches (Gimbal) without changing the gradient.

A rank's local batch is cut into `accum_steps` micro-batches. Each micro-batch's mean loss is multiplied by
`weight = len(micro) * world_size / global_batch` before backward: DDP averages the ranks' gradients (a
division by world_size), so the step's gradient is exactly (1/global_batch) * sum of per-sample gradients,
the gradient of the mean loss over the global batch -- whatever the split across ranks and micro-batches.
Only the last micro-batch synchronises (`sync`); the others run under `ddp.no_sync()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsched.job.sampler import even_split


@dataclass(frozen=True, slots=True)
class MicroBatch:
    indices: list[int]
    weight: float  # multiply the micro-batch's mean loss by this before backward
    sync: bool  # True on the last micro-batch of the step: let DDP all-reduce


def micro_batches(indices: list[int], accum_steps: int, world_size: int, global_batch: int) -> list[MicroBatch]:
    """Cut one rank's step into at most `accum_steps` non-empty micro-batches with their loss weights."""
    parts = [n for n in even_split(len(indices), max(1, accum_steps)) if n > 0]
    out, start = [], 0
    for k, n in enumerate(parts):
        out.append(MicroBatch(indices[start : start + n], n * world_size / global_batch, k == len(parts) - 1))
        start += n
    return out
