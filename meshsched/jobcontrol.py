"""Slurm's job control beside the engine's scheduling cycle: hold and release, dependencies, throttled arrays,
begin times, time limits and requeue.

A queued job job control keeps out of the policy's queue is `blocked`, with its Slurm pending reason; none of
this exists for jobs submitted without those options. The engine owns the queue: job control reaches it only
through `QueueHooks`, and the engine calls in at the points named below (a job started, released, ended).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from meshsched import events as ev
from meshsched.actions import Action, Preempt, SignalJob
from meshsched.policies.base import Trigger
from meshsched.state import ClusterState, DependencyKind, Job, JobSpec, JobState

HELD = "JobHeldUser"  # Slurm's pending reasons for jobs kept out of the queue
DEPENDENCY = "Dependency"
ARRAY_LIMIT = "JobArrayTaskLimit"
BEGIN = "BeginTime"
NEVER = "DependencyNeverSatisfied"
TIME_LIMIT = "TimeLimit"


@dataclass(frozen=True, slots=True)
class QueueHooks:
    """What job control may do to the engine: queue a job, take it out, begin its pause, log, ignore an event,
    and note a job it changed without a log line (Engine.take_changed)."""

    enqueue: Callable[[Job], None]
    dequeue: Callable[[Job], None]
    begin_pause: Callable[[Job, float], None]
    log: Callable[[float, str, Job | None, str], None]
    ignore: Callable[[float, ev.Event, Job | None], None]
    changed: Callable[[str], None]


def controlled(spec: JobSpec) -> bool:
    """Whether job control gates the job before it joins the queue."""
    return bool(spec.dependencies or spec.array_limit or spec.begin_time is not None)


class JobControl:
    def __init__(self, state: ClusterState, hooks: QueueHooks) -> None:
        self.state = state
        self.hooks = hooks
        self.blocked: dict[str, str] = {}  # job -> reason it is not in the queue (HELD, DEPENDENCY, ARRAY_LIMIT, BEGIN)
        self.dependents: dict[str, set[str]] = {}  # job -> jobs whose dependencies name it
        self.array_play: dict[str, set[str]] = {}  # throttled array -> its tasks queued or holding GPUs
        self.array_waiting: dict[str, deque[str]] = {}  # throttled array -> tasks waiting for a slot, in order
        self.ended: list[Job] = []  # jobs that ended in this event (their dependents and arrays are settled)
        self.limits: dict[str, float] = {}  # job holding GPUs -> when its run exceeds its time limit
        self.begins: dict[str, float] = {}  # job kept out until its begin time -> that time
        self.warnings: dict[str, float] = {}  # running job with a --signal not yet sent this run -> when it is due

    # ---------------------------------------------------------------- what the engine tells job control

    def started(self, job: Job, now: float) -> None:
        """`job` was given GPUs: arm its time limit."""
        if job.spec.time_limit is not None:
            job.time_limit_at = now + job.spec.time_limit
            self.limits[job.job_id] = job.time_limit_at
            self._arm_warning(job, now, late=True)

    def adopted(self, job: Job, time_limit_at: float | None, now: float) -> None:
        """`job` was found running after a restart: its limit as journaled, its array slot taken."""
        spec = job.spec
        if spec.time_limit is not None:
            job.time_limit_at = time_limit_at if time_limit_at is not None else now + spec.time_limit
            self.limits[spec.job_id] = job.time_limit_at
            self._arm_warning(job, now, late=time_limit_at is None)
        if spec.array_limit:
            self.array_play.setdefault(spec.array_id, set()).add(spec.job_id)

    def end(self, job: Job) -> None:
        """`job` reached a terminal state: `settle` admits what waited on it (nothing, unless a job depends on it or
        it is a task of a throttled array)."""
        spec = job.spec
        if spec.array_limit or spec.job_id in self.dependents:
            self.ended.append(job)

    def released(self, job: Job) -> None:
        """`job` let go of its GPUs: its time limit no longer runs."""
        if job.time_limit_at is not None:
            job.time_limit_at = None
            self.limits.pop(job.job_id, None)
        self.warnings.pop(job.job_id, None)

    def _arm_warning(self, job: Job, now: float, late: bool) -> None:
        """Arm the job's --signal for this run: signal_time seconds before its limit; when that time has passed, at
        once if `late` (a new run whose limit is that close), else not at all (a run adopted after meshd's restart
        may have had it before)."""
        spec = job.spec
        if spec.signal and job.time_limit_at is not None:
            at = job.time_limit_at - spec.signal_time
            if at >= now or late:
                self.warnings[job.job_id] = max(at, now)

    def next_due(self) -> float | None:
        """The first time limit, --signal warning or begin time to come, if any."""
        if not (self.limits or self.warnings or self.begins):
            return None  # (asked after every event)
        times = [min(t.values()) for t in (self.limits, self.warnings, self.begins) if t]
        return min(times) if times else None

    # ---------------------------------------------------------------- gating

    def gate(self, job: Job, now: float) -> str:
        """Why a queued job must stay out of the queue ("" when it may join it; NEVER when it never may)."""
        spec = job.spec
        waiting = False
        for d in spec.dependencies:
            if d.kind is DependencyKind.SINGLETON:
                waiting = waiting or bool(self.singleton_blockers(job))
                continue
            target = self.state.jobs.get(d.job_id)
            met = None if target is None else d.kind.met_by(target.state)
            if target is None or met is False:
                return NEVER
            waiting = waiting or met is None
        if job.held:
            return HELD
        if waiting:
            return DEPENDENCY
        if spec.begin_time is not None and spec.begin_time > now:
            return BEGIN
        if spec.array_limit and len(self.array_play.get(spec.array_id, ())) >= spec.array_limit:
            return ARRAY_LIMIT
        return ""

    def admit(self, job: Job, now: float, stimulus: str) -> bool:
        """Queue a queued-state job that is not in the queue, or keep it out with its reason; True if queued.
        A job whose dependency can never be met is cancelled (reason DependencyNeverSatisfied)."""
        spec = job.spec
        for d in spec.dependencies:
            for other in self.singleton_blockers(job) if d.kind is DependencyKind.SINGLETON else (d.job_id,):
                target = self.state.jobs.get(other)
                if target is not None and not target.state.is_terminal:
                    self.dependents.setdefault(other, set()).add(spec.job_id)
        why = self.gate(job, now)
        self.blocked.pop(spec.job_id, None)
        if why == NEVER:
            job.transition(JobState.CANCELLED, now)
            job.reason = NEVER
            job.acct.finish_time = now
            self.ended.append(job)
            self.hooks.log(now, stimulus, job, f"cancelled: {NEVER} ({_fmt_deps(spec, self.state.jobs)})")
        elif why:
            self.blocked[spec.job_id] = why
            job.reason = why
            if why == ARRAY_LIMIT:
                self.array_waiting.setdefault(spec.array_id, deque()).append(spec.job_id)
            elif why == BEGIN:
                self.begins[spec.job_id] = spec.begin_time
        else:
            job.reason = ""
            if spec.array_limit:
                self.array_play.setdefault(spec.array_id, set()).add(spec.job_id)
            self.hooks.enqueue(job)
        self.hooks.changed(spec.job_id)
        return not why

    def singleton_blockers(self, job: Job) -> list[str]:
        """The jobs a `singleton` dependency of `job` waits for: its user's unfinished jobs of the same name that
        hold GPUs, or are queued ahead of it (submitted before it)."""
        spec, out, ahead = job.spec, [], True
        for other in self.state.jobs.values():
            if other is job:
                ahead = False
            elif other.spec.user == spec.user and other.spec.name == spec.name and not other.state.is_terminal \
                    and (ahead or not other.state.is_queued):
                out.append(other.job_id)
        return out

    def settle(self, now: float, stimulus: str) -> bool:
        """Jobs ended in this event: admit what waited on them (dependents, the next tasks of a throttled
        array); returns True if any job joined the queue. Cancelling a job cascades to its dependents."""
        queued = False
        while self.ended:
            job = self.ended.pop()
            spec = job.spec
            for other in sorted(self.dependents.pop(spec.job_id, ())):
                why = self.blocked.get(other)
                if why == DEPENDENCY or (why is not None and self.gate(self.state.jobs[other], now) == NEVER):
                    queued |= self.admit(self.state.jobs[other], now, stimulus)
            if spec.array_limit:
                self.array_play.get(spec.array_id, set()).discard(spec.job_id)
                queued |= self._fill_array(spec.array_id, spec.array_limit, now, stimulus)
        return queued

    def _fill_array(self, array_id: str, limit: int, now: float, stimulus: str) -> bool:
        waiting = self.array_waiting.get(array_id)
        queued = False
        while waiting and len(self.array_play.get(array_id, ())) < limit:
            job_id = waiting.popleft()
            if self.blocked.get(job_id) == ARRAY_LIMIT:  # else it was cancelled or held meanwhile
                queued |= self.admit(self.state.jobs[job_id], now, stimulus)
        return queued

    # ---------------------------------------------------------------- times (the engine's timer)

    def begin_due(self, now: float, stimulus: str) -> bool:
        """Admit the jobs whose begin time came; True if any joined the queue."""
        queued = False
        for job_id in sorted(j for j, at in self.begins.items() if at <= now):
            del self.begins[job_id]
            if self.blocked.get(job_id) == BEGIN:  # else cancelled or held meanwhile
                queued |= self.admit(self.state.jobs[job_id], now, stimulus)
        return queued

    def expire_limits(self, now: float, stimulus: str, actions: list[Action]) -> bool:
        """Send the --signal warnings due (SignalJob, once per run), then stop every running job past its time
        limit: checkpoint and exit (Preempt); its pause ends it as TIMEOUT. Returns True if any was due (a warning
        is always due with a limit: `warnings` holds only jobs in `limits`)."""
        warned = sorted(j for j, at in self.warnings.items() if at <= now)
        for job_id in warned:
            job = self.state.jobs[job_id]
            del self.warnings[job_id]
            if job.state in (JobState.LOADING, JobState.RUNNING):  # a pausing job is being stopped already
                actions.append(SignalJob(job_id, job.spec.signal))
                self.hooks.log(now, stimulus, job, f"signal {job.spec.signal} to its ranks: "
                                                   f"{job.spec.signal_time:g}s before its time limit")
        due = sorted(j for j, at in self.limits.items() if at <= now)
        for job_id in due:
            job = self.state.jobs[job_id]
            del self.limits[job_id]
            self.warnings.pop(job_id, None)
            job.time_limit_at = None
            job.timing_out = True
            job.reason = TIME_LIMIT
            if job.state is not JobState.PAUSING:  # already pausing: its pause ends it all the same
                self.hooks.begin_pause(job, now)
                actions.append(Preempt(job_id))
            self.hooks.log(now, stimulus, job, f"time limit of {job.spec.time_limit:g}s reached: checkpoint and stop")
        return bool(due or warned)

    # ---------------------------------------------------------------- hold, release, requeue (the events)

    def on_hold(self, e: ev.HoldRequested, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or not job.state.is_queued or job.held:
            return self.hooks.ignore(now, e, job)
        job.held = True
        if e.job_id not in self.blocked:
            self.hooks.dequeue(job)
            if job.spec.array_limit:  # it gives its array slot to the next task
                self.array_play.get(job.spec.array_id, set()).discard(job.job_id)
                self._fill_array(job.spec.array_id, job.spec.array_limit, now, e.stimulus_id)
        self.blocked[e.job_id] = job.reason = HELD
        self.hooks.log(now, e.stimulus_id, job, "held")
        return None

    def on_release(self, e: ev.ReleaseRequested, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or not job.held:
            return self.hooks.ignore(now, e, job)
        job.held = False
        self.hooks.log(now, e.stimulus_id, job, "released")
        if job.state.is_terminal:
            return None
        return Trigger.RELEASE if self.admit(job, now, e.stimulus_id) else None

    def on_requeue(self, e: ev.RequeueRequested, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or job.state not in (JobState.LOADING, JobState.RUNNING):
            return self.hooks.ignore(now, e, job)
        self.hooks.begin_pause(job, now)
        job.reason = "requeued"
        actions.append(Preempt(job.job_id))
        self.hooks.log(now, e.stimulus_id, job, "requeue asked: checkpoint, then queued again")
        return None

    def on_forget(self, e: ev.JobsForgotten, now: float, actions: list[Action]) -> Trigger | None:
        """Retention: ended jobs leave the state. A queued job's dependency a forgotten job met is dropped (met
        once, met for good: a job's end is final); one it never will meet stays (unknown: never satisfied)."""
        gone = {j for j in e.job_ids if j in self.state.jobs and self.state.jobs[j].state.is_terminal}
        for job in self.state.jobs.values():
            deps = job.spec.dependencies
            if job.state.is_queued and any(d.job_id in gone for d in deps):
                job.spec = replace(job.spec, dependencies=tuple(
                    d for d in deps if d.job_id not in gone or not d.kind.met_by(self.state.jobs[d.job_id].state)))
                self.hooks.changed(job.job_id)
        for job_id in gone:
            del self.state.jobs[job_id]
            self.dependents.pop(job_id, None)
        self.state.touch()
        return None


def _fmt_deps(spec: JobSpec, jobs: dict) -> str:
    out = []
    for d in spec.dependencies:
        target = jobs.get(d.job_id)
        if d.kind is DependencyKind.SINGLETON:
            out.append(d.kind.value)
            continue
        out.append(f"{d.kind.value}:{d.job_id} ({target.state.value if target else 'unknown job'})")
    return ", ".join(out)
