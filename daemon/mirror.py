"""A job record and the engine's Job kept in step by one rule: the spec a record makes (`job_spec`) and the engine's
view of a job copied into its record (`mirror`), driven by the declared field mapping `MIRRORED`."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from meshsched.daemon.journal import JobRecord
from meshsched.state import Dependency, DependencyKind, Job, JobSpec, JobState

KEEP = object()  # a converter's answer: the record keeps what it has

# record field -> how it is read off the engine's Job (KEEP: leave the record's value)
MIRRORED: dict[str, Callable[[Job], Any]] = {
    "state": lambda job: job.state.value,
    "reason": lambda job: job.reason,
    "assigned": lambda job: list(job.gpus) if job.gpus else KEEP,  # kept after the job lets go: where it last ran
    "restarts": lambda job: job.restarts,
    "done_iterations": lambda job: job.done_iterations,
    "checkpoint_iterations": lambda job: job.checkpoint_iterations,
    "step_time": lambda job: job.step_time,
    "exec": lambda job: KEEP if job.exec is None else job.exec.to_dict(),
    "held": lambda job: job.held,
    "time_limit_at": lambda job: job.time_limit_at,
    "dependency": lambda job: [[d.kind.value, d.job_id] for d in job.spec.dependencies],  # retention drops met ones
    "reported": lambda job: KEEP if job.reported is None else list(job.reported),  # kept across meshd's restarts
}


def mirror(rec: JobRecord, job: Job, now: float) -> str:
    """Copy the engine's view of `job` into `rec` (MIRRORED, then the times it started and ended, the time it held
    GPUs, and the end of a preemption once it lets go of its GPUs); returns the record's state before."""
    old = rec.state
    for name, read in MIRRORED.items():
        value = read(job)
        if value is not KEEP:
            setattr(rec, name, value)
    if job.state is JobState.LOADING and rec.start_time is None:
        rec.start_time = now
    if job.state.is_terminal and rec.end_time is None:
        rec.end_time = ended_at(rec, now)
    held(rec, job.state.holds_gpus, now)
    if not job.state.holds_gpus:  # a re-adopted PAUSING job is RUNNING to the engine: keep the flag
        rec.pausing = False
    return old


def job_spec(rec: JobRecord) -> JobSpec:
    """The engine's JobSpec of a job record (validated by JobSpec), its job-control fields included."""
    return JobSpec(
        job_id=rec.job_id, gpus=rec.gpus, model=rec.model, batch_size=rec.batch_size, iterations=rec.iterations,
        submit_time=rec.submit_time, name=rec.name, user=rec.user, deadline=rec.deadline, guaranteed=rec.guaranteed,
        plan=rec.plan, cpus=rec.cpus, memory_gb=rec.memory_gb, tenant=rec.tenant,
        dependencies=tuple(Dependency(DependencyKind(k), j) for k, j in rec.dependency), time_limit=rec.time_limit,
        array_id=rec.array_id, array_limit=rec.array_limit, begin_time=rec.begin_time, **warning(rec.signal),
    )


def warning(text: str) -> dict[str, Any]:
    """The JobSpec fields of a record's --signal (none when it has none)."""
    if not text:
        return {}
    from meshsched.wire.jobsignal import parse_job_signal

    sig = parse_job_signal(text)
    return {"signal": sig.signum, "signal_time": float(sig.seconds)}


def held(rec: JobRecord, holds: bool, now: float) -> None:
    """Count the time `rec` holds GPUs (Slurm's TIME: not while queued, held or preempted): a run's time is added to
    `ran` once it lets go, at the recorded end of the job when it ended (maybe while meshd was down)."""
    if holds and rec.held_since is None:
        rec.held_since = now
    elif not holds and rec.held_since is not None:
        end = rec.end_time if rec.end_time is not None else now
        rec.ran += max(0.0, end - rec.held_since)
        rec.held_since = None


def ended_at(rec: JobRecord, now: float) -> float:
    """When the job ended: its supervisor's result.json was written then (meshd may learn of it much later, after a
    restart); `now` when there is none of its current run."""
    if rec.held_since is None or not rec.job_dir:  # it ended queued (cancelled, failed to start): when meshd ended it
        return now
    try:
        written = os.stat(os.path.join(rec.job_dir, "result.json")).st_mtime
    except OSError:
        return now
    return written if rec.held_since <= written <= now else now
