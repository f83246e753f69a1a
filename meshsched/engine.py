"""The engine: the only code that changes the cluster state. `handle(event, now) -> actions`.

One small handler per event type; after each event the policy gets one scheduling pass and every
decision is recorded, with its stimulus and reason, in a bounded log (what `mesh explain` prints).
Nothing here reads a clock or does I/O: `now` is passed in.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from meshsched import events as ev
from meshsched.actions import Action, FitModel, Kill, Launch, Preempt, Reconfigure, ScheduleTimer
from meshsched.estimate import StepTimeEstimator
from meshsched.perf.placement import ideal_placement
from meshsched.policies import base as pb
from meshsched.policies.base import ClusterView, Defer, Evict, Remember, RequestFit, Start, Trigger, Wait
from meshsched.policies.stack import PolicyStack
from meshsched.state import ClusterState, ExecConfig, Job, JobSpec, JobState

HELD = "JobHeldUser"  # Slurm's pending reasons for jobs kept out of the queue
DEPENDENCY = "Dependency"
ARRAY_LIMIT = "JobArrayTaskLimit"
BEGIN = "BeginTime"
NEVER = "DependencyNeverSatisfied"
TIME_LIMIT = "TimeLimit"


@dataclass(frozen=True, slots=True)
class LogEntry:
    time: float
    stimulus_id: str
    job_id: str
    message: str


class Engine:
    def __init__(
        self,
        policy: PolicyStack,
        estimator: StepTimeEstimator,
        state: ClusterState | None = None,
        *,
        log_size: int = 100_000,
    ) -> None:
        self.policy = policy
        self.estimator = estimator
        self.state = state or ClusterState()
        self.log: deque[LogEntry] = deque(maxlen=log_size)
        self._queue: list[tuple[tuple, int, str]] = []  # sorted by (policy key, arrival seq)
        self._needs: list[int] = []  # GPUs asked for, in `_queue` order (a policy sums a prefix: ClusterView)
        self._qkey: dict[str, tuple[tuple, int]] = {}
        self._queued_gpus: Counter[int] = Counter()
        self._active: dict[str, Job] = {}  # jobs holding GPUs
        self._seq = 0
        self._timer_at: float | None = None
        self._timer_key = 0
        self._deferred: dict[str, float] = {}  # queued job -> until when a preemption layer deferred it
        self._recalibrate: dict[str, None] = {}  # jobs whose packing set changed in this event (calibration layer)
        self.memory: object | None = None  # the preemption layer's memory (a frozen value, `Remember`)
        self.model: object | None = None  # the latest model a RequestFit produced (ModelFitted); derived, not durable
        # job control (Slurm's hold, dependencies, array throttle, time limits): queued jobs kept out of the
        # policy's queue, with why; none of it exists for jobs submitted without those options
        self._blocked: dict[str, str] = {}  # job -> reason it is not in `_queue` (HELD, DEPENDENCY, ARRAY_LIMIT)
        self._dependents: dict[str, set[str]] = {}  # job -> jobs whose dependencies name it
        self._array_play: dict[str, set[str]] = {}  # throttled array -> its tasks queued or holding GPUs
        self._array_waiting: dict[str, deque[str]] = {}  # throttled array -> tasks waiting for a slot, in order
        self._ended: list[Job] = []  # jobs that ended in this event (their dependents and arrays are settled)
        self._limits: dict[str, float] = {}  # job holding GPUs -> when its run exceeds its time limit
        self._begins: dict[str, float] = {}  # job kept out until its begin time -> that time
        self._policy_at: float | None = None  # when the policy's own timer is due
        self.settled: list[str] = []  # jobs job control moved in the last `handle` besides the event's own
        self._handlers: dict[type, Callable[[ev.Event, float, list[Action]], Trigger | None]] = {
            ev.JobSubmitted: self._on_submitted,
            ev.JobStarted: self._on_started,
            ev.IterationReport: self._on_report,
            ev.JobPaused: self._on_paused,
            ev.JobFinished: self._on_finished,
            ev.JobFailed: self._on_failed,
            ev.CancelRequested: self._on_cancel,
            ev.NodeJoined: self._on_node_joined,
            ev.NodeLost: self._on_node_lost,
            ev.Tick: self._on_tick,
            ev.JobRestored: self._on_restored,
            ev.JobAdopted: self._on_adopted,
            ev.CheckpointSaved: self._on_checkpoint,
            ev.RecoveryDone: self._on_recovery_done,
            ev.ReconfigureApplied: self._on_reconfigured,
            ev.RankReport: self._on_rank_report,
            ev.TotalDeclared: self._on_total_declared,
            ev.ModelFitted: self._on_model_fitted,
            ev.HoldRequested: self._on_hold,
            ev.ReleaseRequested: self._on_release,
            ev.RequeueRequested: self._on_requeue,
        }

    # ---------------------------------------------------------------- entry point

    def handle(self, event: ev.Event, now: float) -> list[Action]:
        actions: list[Action] = []
        if type(event) is not ev.JobSubmitted:
            # the event's job may have moved or reported progress (None: anything may have changed)
            self.state.touch(getattr(event, "job_id", None))
        if self.settled:
            self.settled = []
        trigger = self._handlers[type(event)](event, now, actions)
        if self._ended and self._settle(now, event.stimulus_id, actions) and trigger is None:
            trigger = Trigger.RELEASE  # jobs whose dependencies were met joined the queue
        if trigger is not None:
            job_id = event.spec.job_id if type(event) is ev.JobSubmitted else None
            self._schedule(trigger, now, event.stimulus_id, actions, job_id)
        if self._recalibrate:
            self._calibrate_sharers(now, event.stimulus_id, actions)
        self._arm_timer(now, actions, passed=trigger is not None)
        return actions

    # ---------------------------------------------------------------- queries

    def view(self, arrived: str | None = None) -> ClusterView:
        return ClusterView(self.state, self._queue, self._active, self._queued_gpus, arrived, self.memory, self.model,
                           self._needs, self._qkey)

    def queued(self) -> Iterator[Job]:
        return self.view().queue()

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    def pending_reason(self, job_id: str) -> str:
        """Slurm-style reason a queued job is not running: Unschedulable, Resources, Priority, or the policy's."""
        job = self.state.jobs[job_id]
        if not job.state.is_queued:
            return ""
        if job_id in self._blocked:
            return self._blocked[job_id]
        if job.spec.gpus > self.state.total_gpus:
            return f"Unschedulable (needs {job.spec.gpus} GPUs, cluster has {self.state.total_gpus})"
        if job.reason:
            return job.reason
        pos = bisect.bisect_left(self._queue, self._qkey[job_id])
        ahead = any(self.state.jobs[j].spec.gpus <= self.state.total_gpus
                    for _, _, j in itertools.islice(self._queue, pos))  # no copy of the queue's head per job
        return "Priority" if ahead else "Resources"

    def explain(self, job_id: str) -> list[LogEntry]:
        return [e for e in self.log if e.job_id == job_id]

    # ---------------------------------------------------------------- handlers

    def _on_submitted(self, e: ev.JobSubmitted, now: float, actions: list[Action]) -> Trigger | None:
        spec = e.spec
        if spec.job_id in self.state.jobs:
            raise ValueError(f"job {spec.job_id} already exists")
        job = Job(spec, ideal_step_time=self._ideal_step_time(spec), since=now, progress_time=now)
        self.state.jobs[spec.job_id] = job
        refused = self.admission_error(spec)
        if refused is not None:  # it could never run: fail it now rather than queue it for ever
            job.transition(JobState.FAILED, now)
            job.reason = f"refused: {refused}"
            job.acct.finish_time = now
            self._log(now, e.stimulus_id, job, job.reason)
            return None
        self._log(now, e.stimulus_id, job, f"submitted: {spec.gpus} GPU(s), model {spec.model}")
        if e.held or _controlled(spec):
            job.held = e.held
            return Trigger.ARRIVAL if self._admit(job, now, e.stimulus_id) else None
        self._enqueue(job)
        return Trigger.ARRIVAL

    def admission_error(self, spec) -> str | None:
        """Why a job could never run here (one line), or None: more CPUs or host memory per node than any live
        node has, or what the policy stack refuses (an infeasible plan, a guarantee over the tenant's quota)."""
        nodes = [n for n in self.state.nodes.values() if n.alive]
        for what, asked, have in (("CPUs", spec.cpus, lambda n: n.cpus), ("GB of memory", spec.memory_gb,
                                                                          lambda n: n.host_memory_gb)):
            if asked is None or not nodes:
                continue
            per_gpu = asked / spec.gpus
            if not any(per_gpu * min(spec.gpus, n.size) <= have(n) + 1e-9 for n in nodes):
                most = max(have(n) for n in nodes)
                return (f"asks for {asked:g} {what} over {spec.gpus} GPU(s) ({per_gpu:g} per GPU); no node has "
                        f"that many for its share (the most a node has is {most:g})")
        return self.policy.admission_error(self.view(), spec)

    def _on_started(self, e: ev.JobStarted, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or job.state is not JobState.LOADING:
            return self._ignore(now, e, job)
        job.transition(JobState.RUNNING, now)
        job.progress_time = now
        job.step_time = self._estimate(job)
        self._log(now, e.stimulus_id, job, "loaded; training")
        self._partners_retimed(job, now, stopped=False)
        if self.policy.calibration is not None and any(len(self.state.gpus[g].jobs) > 1 for g in job.gpus):
            self._recalibrate[job.job_id] = None  # it now trains next to a partner
        return None

    def _on_report(self, e: ev.IterationReport, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or job.state is not JobState.RUNNING:
            return None
        job.done_iterations = min(float(job.spec.iterations), max(job.done_iterations, e.iterations))
        job.progress_time = now
        if e.step_time > 0 and now - e.measured_for >= job.rate_since:  # else measured partly before a
            job.step_time = e.step_time  # partner came or went (`_partners_retimed`): not its rate now
        self._calibrate(job, now, e.stimulus_id, actions)
        return None

    def _on_rank_report(self, e: ev.RankReport, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or job.state is not JobState.RUNNING:
            return None
        job.rank_step_times = tuple(e.step_times)
        self._calibrate(job, now, e.stimulus_id, actions)
        return None

    def _on_reconfigured(self, e: ev.ReconfigureApplied, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or not job.state.holds_gpus:
            return self._ignore(now, e, job)
        job.exec = e.exec
        if job.exec_pending == e.exec:
            job.exec_pending = None
        self._log(now, e.stimulus_id, job, f"now trains as {_fmt_exec(e.exec)}")
        return None

    def _calibrate(self, job: Job, now: float, stimulus: str, actions: list[Action]) -> None:
        if self.policy.calibration is None:
            return
        for d in self.policy.calibrate(self.view(), job, now):
            self._reconfigure(d, now, stimulus, actions)

    def _calibrate_sharers(self, now: float, stimulus: str, actions: list[Action]) -> None:
        """Give the calibration layer a call for jobs whose packing set changed (a sharer started training next
        to them, or a partner left), without waiting for the job's next progress report."""
        todo, self._recalibrate = self._recalibrate, {}
        for job_id in todo:
            job = self.state.jobs[job_id]
            if job.state is JobState.RUNNING:
                self._calibrate(job, now, stimulus, actions)

    def _reconfigure(self, d: pb.Reconfigure, now: float, stimulus: str, actions: list[Action]) -> None:
        job = self.state.jobs[d.job_id]
        if not job.state.holds_gpus or job.state is JobState.PAUSING:
            raise ValueError(f"policy reconfigured {job.job_id} which is {job.state.value}")
        if d.memo is not None:
            job.calibration = d.memo
        current = job.exec_pending or job.exec or ExecConfig.default_for(job.spec)
        if d.exec == current:
            return
        if d.exec.per_gpu_batch != current.per_gpu_batch and d.exec.plan == current.plan:
            raise ValueError(f"policy reconfigured {job.job_id} to {_fmt_exec(d.exec)}: the per-GPU batch per step "
                             f"would change from {current.per_gpu_batch} (the global batch is fixed)")
        job.exec_pending = d.exec
        actions.append(Reconfigure(job.job_id, d.exec, current.needs_restart(d.exec)))
        self._log(now, stimulus, job, f"reconfigure to {_fmt_exec(d.exec)}: {d.reason}")

    def _on_paused(self, e: ev.JobPaused, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or not job.state.holds_gpus:
            return self._ignore(now, e, job)
        done = min(float(job.spec.iterations), e.iterations)
        job.done_iterations = job.checkpoint_iterations = done
        job.progress_time = now
        self._release(job, now)
        if done >= job.spec.iterations:
            self._complete(job, now, e.stimulus_id, "finished while pausing")
        elif job.timing_out:
            job.transition(JobState.TIMEOUT, now)
            job.reason = TIME_LIMIT
            job.acct.finish_time = now
            self._ended.append(job)
            self._log(now, e.stimulus_id, job, f"time limit reached; stopped at {done:.0f}/{job.spec.iterations}")
        else:
            job.transition(JobState.PREEMPTED, now)
            self._enqueue(job)
            self._log(now, e.stimulus_id, job, f"checkpointed at {done:.0f}/{job.spec.iterations}; requeued")
        return Trigger.RELEASE

    def _on_finished(self, e: ev.JobFinished, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or not job.state.holds_gpus:
            return self._ignore(now, e, job)
        job.done_iterations = job.checkpoint_iterations = float(job.spec.iterations)
        self._release(job, now)
        self._complete(job, now, e.stimulus_id, "completed")
        return Trigger.RELEASE

    def _on_failed(self, e: ev.JobFailed, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or job.state.is_terminal or (e.requeue and job.state.is_queued):
            return self._ignore(now, e, job)  # requeue of a job already queued (e.g. by NodeLost): nothing to do
        held = job.state.holds_gpus
        if held:
            self._release(job, now)
        if e.requeue and held:
            self._requeue_from_checkpoint(job, now, e.stimulus_id, f"requeued, not charged: {e.reason}")
        else:
            if job.state.is_queued:
                self._dequeue(job)
            job.transition(JobState.FAILED, now)
            job.reason = e.reason
            job.acct.finish_time = now
            self._ended.append(job)
            self._log(now, e.stimulus_id, job, f"failed: {e.reason}")
        return Trigger.RELEASE if held else None

    def _on_cancel(self, e: ev.CancelRequested, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or job.state.is_terminal:
            return self._ignore(now, e, job)
        held = job.state.holds_gpus
        if held:
            actions.append(Kill(job.job_id))
            self._release(job, now)
        else:
            self._dequeue(job)
        job.transition(JobState.CANCELLED, now)
        job.reason = "cancelled"
        job.acct.finish_time = now
        self._ended.append(job)
        self._log(now, e.stimulus_id, job, "cancelled")
        return Trigger.RELEASE if held else None

    def _on_node_joined(self, e: ev.NodeJoined, now: float, actions: list[Action]) -> Trigger | None:
        self.state.add_node(e.node)
        self._log(now, e.stimulus_id, None, f"node {e.node.name} joined: {e.node.gpus} x {e.node.gpu_type}")
        return Trigger.RELEASE

    def _on_node_lost(self, e: ev.NodeLost, now: float, actions: list[Action]) -> Trigger | None:
        node = self.state.nodes.get(e.node)
        if node is None or not node.alive:
            return None
        lost = set(node.gpus)
        victims = [j for j in self._active.values() if lost.intersection(j.gpus)]
        for job in victims:
            actions.append(Kill(job.job_id))  # its workers on other nodes must stop too
            self._release(job, now)
            self._requeue_from_checkpoint(job, now, e.stimulus_id, f"node {e.node} lost")
        self.state.mark_lost(e.node)
        self._log(now, e.stimulus_id, None, f"node {e.node} lost; {len(victims)} job(s) requeued")
        return Trigger.RELEASE

    def _on_tick(self, e: ev.Tick, now: float, actions: list[Action]) -> Trigger | None:
        if e.key != self._timer_key or self._timer_at is None:
            self._log(now, e.stimulus_id, None, f"ignored Tick {e.key} (superseded timer)")
            return None
        self._timer_at = None
        expired = bool(self._limits) and self._expire_limits(now, e.stimulus_id, actions)
        begun = bool(self._begins) and self._begin_due(now, e.stimulus_id)
        if (expired or begun) and not self._policy_due(now):
            # only job control's times were due: jobs whose begin time came get a pass; the pauses of jobs
            # past their time limit free their GPUs and start one when they land
            return Trigger.RELEASE if begun else None
        return Trigger.TICK

    # ---------------------------------------------------------------- scheduling

    def _schedule(
        self, trigger: Trigger, now: float, stimulus: str, actions: list[Action], stimulus_job: str | None = None
    ) -> None:
        jobs = self.state.jobs
        arrived = stimulus_job if trigger is Trigger.ARRIVAL else None
        for d in self.policy.schedule(self.view(arrived), now, trigger):
            kind = type(d)
            if kind is Remember:
                self.memory = d.memory
                continue
            if kind is RequestFit:
                actions.append(FitModel(d.fit, d.request))
                continue
            job = jobs[d.job_id]
            if self._blocked and d.job_id in self._blocked:  # a policy that found it by its state (a Lazer
                self._log(now, stimulus, job, f"ignored {kind.__name__}: {self._blocked[d.job_id]}")  # deferral)
                continue
            if isinstance(d, Start):
                if not job.state.is_queued:
                    raise ValueError(f"policy started {job.job_id} which is {job.state.value}")
                self._dequeue(job)
                job.transition(JobState.LOADING, now)
                self.state.assign(job.job_id, d.gpus)
                job.gpus = d.gpus
                job.reason = ""
                job.exec = d.exec or ExecConfig.default_for(job.spec)
                job.exec_pending = None
                self._active[job.job_id] = job
                if job.spec.time_limit is not None:
                    job.time_limit_at = now + job.spec.time_limit
                    self._limits[job.job_id] = job.time_limit_at
                if job.acct.first_start is None:
                    job.acct.first_start = now
                actions.append(Launch(job.job_id, d.gpus, job.checkpoint_iterations, job.restarts, job.exec))
                job.restarts += 1
                self._log(now, stimulus, job, f"start on GPUs {_fmt_gpus(d.gpus)}: {d.reason}")
            elif isinstance(d, Evict):
                if job.state not in (JobState.RUNNING, JobState.LOADING):
                    raise ValueError(f"policy evicted {job.job_id} which is {job.state.value}")
                if job.state is JobState.LOADING:
                    job.acct.futile_time += now - job.since
                    job.acct.futile_preemptions += 1
                self._begin_pause(job, now)
                self.state.touch(job.job_id)
                job.acct.preemptions += 1
                actions.append(Preempt(job.job_id))
                self._log(now, stimulus, job, d.reason)
            elif isinstance(d, Wait):
                job.reason = d.reason
            elif isinstance(d, Defer):
                if not job.state.is_queued:
                    raise ValueError(f"policy deferred {job.job_id} which is {job.state.value}")
                if not d.until > now:
                    raise ValueError(f"policy deferred {job.job_id} to {d.until}, not after now ({now})")
                job.deferred_until = d.until
                job.reason = d.reason
                self._deferred[job.job_id] = d.until
                self._log(now, stimulus, job, f"deferred {d.until - now:.1f}s: {d.reason}")
            elif isinstance(d, pb.Reconfigure):
                self._reconfigure(d, now, stimulus, actions)
            else:
                raise TypeError(f"policy returned {d!r}, which is no decision")

    def _arm_timer(self, now: float, actions: list[Action], passed: bool) -> None:
        at = self._policy_at = self.policy.next_timer(self.view(), now)
        for times in (self._limits, self._begins):
            if times:
                first = min(times.values())
                at = first if at is None else min(at, first)
        if self._deferred:
            if passed:  # a deferral that ran out was seen by the pass that just ran; else its pass is still due
                for job_id in [j for j, t in self._deferred.items() if t <= now]:
                    del self._deferred[job_id]
            if self._deferred:
                first = min(self._deferred.values())
                at = first if at is None else min(at, first)
        if at is None:
            self._timer_at = None
            return
        at = max(at, now)
        if at != self._timer_at:
            self._timer_key += 1
            self._timer_at = at
            actions.append(ScheduleTimer(at, self._timer_key))

    # ---------------------------------------------------------------- helpers

    def _enqueue(self, job: Job) -> None:
        self._seq += 1
        key = (self.policy.queue_key(job), self._seq)
        self._qkey[job.job_id] = key
        entry = (key[0], key[1], job.job_id)
        i = bisect.bisect_right(self._queue, entry)
        self._queue.insert(i, entry)
        self._needs.insert(i, job.spec.gpus)
        self._queued_gpus[job.spec.gpus] += 1

    def _dequeue(self, job: Job) -> None:
        if self._blocked and self._blocked.pop(job.job_id, None) is not None:
            return  # it was kept out of the queue
        if job.deferred_until is not None:
            job.deferred_until = None
            self._deferred.pop(job.job_id, None)
        key, seq = self._qkey.pop(job.job_id)
        i = bisect.bisect_left(self._queue, (key, seq))
        del self._queue[i]
        del self._needs[i]
        n = self._queued_gpus[job.spec.gpus] - 1
        if n:
            self._queued_gpus[job.spec.gpus] = n
        else:
            del self._queued_gpus[job.spec.gpus]

    def _begin_pause(self, job: Job, now: float) -> None:
        """Stop counting `job`'s progress and move it to PAUSING (the caller sends the Preempt)."""
        job.done_iterations = job.iterations_at(now)
        job.progress_time = now
        if job.state is JobState.RUNNING:
            self._partners_retimed(job, now, stopped=True)
        job.transition(JobState.PAUSING, now)

    def _partners_retimed(self, job: Job, now: float, stopped: bool) -> None:
        """`job` starts or stops training on its GPUs: the rate of each job training next to it changes now.
        A partner's progress is banked at its old rate, and a report measured partly before now loses its step
        time (`_on_report`); a partner left alone on all its GPUs has the engine's estimate alone until then.
        (The simulator's world reports the new rate at once; a real job only after a step at it.)"""
        gpus, jobs, me = self.state.gpus, self.state.jobs, job.job_id
        seen: set[str] = set()
        for g in job.gpus:
            for other in gpus[g].jobs:
                if other == me or other in seen:
                    continue
                seen.add(other)
                p = jobs[other]
                if p.state is not JobState.RUNNING:
                    continue
                p.done_iterations = p.iterations_at(now)
                p.progress_time = p.rate_since = now
                self.state.touch(other)
                alone = all(set(gpus[h].jobs) <= {me, other} for h in p.gpus)
                if stopped and alone and (p.exec is None or p.exec.plan is None):
                    p.step_time = self._estimate(p)

    def _estimate(self, job: Job) -> float:
        """The estimator's step time of `job` alone where it runs, at its micro-batch and accumulation."""
        return self.estimator.step_time(job.spec, self._gpu_type(job), self._shape(job.gpus), job.exec)

    def _release(self, job: Job, now: float) -> None:
        if job.state is JobState.RUNNING:  # (a PAUSING job stopped training when it began to pause)
            self._partners_retimed(job, now, stopped=True)
        if self.policy.calibration is not None:
            for g in job.gpus:  # its partners lose it: their packing set changed
                for other in self.state.gpus[g].jobs:
                    if other != job.job_id:
                        self._recalibrate[other] = None
        self.state.release(job.job_id, job.gpus)
        job.gpus = ()
        self._active.pop(job.job_id, None)
        if job.time_limit_at is not None:
            job.time_limit_at = None
            self._limits.pop(job.job_id, None)

    def _complete(self, job: Job, now: float, stimulus: str, message: str) -> None:
        if job.state is JobState.LOADING:  # its JobStarted was lost or overtaken: it did start
            job.transition(JobState.RUNNING, now)
        job.transition(JobState.COMPLETED, now)
        job.acct.finish_time = now
        job.reason = ""
        self._ended.append(job)
        self._log(now, stimulus, job, message)

    def _requeue_from_checkpoint(self, job: Job, now: float, stimulus: str, why: str) -> None:
        job.done_iterations = job.checkpoint_iterations
        job.progress_time = now
        job.transition(JobState.PREEMPTED, now)
        self._enqueue(job)
        self._log(now, stimulus, job, f"{why}; resumes from iteration {job.checkpoint_iterations:.0f}")

    def _ignore(self, now: float, e: ev.Event, job: Job | None) -> None:
        state = job.state.value if job else "unknown"
        self._log(now, e.stimulus_id, job, f"ignored {type(e).__name__} (job is {state})")
        return None

    def _log(self, now: float, stimulus: str, job: Job | None, message: str) -> None:
        self.log.append(LogEntry(now, stimulus, job.job_id if job else "", message))

    def _gpu_type(self, job: Job) -> str:
        return self.state.gpus[job.gpus[0]].gpu_type

    def _shape(self, gpus: tuple[int, ...]) -> tuple[int, ...]:
        per_node = Counter(self.state.gpus[g].node for g in gpus)
        return tuple(sorted(per_node.values(), reverse=True))

    def _ideal_step_time(self, spec) -> float:
        """Alone on a compact placement of the fastest GPU type among the live nodes."""
        state = self.state
        if not state.total_gpus:
            return self.estimator.step_time(spec, "", (spec.gpus,))
        placement = ideal_placement(spec.gpus, state.largest_node)
        return min(self.estimator.step_time(spec, t, placement) for t in state.gpu_types)


    # ---------------------------------------------------------------- daemon recovery and checkpoints

    def _on_restored(self, e: ev.JobRestored, now: float, actions: list[Action]) -> Trigger | None:
        spec = e.spec
        if spec.job_id in self.state.jobs:
            raise ValueError(f"job {spec.job_id} already exists")
        ckpt = min(float(spec.iterations), max(0.0, e.checkpoint_iterations))
        state = JobState.PREEMPTED if e.preempted else JobState.PENDING
        job = Job(spec, ideal_step_time=self._ideal_step_time(spec), state=state, since=now, progress_time=now,
                  done_iterations=ckpt, checkpoint_iterations=ckpt, restarts=e.restarts)
        self.state.jobs[spec.job_id] = job
        if e.held or _controlled(spec):
            job.held = e.held
            self._admit(job, now, e.stimulus_id)
        else:
            self._enqueue(job)
        self._log(now, e.stimulus_id, job, f"restored {state.value}; resumes from iteration {ckpt:.0f}")
        return None

    def _on_adopted(self, e: ev.JobAdopted, now: float, actions: list[Action]) -> Trigger | None:
        spec = e.spec
        if spec.job_id in self.state.jobs:
            raise ValueError(f"job {spec.job_id} already exists")
        ckpt = min(float(spec.iterations), max(0.0, e.checkpoint_iterations))
        done = min(float(spec.iterations), max(ckpt, e.done_iterations))
        job = Job(spec, ideal_step_time=self._ideal_step_time(spec), state=JobState.RUNNING, since=now,
                  progress_time=now, done_iterations=done, checkpoint_iterations=ckpt, restarts=e.restarts)
        self.state.assign(spec.job_id, e.gpus)
        job.gpus = e.gpus
        job.exec = e.exec or ExecConfig.default_for(spec)
        job.acct.first_start = now
        job.step_time = self._estimate(job)
        self.state.jobs[spec.job_id] = job
        self._active[spec.job_id] = job
        if spec.time_limit is not None:
            job.time_limit_at = e.time_limit_at if e.time_limit_at is not None else now + spec.time_limit
            self._limits[spec.job_id] = job.time_limit_at
        if spec.array_limit:
            self._array_play.setdefault(spec.array_id, set()).add(spec.job_id)
        self._log(now, e.stimulus_id, job, f"re-adopted running on GPUs {_fmt_gpus(e.gpus)}")
        return None

    def _on_checkpoint(self, e: ev.CheckpointSaved, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or not job.state.holds_gpus:
            return self._ignore(now, e, job)
        ckpt = min(float(job.spec.iterations), max(job.checkpoint_iterations, e.iterations))
        job.checkpoint_iterations = ckpt
        if job.done_iterations < ckpt:
            job.done_iterations = ckpt
            job.progress_time = now
        return None

    def _on_total_declared(self, e: ev.TotalDeclared, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or job.state.is_terminal or e.iterations < 1:
            return self._ignore(now, e, job)
        queued = job.state.is_queued and job.job_id not in self._blocked
        if queued:  # its queue key may depend on the length
            self._dequeue(job)
        job.spec = replace(job.spec, iterations=e.iterations)
        job.checkpoint_iterations = min(job.checkpoint_iterations, float(e.iterations))
        job.done_iterations = min(job.done_iterations, float(e.iterations))
        if queued:
            self._enqueue(job)
        self._log(now, e.stimulus_id, job, f"the script declared {e.iterations} iterations in total")
        if (self.policy.calibration is not None and job.state is JobState.RUNNING
                and any(len(self.state.gpus[g].jobs) > 1 for g in job.gpus)):
            self._recalibrate[job.job_id] = None  # its set was calibrated for another length
        return None

    def _on_model_fitted(self, e: ev.ModelFitted, now: float, actions: list[Action]) -> Trigger | None:
        self.model = e.model
        self._log(now, e.stimulus_id, None, f"model fitted ({type(e.model).__name__})")
        return None

    def _on_recovery_done(self, e: ev.RecoveryDone, now: float, actions: list[Action]) -> Trigger | None:
        self._log(now, e.stimulus_id, None, f"recovered {len(self.state.jobs)} job(s)")
        return Trigger.RELEASE

    # ---------------------------------------------------------------- job control (hold, dependencies, arrays, limits)

    def _gate(self, job: Job, now: float) -> str:
        """Why a queued job must stay out of the queue ("" when it may join it; NEVER when it never may)."""
        spec = job.spec
        waiting = False
        for d in spec.dependencies:
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
        if spec.array_limit and len(self._array_play.get(spec.array_id, ())) >= spec.array_limit:
            return ARRAY_LIMIT
        return ""

    def _admit(self, job: Job, now: float, stimulus: str) -> bool:
        """Queue a queued-state job that is not in the queue, or keep it out with its reason; True if queued.
        A job whose dependency can never be met is cancelled (reason DependencyNeverSatisfied)."""
        spec = job.spec
        for d in spec.dependencies:
            target = self.state.jobs.get(d.job_id)
            if target is not None and not target.state.is_terminal:
                self._dependents.setdefault(d.job_id, set()).add(spec.job_id)
        why = self._gate(job, now)
        self._blocked.pop(spec.job_id, None)
        if why == NEVER:
            job.transition(JobState.CANCELLED, now)
            job.reason = NEVER
            job.acct.finish_time = now
            self._ended.append(job)
            self._log(now, stimulus, job, f"cancelled: {NEVER} ({_fmt_deps(spec, self.state.jobs)})")
        elif why:
            self._blocked[spec.job_id] = why
            job.reason = why
            if why == ARRAY_LIMIT:
                self._array_waiting.setdefault(spec.array_id, deque()).append(spec.job_id)
            elif why == BEGIN:
                self._begins[spec.job_id] = spec.begin_time
        else:
            job.reason = ""
            if spec.array_limit:
                self._array_play.setdefault(spec.array_id, set()).add(spec.job_id)
            self._enqueue(job)
        self.settled.append(spec.job_id)
        return not why

    def _settle(self, now: float, stimulus: str, actions: list[Action]) -> bool:
        """Jobs ended in this event: admit what waited on them (dependents, the next tasks of a throttled
        array); returns True if any job joined the queue. Cancelling a job cascades to its dependents."""
        queued = False
        while self._ended:
            job = self._ended.pop()
            spec = job.spec
            for other in sorted(self._dependents.pop(spec.job_id, ())):
                why = self._blocked.get(other)
                if why == DEPENDENCY or (why is not None and self._gate(self.state.jobs[other], now) == NEVER):
                    queued |= self._admit(self.state.jobs[other], now, stimulus)
            if spec.array_limit:
                self._array_play.get(spec.array_id, set()).discard(spec.job_id)
                queued |= self._fill_array(spec.array_id, spec.array_limit, now, stimulus)
        return queued

    def _fill_array(self, array_id: str, limit: int, now: float, stimulus: str) -> bool:
        waiting = self._array_waiting.get(array_id)
        queued = False
        while waiting and len(self._array_play.get(array_id, ())) < limit:
            job_id = waiting.popleft()
            if self._blocked.get(job_id) == ARRAY_LIMIT:  # else it was cancelled or held meanwhile
                queued |= self._admit(self.state.jobs[job_id], now, stimulus)
        return queued

    def _begin_due(self, now: float, stimulus: str) -> bool:
        """Admit the jobs whose begin time came; True if any joined the queue."""
        queued = False
        for job_id in sorted(j for j, at in self._begins.items() if at <= now):
            del self._begins[job_id]
            if self._blocked.get(job_id) == BEGIN:  # else cancelled or held meanwhile
                queued |= self._admit(self.state.jobs[job_id], now, stimulus)
        return queued

    def _policy_due(self, now: float) -> bool:
        """Whether the policy's own timer or a deferral is due (a Tick was not only for time limits)."""
        return (self._policy_at is not None and self._policy_at <= now) or any(
            t <= now for t in self._deferred.values())

    def _expire_limits(self, now: float, stimulus: str, actions: list[Action]) -> bool:
        """Stop every running job past its time limit: checkpoint and exit (Preempt); its pause ends it as
        TIMEOUT. Returns True if any was stopped."""
        due = sorted(j for j, at in self._limits.items() if at <= now)
        for job_id in due:
            job = self.state.jobs[job_id]
            del self._limits[job_id]
            job.time_limit_at = None
            job.timing_out = True
            job.reason = TIME_LIMIT
            if job.state is not JobState.PAUSING:  # already pausing: its pause ends it all the same
                self._begin_pause(job, now)
                actions.append(Preempt(job_id))
            self.settled.append(job_id)
            self._log(now, stimulus, job, f"time limit of {job.spec.time_limit:g}s reached: checkpoint and stop")
        return bool(due)

    def _on_hold(self, e: ev.HoldRequested, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or not job.state.is_queued or job.held:
            return self._ignore(now, e, job)
        job.held = True
        if e.job_id not in self._blocked:
            self._dequeue(job)
            if job.spec.array_limit:  # it gives its array slot to the next task
                self._array_play.get(job.spec.array_id, set()).discard(job.job_id)
                self._fill_array(job.spec.array_id, job.spec.array_limit, now, e.stimulus_id)
        self._blocked[e.job_id] = job.reason = HELD
        self._log(now, e.stimulus_id, job, "held")
        return None

    def _on_release(self, e: ev.ReleaseRequested, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or not job.held:
            return self._ignore(now, e, job)
        job.held = False
        self._log(now, e.stimulus_id, job, "released")
        if job.state.is_terminal:
            return None
        return Trigger.RELEASE if self._admit(job, now, e.stimulus_id) else None

    def _on_requeue(self, e: ev.RequeueRequested, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or job.state not in (JobState.LOADING, JobState.RUNNING):
            return self._ignore(now, e, job)
        self._begin_pause(job, now)
        job.reason = "requeued"
        actions.append(Preempt(job.job_id))
        self._log(now, e.stimulus_id, job, "requeue asked: checkpoint, then queued again")
        return None


def _controlled(spec: JobSpec) -> bool:
    """Whether job control gates the job before it joins the queue."""
    return bool(spec.dependencies or spec.array_limit or spec.begin_time is not None)


def _fmt_deps(spec: JobSpec, jobs: dict) -> str:
    out = []
    for d in spec.dependencies:
        target = jobs.get(d.job_id)
        out.append(f"{d.kind.value}:{d.job_id} ({target.state.value if target else 'unknown job'})")
    return ", ".join(out)


def _fmt_exec(x: ExecConfig) -> str:
    out = f"micro-batch {x.micro_batch} x {x.accumulation}, MPS {x.mps_percentage}%"
    if x.memory_limit_mb:
        out += f", memory {x.memory_limit_mb} MB"
    return out + (f", plan {x.plan}" if x.plan else "")


def _fmt_gpus(gpus: tuple[int, ...]) -> str:
    return ",".join(map(str, gpus)) if len(gpus) <= 8 else f"{gpus[0]}..{gpus[-1]} ({len(gpus)})"
