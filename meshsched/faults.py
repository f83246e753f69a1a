"""A shared GPU is one fault domain: the engine's handling of `GpuFault`.

Under MPS a fatal fault in one client, or the GPU's MPS server dying, ends every client on that GPU. The job
that faulted (the event's culprit, when one is known) fails as any failing job does; every other job on the GPU
did nothing wrong: it is requeued from its checkpoint without being charged, i.e. not FAILED, its restart count
back to what it was before the run the fault cut short (the relaunch is that run again), no preemption or
futile time counted, a time limit armed afresh at its next start. The jobs that were on the GPU together are
never paired again (`Job.avoid`, which every sharing placement layer asks through `SharingScheduler.foreign`),
while each may share with anyone else. Each job's log line says what happened (`mesh show` / `mesh explain`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshsched import events as ev
from meshsched.actions import Action
from meshsched.policies.base import Trigger
from meshsched.state import ClusterState, Job, JobState


@dataclass(frozen=True, slots=True)
class FaultHooks:
    """What the fault handling may do to the engine: release a job's GPUs, requeue it from its checkpoint, fail
    one as a JobFailed does, and log."""

    release: Callable[[Job, float], None]
    requeue: Callable[[Job, float, str, str], None]
    fail: Callable[[ev.Event, float, list[Action]], Trigger | None]
    log: Callable[[float, str, Job | None, str], None]


def describe(e: ev.GpuFault) -> str:
    """What happened to the GPU, in a few words."""
    if e.culprit is not None:
        return f"partner job {e.culprit} faulted GPU {e.gpu}"
    return e.reason or f"MPS server of GPU {e.gpu} died"


class FaultDomains:
    def __init__(self, state: ClusterState, hooks: FaultHooks) -> None:
        self.state = state
        self.hooks = hooks

    def on_fault(self, e: ev.GpuFault, now: float, actions: list[Action]) -> Trigger | None:
        state, hooks = self.state, self.hooks
        if not 0 <= e.gpu < len(state.gpus):
            hooks.log(now, e.stimulus_id, None, f"ignored GpuFault of unknown GPU {e.gpu}")
            return None
        on_gpu = [state.jobs[j] for j in state.gpus[e.gpu].jobs]
        if not on_gpu:
            hooks.log(now, e.stimulus_id, None, f"GPU {e.gpu} faulted with no job on it")
            return None
        ids = frozenset(j.job_id for j in on_gpu)
        for job in on_gpu:  # the pair is never formed again (the culprit's too: it may be requeued one day)
            job.avoid = job.avoid | (ids - {job.job_id})
        freed = False
        what = describe(e)
        for job in on_gpu:
            if job.job_id == e.culprit:
                reason = e.reason or f"faulted GPU {e.gpu}"
                freed |= hooks.fail(ev.JobFailed(e.stimulus_id, job.job_id, reason), now, actions) is not None
            else:
                self._requeue_uncharged(job, now, e.stimulus_id, what)
                freed = True
        if e.culprit is not None and e.culprit not in ids:
            hooks.log(now, e.stimulus_id, None, f"GPU {e.gpu} faulted; culprit {e.culprit} was not on it")
        return Trigger.RELEASE if freed else None

    def _requeue_uncharged(self, job: Job, now: float, stimulus: str, what: str) -> None:
        """The job lost its run through no fault of its own: queued again as if that run had not happened."""
        cut_short = job.state is not JobState.PAUSING  # a pausing job's relaunch was due (a preemption's)
        self.hooks.release(job, now)
        if cut_short:
            job.restarts = max(0, job.restarts - 1)  # its relaunch is the run the fault cut short
        job.timing_out = False
        self.hooks.requeue(job, now, stimulus, f"requeued uncharged: {what}")
        job.reason = f"requeued uncharged: {what}"
