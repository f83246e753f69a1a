"""The engine: the only code that changes the cluster state. `handle(event, now) -> actions`.

One small handler per event type; after each event the policy gets one scheduling pass and every
decision is recorded, with its stimulus and reason, in a bounded log (what `mesh explain` prints).
Beside the cycle: job control (`jobcontrol`), admission (`admission`), the wait queue (`waitqueue`) and the
one timer (`timers`). `take_changed()` names the jobs changed since it was last called (what meshd mirrors).
Nothing here reads a clock or does I/O: `now` is passed in.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import fields

from meshsched import admission
from meshsched import events as ev
from meshsched.actions import Action, FitModel, Kill, Launch, Preempt, Reconfigure
from meshsched.decision_log import DecisionLog, LogEntry
from meshsched.drain import Drains
from meshsched.engine_recovery import RecoveryHandlers, fmt_gpus
from meshsched.estimate import StepTimeEstimator, ideal_step_time, step_time_where
from meshsched.faults import FaultDomains, FaultHooks
from meshsched.jobcontrol import TIME_LIMIT, JobControl, QueueHooks, controlled
from meshsched.policies import base as pb
from meshsched.policies.base import ClusterView, Defer, Evict, Remember, RequestFit, Start, Trigger, Wait
from meshsched.greedy import is_greedy, never_times, none_can_start, stock_pass
from meshsched.policies.queue import QueueScheduler
from meshsched.policies.stack import PolicyStack
from meshsched.state import ClusterState, ExecConfig, Job, JobSpec, JobState
from meshsched.timers import Timers
from meshsched.waitqueue import WaitQueue


_BATCHED = {ev.JobSubmitted, ev.CancelRequested}  # the events `Engine.handle_many` gives one pass together
_QUEUE_KEPT = frozenset({ev.JobStarted, ev.IterationReport, ev.RankReport})  # no job joins the queue, no GPU frees
_NODE_EVENTS = frozenset({ev.NodeJoined, ev.NodeLost})  # the state logs these itself (`ClusterState.touch_nodes`)
_SPEC_REST = operator.attrgetter(*(f.name for f in fields(JobSpec) if f.name != "job_id"))  # a spec but its id


class Engine(RecoveryHandlers):
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
        self.log = DecisionLog(maxlen=log_size)
        self.waiting = WaitQueue()  # the policy's queue (jobs job control keeps out are not in it)
        self._active: dict[str, Job] = {}  # jobs holding GPUs
        self.timers = Timers()  # the one timer the engine arms: the policy's, deferrals, job control's times
        self._recalibrate: dict[str, None] = {}  # jobs whose packing set changed in this event (calibration layer)
        self.memory: object | None = None  # the preemption layer's memory (a frozen value, `Remember`)
        self.model: object | None = None  # the latest model a RequestFit produced (ModelFitted); derived, not durable
        self._changed: dict[str, None] = {}  # jobs changed since the last `take_changed`, in order
        self._view: ClusterView | None = None  # `view()`, kept while memory and model stand (`arrived` set per call)
        # a greedy stack's last pass left no queued job that could start; since then only arrivals and events that
        # move no job in or out of the queue or the GPUs (`_starts_nothing`). The stack `_greedy` last judged, its
        # verdict, and the stack when it never wants a timer:
        self._settled, self._greedy_of, self._greedy_is, self._no_timer = False, None, False, None
        # job control (Slurm's hold, dependencies, arrays, begin times, time limits) beside the cycle
        self.control = JobControl(self.state, QueueHooks(self._enqueue, self._dequeue, self._begin_pause, self._log,
                                                         self._ignore, self._mark))
        self.drains = Drains(self.state, self._log)  # GPUs out of service (mesh drain / resume)
        self.faults = FaultDomains(self.state, FaultHooks(self._release, self._requeue_from_checkpoint,  # GPU faults
                                                          self._on_failed, self._log))
        self._handlers: dict[type, Callable[[ev.Event, float, list[Action]], Trigger | None]] = {
            ev.JobSubmitted: self._on_submitted, ev.JobStarted: self._on_started,
            ev.IterationReport: self._on_report, ev.JobPaused: self._on_paused,
            ev.JobFinished: self._on_finished, ev.JobFailed: self._on_failed,
            ev.CancelRequested: self._on_cancel, ev.NodeJoined: self._on_node_joined,
            ev.NodeLost: self._on_node_lost, ev.Tick: self._on_tick, ev.JobRestored: self._on_restored,
            ev.JobAdopted: self._on_adopted, ev.CheckpointSaved: self._on_checkpoint,
            ev.RecoveryDone: self._on_recovery_done, ev.ReconfigureApplied: self._on_reconfigured,
            ev.RankReport: self._on_rank_report, ev.TotalDeclared: self._on_total_declared,
            ev.ModelFitted: self._on_model_fitted, ev.HoldRequested: self.control.on_hold,
            ev.ReleaseRequested: self.control.on_release, ev.RequeueRequested: self.control.on_requeue,
            ev.GpuFault: self.faults.on_fault,  # a shared GPU is one fault domain (meshsched.faults)
            ev.DrainChanged: self.drains.on_changed,
            ev.JobsForgotten: self.control.on_forget,  # retention (meshd's keep_finished)
        }

    # ---------------------------------------------------------------- entry point

    def handle(self, event: ev.Event, now: float) -> list[Action]:
        actions: list[Action] = []
        kind = type(event)
        submitted = kind is ev.JobSubmitted
        if not submitted:
            # the event's job may have moved or reported progress (None: anything may have changed)
            job_id = getattr(event, "job_id", None)
            state = self.state
            if kind not in _NODE_EVENTS:
                state.touch(job_id)
            if job_id in state.jobs:
                self._changed[job_id] = None  # (`_mark`)
            if kind not in _QUEUE_KEPT:
                self._settled = False  # the queue or the free GPUs may change without a pass (`_starts_nothing`)
        settled = self._settled
        control = self.control
        trigger = self._handlers[kind](event, now, actions)
        if control.ended and control.settle(now, event.stimulus_id):
            settled = False
            if trigger is None:
                trigger = Trigger.RELEASE  # jobs whose dependencies were met joined the queue
        if trigger is not None:
            alone = submitted and settled and self._alone_placeable(event.spec)
            if alone and self._starts_nothing(event.spec):
                pass  # neither the newcomer nor any other queued job can start
            elif trigger is Trigger.RELEASE and self._releases_nothing():
                self._settled = True  # (what the pass would have concluded)
            else:
                self._schedule(trigger, now, event.stimulus_id, actions, event.spec.job_id if submitted else None,
                               alone)
        if self._recalibrate:
            self._calibrate_sharers(now, event.stimulus_id, actions)
        policy, timers, due = self.policy, self.timers, control.next_due()
        if due is None and self._no_timer is policy and timers.at is None and not timers.deferred:
            timers.policy_at = None  # (what `arm` would decide: no timer wanted, none armed)
            return actions
        timer = timers.arm(None if self._no_timer is policy else policy.next_timer(self.view(), now), due, now,
                           trigger is not None)
        if timer is not None:
            actions.append(timer)
        return actions

    def handle_many(self, events: list[ev.Event], now: float) -> list[Action]:
        """Events that happened together (an array's tasks submitted, many jobs cancelled), each applied as `handle`
        applies it, with ONE scheduling pass after the last instead of one per event. Arrivals are batched only
        where that pass decides what the passes one by one would have (`_arrivals_commute`); other events than
        JobSubmitted and CancelRequested, and arrivals under any other stack, are handled one by one."""
        kinds = {type(e) for e in events}
        if len(events) < 2 or len(kinds) > 1 or not kinds <= _BATCHED or \
                (ev.JobSubmitted in kinds and not self._arrivals_commute(events)):
            return [a for e in events for a in self.handle(e, now)]
        actions: list[Action] = []
        control, trigger, arrived = self.control, None, None
        self._settled = False  # (a batch's pass settles it again)
        for event in events:
            if type(event) is ev.JobSubmitted:
                arrived = event.spec.job_id
            else:
                self.state.touch(event.job_id)
                if event.job_id in self.state.jobs:
                    self._mark(event.job_id)
            got = self._handlers[type(event)](event, now, actions)
            if control.ended and control.settle(now, event.stimulus_id) and got is None:
                got = Trigger.RELEASE
            if got is not None and trigger is not Trigger.RELEASE:
                trigger = got  # a release's pass (a whole one) also serves the arrivals
        if trigger is not None:
            self._schedule(trigger, now, events[-1].stimulus_id, actions, arrived)
        if self._recalibrate:
            self._calibrate_sharers(now, events[-1].stimulus_id, actions)
        timer = self.timers.arm(None if self._no_timer is self.policy else self.policy.next_timer(self.view(), now),
                                control.next_due(), now, trigger is not None)
        if timer is not None:
            actions.append(timer)
        return actions

    def _arrivals_commute(self, events: list[ev.JobSubmitted]) -> bool:
        """Whether one pass after these arrivals decides what one pass after each would: jobs alike but for their
        ids (an array's tasks: they queue in their order, side by side), under a stack whose pass only starts
        queued jobs on free GPUs, greedily in queue order (a non-preemptive QueueScheduler: fifo, sjf, ...; no
        preemption or plan layer). Arrivals free nothing, so each pass one by one could start only its newcomer:
        the same jobs start, in the same order, and the rest wait for the same reasons."""
        p = self.policy
        if p.preemption is not None or p.plan is not None or type(p.placement) is not QueueScheduler or \
                p.placement.preemptive:
            return False
        alike = _SPEC_REST(events[0].spec)
        held = events[0].held
        return all(_SPEC_REST(e.spec) == alike and e.held == held for e in events)

    def _greedy(self) -> bool:
        """Whether the stack is greedy (meshsched.greedy), judged once per stack object (tests swap `policy`)."""
        p = self.policy
        if p is not self._greedy_of:
            self._greedy_of, self._greedy_is = p, is_greedy(p)
            self._no_timer = p if never_times(p) else None
        return self._greedy_is

    def _releases_nothing(self) -> bool:
        """Whether a greedy stack's pass after GPUs came free would decide nothing: no queued GPU count can be
        placed (`none_can_start`), and no job may hold a partner's settings (`PolicyStack.schedule`'s only other
        work on a release). About half the finishes of a busy replay free GPUs no queued job can use."""
        p = self.policy
        return self._greedy() and not self.state.drained and not p.may_hold_partner_settings and stock_pass(p) and \
            none_can_start(self.state, self.waiting.sizes)

    def _starts_nothing(self, spec: JobSpec) -> bool:
        """Whether the pass after `spec`'s arrival, only it placeable (`_alone_placeable`), would decide nothing."""
        return stock_pass(self.policy) and none_can_start(self.state, (spec.gpus,))

    def _alone_placeable(self, spec: JobSpec) -> bool:
        """Whether, the queue settled, only the newcomer may start (greedy.py; never with drained GPUs)."""
        return self._greedy() and not self.state.drained and spec.job_id in self.waiting.keys

    def take_changed(self) -> list[str]:
        """The ids of every job the engine changed (state, reason, placement, exec config, held, progress) since
        the last call, each once, in the order first changed; the job an event names counts as changed by it."""
        out = list(self._changed)
        self._changed.clear()
        return out

    active = property(lambda self: self._active, doc="jobs holding GPUs, in start order (meshsched.snapshot)")

    # ---------------------------------------------------------------- queries

    def view(self, arrived: str | None = None, settled: bool = False) -> ClusterView:
        """The policy's view (the engine's own containers: one serves until memory or model move; ClusterView)."""
        v = self._view
        if v is None or v.memory is not self.memory or v.model is not self.model:
            w = self.waiting
            v = self._view = ClusterView(self.state, w.entries, self._active, w.sizes, None, self.memory, self.model,
                                         w.needs, w.keys, w.by_need)
        v.arrived, v.settled = arrived, settled
        return v

    def queued(self) -> Iterator[Job]:
        return self.view().queue()

    @property
    def queue_length(self) -> int:
        return len(self.waiting)

    def pending_reason(self, job_id: str) -> str:
        """Slurm-style reason a queued job is not running: Unschedulable, Resources, Priority, or the policy's."""
        job = self.state.jobs[job_id]
        if not job.state.is_queued:
            return ""
        blocked = self.control.blocked.get(job_id)
        if blocked is not None:
            return blocked
        if job.spec.gpus > self.state.total_gpus:
            return f"Unschedulable (needs {job.spec.gpus} GPUs, cluster has {self.state.total_gpus})"
        if job.reason:
            return job.reason
        ahead = any(self.state.jobs[j].spec.gpus <= self.state.total_gpus for j in self.waiting.ahead(job_id))
        return "Priority" if ahead else self.drains.reason_or(job, "Resources")

    def explain(self, job_id: str) -> list[LogEntry]:
        return [e for e in self.log if e.job_id == job_id]

    # ---------------------------------------------------------------- handlers

    def _on_submitted(self, e: ev.JobSubmitted, now: float, actions: list[Action]) -> Trigger | None:
        spec = e.spec
        if spec.job_id in self.state.jobs:
            raise ValueError(f"job {spec.job_id} already exists")
        job = Job(spec, ideal_step_time=ideal_step_time(self.estimator, self.state, spec), since=now, progress_time=now)
        self.state.jobs[spec.job_id] = job
        refused = admission.refusal(self.state, self.policy, self.view(), spec)  # GPUs: a node may join
        if refused is not None:  # it could never run: fail it now rather than queue it for ever
            job.transition(JobState.FAILED, now)
            job.reason = f"refused: {refused}"
            job.acct.finish_time = now
            self._log(now, e.stimulus_id, job, job.reason)
            return None
        self._log(now, e.stimulus_id, job, f"submitted: {spec.gpus} GPU(s), model {spec.model}")
        if e.held or controlled(spec):
            job.held = e.held
            return Trigger.ARRIVAL if self.control.admit(job, now, e.stimulus_id) else None
        self._enqueue(job)
        return Trigger.ARRIVAL

    def admission_error(self, spec: JobSpec) -> str | None:
        """Why a job could never run here (one line), or None, asked before it is given an id (meshd): more GPUs
        than the live nodes have, more CPUs or host memory per node than any has, or what the policy stack
        refuses (an infeasible plan, a guarantee over the tenant's quota). See meshsched.admission."""
        return admission.admission_error(self.state, self.policy, self.view(), spec)

    def _on_started(self, e: ev.JobStarted, now: float, actions: list[Action]) -> Trigger | None:
        job = self.state.jobs.get(e.job_id)
        if job is None or job.state is not JobState.LOADING:
            return self._ignore(now, e, job)
        job.transition(JobState.RUNNING, now)
        job.progress_time = now
        job.step_time = self._estimate(job)
        self._log(now, e.stimulus_id, job, "loaded; training")
        if self.state.shared_gpus:  # (no GPU holds two jobs: nobody trains next to it)
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
        job.reported = (e.iterations, e.step_time)  # measured by the job itself (views tell it from estimates)
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
        self._log(now, e.stimulus_id, job, f"now trains as {e.exec.describe()}")
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
            self._mark(job.job_id)
        current = job.exec_pending or job.exec or ExecConfig.default_for(job.spec)
        if d.exec == current:
            return
        if d.exec.per_gpu_batch != current.per_gpu_batch and d.exec.plan == current.plan:
            raise ValueError(f"policy reconfigured {job.job_id} to {d.exec.describe()}: the per-GPU batch per step "
                             f"would change from {current.per_gpu_batch} (the global batch is fixed)")
        job.exec_pending = d.exec
        self.state.touch(job.job_id)  # what the policies read of its settings changed (`SharingScheduler.micro_batch`)
        actions.append(Reconfigure(job.job_id, d.exec, current.needs_restart(d.exec)))
        self._log(now, stimulus, job, f"reconfigure to {d.exec.describe()}: {d.reason}")

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
            self._end(job, JobState.TIMEOUT, TIME_LIMIT, now, e.stimulus_id,
                      f"time limit reached; stopped at {done:.0f}/{job.spec.iterations}")
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
            self._end(job, JobState.FAILED, e.reason, now, e.stimulus_id, f"failed: {e.reason}")
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
        self._end(job, JobState.CANCELLED, "cancelled", now, e.stimulus_id, "cancelled")
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
        if not self.timers.fired(e.key):
            self._log(now, e.stimulus_id, None, f"ignored Tick {e.key} (superseded timer)")
            return None
        control = self.control
        expired = bool(control.limits) and control.expire_limits(now, e.stimulus_id, actions)
        begun = bool(control.begins) and control.begin_due(now, e.stimulus_id)
        if (expired or begun) and not self.timers.policy_due(now):
            # only job control's times were due: jobs whose begin time came get a pass; the pauses of jobs
            # past their time limit free their GPUs and start one when they land
            return Trigger.RELEASE if begun else None
        return Trigger.TICK

    # ---------------------------------------------------------------- scheduling

    def _schedule(self, trigger: Trigger, now: float, stimulus: str, actions: list[Action],
                  stimulus_job: str | None = None, settled: bool = False) -> None:
        state = self.state
        jobs, control = state.jobs, self.control
        arrived = stimulus_job if trigger is Trigger.ARRIVAL else None
        for d in self.policy.schedule(self.view(arrived, settled and arrived is not None), now, trigger):
            kind = type(d)
            if kind is Remember:
                self.memory = d.memory
                continue
            if kind is RequestFit:
                actions.append(FitModel(d.fit, d.request))
                continue
            job = jobs[d.job_id]
            blocked = control.blocked
            if blocked and d.job_id in blocked:  # a policy that found it by its state (a Lazer deferral)
                self._log(now, stimulus, job, f"ignored {kind.__name__}: {blocked[d.job_id]}")
                continue
            if kind is Wait:  # (most of a pass's decisions: every queued job the pass leaves waiting)
                if job.reason != d.reason:
                    job.reason = d.reason
                    self._changed[d.job_id] = None  # (`_mark`)
            elif kind is Start or isinstance(d, Start):
                self._apply_start(d, job, now, stimulus, actions)
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
                if job.reason != d.reason:
                    job.reason = d.reason
                    self._mark(job.job_id)
            elif isinstance(d, Defer):
                if not job.state.is_queued:
                    raise ValueError(f"policy deferred {job.job_id} which is {job.state.value}")
                if not d.until > now:
                    raise ValueError(f"policy deferred {job.job_id} to {d.until}, not after now ({now})")
                job.deferred_until = d.until
                job.reason = d.reason
                self.timers.deferred[job.job_id] = d.until
                self._log(now, stimulus, job, f"deferred {d.until - now:.1f}s: {d.reason}")
            elif isinstance(d, pb.Reconfigure):
                self._reconfigure(d, now, stimulus, actions)
            else:
                raise TypeError(f"policy returned {d!r}, which is no decision")
        self._settled = self._greedy() and not self.state.drained  # (a full pass: `_starts_nothing`)

    def _apply_start(self, d: Start, job: Job, now: float, stimulus: str, actions: list[Action]) -> None:
        state = self.state
        if state.drained and self.drains.refuses(d.gpus, job, now, stimulus):
            return
        if not job.state.is_queued:
            raise ValueError(f"policy started {job.job_id} which is {job.state.value}")
        job_id, gpus = job.spec.job_id, d.gpus
        self._dequeue(job)
        job.transition(JobState.LOADING, now)
        state.assign(job_id, gpus)
        job.gpus = gpus
        job.reason = ""
        job.exec = x = d.exec or ExecConfig.default_for(job.spec)
        job.exec_pending = None
        self._active[job_id] = job
        if job.spec.time_limit is not None:  # (job control times only the runs of jobs with a limit)
            self.control.started(job, now)
        acct = job.acct
        if acct.first_start is None:
            acct.first_start = now
        actions.append(Launch(job_id, gpus, job.checkpoint_iterations, job.restarts, x))
        job.restarts += 1
        self._changed[job_id] = None  # (`_log`)
        self.log.append((now, stimulus, job_id, f"start on GPUs {fmt_gpus(gpus)}: {d.reason}"))

    # ---------------------------------------------------------------- helpers

    def _enqueue(self, job: Job) -> None:
        spec = job.spec
        self.waiting.add(spec.job_id, self.policy.queue_key(job), spec.gpus)

    def _dequeue(self, job: Job) -> None:
        blocked = self.control.blocked
        spec = job.spec
        if blocked and blocked.pop(spec.job_id, None) is not None:
            return  # it was kept out of the queue
        if job.deferred_until is not None:
            job.deferred_until = None
            self.timers.deferred.pop(spec.job_id, None)
        self.waiting.remove(spec.job_id, spec.gpus)

    def _begin_pause(self, job: Job, now: float) -> None:
        """Stop counting `job`'s progress and move it to PAUSING (the caller sends the Preempt)."""
        job.done_iterations = job.iterations_at(now)
        job.progress_time = now
        if job.state is JobState.RUNNING and self.state.shared_gpus:
            self._partners_retimed(job, now, stopped=True)
        job.transition(JobState.PAUSING, now)

    def _estimate(self, job: Job) -> float:
        return step_time_where(self.estimator, self.state, job)

    def _release(self, job: Job, now: float) -> None:
        if job.state is JobState.RUNNING and self.state.shared_gpus:  # (a PAUSING job stopped training already)
            self._partners_retimed(job, now, stopped=True)
        if self.policy.calibration is not None:
            for g in job.gpus:  # its partners lose it: their packing set changed
                for other in self.state.gpus[g].jobs:
                    if other != job.job_id:
                        self._recalibrate[other] = None
        job_id = job.spec.job_id
        self.state.release(job_id, job.gpus)
        job.gpus = ()
        self._active.pop(job_id, None)
        if job.spec.time_limit is not None:  # (`_apply_start`)
            self.control.released(job)

    def _complete(self, job: Job, now: float, stimulus: str, message: str) -> None:
        if job.state is JobState.LOADING:  # its JobStarted was lost or overtaken: it did start
            job.transition(JobState.RUNNING, now)
        self._end(job, JobState.COMPLETED, "", now, stimulus, message)

    def _end(self, job: Job, state: JobState, reason: str, now: float, stimulus: str, message: str) -> None:
        """`job` reached terminal `state`: job control then settles what waited on it (`JobControl.settle`)."""
        job.transition(state, now)
        job.reason = reason
        job.acct.finish_time = now
        self.control.end(job)
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

    def _log(self, now: float, stimulus: str, job: Job | None, message: str) -> None:
        """Record a decision or change; a job logged about is a job changed (`take_changed`)."""
        job_id = "" if job is None else job.spec.job_id
        if job is not None:
            self._changed[job_id] = None
        self.log.append((now, stimulus, job_id, message))

    def _mark(self, job_id: str) -> None:
        """Note a change made without a log line (`take_changed`)."""
        self._changed[job_id] = None
