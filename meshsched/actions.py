"""What the engine asks the world (simulator or daemon) to do; `meshsched.executor` says who carries it out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshsched.state import ExecConfig


@dataclass(frozen=True, slots=True)
class Action:
    job_id: str


@dataclass(frozen=True, slots=True)
class Launch(Action):
    """Start (or restart) the job on these global GPU indices, resuming from `resume_from` iterations,
    training as `exec` says (micro-batch, accumulation, MPS limits, plan)."""

    gpus: tuple[int, ...]
    resume_from: float
    restart: int
    exec: ExecConfig


@dataclass(frozen=True, slots=True)
class Preempt(Action):
    """Checkpoint and exit; answer with JobPaused once the GPUs are free."""


@dataclass(frozen=True, slots=True)
class Kill(Action):
    """Stop the job now without a checkpoint (cancel); no answer expected."""


@dataclass(frozen=True, slots=True)
class Reconfigure(Action):
    """Make the running job train as `exec` says. `restart`: by checkpoint and restart on the same GPUs (MPS
    limits or plan changed); otherwise at a step boundary through the SDK (micro-batch, accumulation).
    Answer with ReconfigureApplied once it took effect."""

    exec: ExecConfig
    restart: bool


@dataclass(frozen=True, slots=True)
class SignalJob(Action):
    """Send `signal` to the running job's ranks now (`--signal`: its warning before the time limit); no answer
    expected. The simulated world has no processes to signal: it ignores it."""

    signal: int


@dataclass(frozen=True, slots=True)
class ScheduleTimer:
    """Deliver Tick(key) at time `at`. A newer timer replaces every older one."""

    at: float
    key: int


@dataclass(frozen=True, slots=True)
class FitModel:
    """Run `fit(request)` away from the scheduling loop (seconds of CPU: Lazer's GP fit) and answer with
    ModelFitted(result). `fit` is a module-level function: meshd runs it in another process; the simulator
    runs it at once and answers at the same simulated time, so replays stay deterministic."""

    fit: Callable[[Any], Any]
    request: Any
