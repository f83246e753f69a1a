"""What the engine asks the world (simulator or daemon) to do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Action:
    job_id: str


@dataclass(frozen=True, slots=True)
class Launch(Action):
    """Start (or restart) the job on these global GPU indices, resuming from `resume_from` iterations."""

    gpus: tuple[int, ...]
    resume_from: float
    restart: int


@dataclass(frozen=True, slots=True)
class Preempt(Action):
    """Checkpoint and exit; answer with JobPaused once the GPUs are free."""


@dataclass(frozen=True, slots=True)
class Kill(Action):
    """Stop the job now without a checkpoint (cancel); no answer expected."""


@dataclass(frozen=True, slots=True)
class ScheduleTimer:
    """Deliver Tick(key) at time `at`. A newer timer replaces every older one."""

    at: float
    key: int


@dataclass(frozen=True, slots=True)
class SetAccumulation(Action):
    """Train with per-GPU micro-batch `micro_batch` and `accumulation` steps per optimizer step (Castor
    Algorithm 2): the per-GPU batch per step, micro_batch * accumulation, and so the global batch, are unchanged."""

    micro_batch: int
    accumulation: int
