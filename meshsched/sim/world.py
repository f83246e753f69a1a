"""The simulated cluster: carries out the engine's actions and reports back, with the perf model as truth.

Jobs advance by rate, not by ticks: a running job's finish is one scheduled event, replaced whenever its
rate changes or it is preempted. Loading takes the model's load time l, a checkpoint its pause time p (Lazer).

GPU sharing (at most two jobs per GPU): a training job's true step time is its solo step time (with its
micro-batch and gradient accumulation, from the `ExecConfig` its Launch or Reconfigure carries) times the largest interference ratio xi it
suffers on any of its GPUs from the job training next to it there (`meshsched.perf.interference`: measured
pair, else the XGBoost prediction, else the conservative default). A job that is still loading does not
slow its partner. When a partner starts training, pauses, finishes or is killed, every job sharing a GPU
with it has its progress brought up to date at the old rate and its finish event rescheduled at the new
one. Two jobs whose assumed memory (`meshsched.perf.memory`) does not fit on one GPU, or whose pair was
measured infeasible, make the later one fail with an out-of-memory error when it starts training.

Calibration (Gimbal): once a job or a partner trains under a calibration (an MPS share below 100% or uneven
per-rank samples, from its ExecConfig), its step follows the MPS-share model (`perf/mps_share.py`): each
rank's step is `worker_step_s` under its share, its samples and its GPU partner's share (the partner's xi at
100%/100% from the same interference model), and the job runs at its slowest rank (stragglers slow the whole
job); at 100% with even samples this is the uncalibrated solo x xi. A Reconfigure that changes only the MPS
share (LGRR) costs LGRR_SWITCH_S = 3.6 s without progress (Gimbal's measured switch with a CUDA context pool;
meshd has no pool and pays a checkpoint-restart instead); one that changes only samples (LISS), micro-batch or
accumulation is free; a plan or memory-limit change costs the pause plus load time. A job under an execution
plan (Rubick: `ExecConfig.plan`) steps at the plan model's iteration time for its plan, GPUs and CPUs. The partners of a job
whose calibration changed are re-rated at once.

Reports: whenever the world re-rates a training job (a partner starts or stops training next to it, its own or
a partner's ExecConfig changes) it reports to the engine what the SDK would report to meshd once the job trains
at the new rate: an IterationReport with its iterations done and its true step time (meshd turns rank 0's
report frame into the same event). It is due at once (`take_reports`, delivered by the loop right after the
event that caused it) or, after a reconfiguration's restart, when the job trains again. A job whose rate never
changes sends none: the engine's own estimate (the same perf model) is already its true step time.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from meshsched import events as ev
from meshsched.actions import Action, FitModel, Kill, Launch, Preempt, Reconfigure, ScheduleTimer, SignalJob
from meshsched.executor import check_handlers, dispatch
from meshsched.perf.memory import pair_fits
from meshsched.perf.mps_share import Partner
from meshsched.policies.gimbal import LGRR_SWITCH_S
from meshsched.policies.gimbal_policy import is_calibrated, job_perf
from meshsched.sim.rules import SimRules
from meshsched.state import ExecConfig, JobSpec, NodeSpec, placement_shape


@dataclass(slots=True)
class _Run:
    spec: JobSpec
    resume_from: float  # iterations done at `started_at` (re-based whenever the rate changes)
    step_time: float  # current true seconds per step (solo x interference)
    gpus: tuple[int, ...] = ()
    solo_step: float = 0.0  # seconds per step alone with its micro-batch and accumulation
    micro_batch: int = 0
    accumulation: int = 1
    exec: ExecConfig | None = None  # how it trains (its Launch's, then its last Reconfigure's)
    started_at: float | None = None  # training start (or last re-base); None while loading
    token: int = 0  # seq of the pending JobStarted / JobFinished; stale events carry another
    report: int = 0  # seq of its pending IterationReport after a restart; stale reports carry another
    shared: bool = False  # has trained next to another job at some point
    xi_max: float = 1.0
    partners: set[str] = field(default_factory=set)


class SimWorld:
    """Owns the event heap; `push` schedules an event, `pop` returns the next live one. An Executor."""

    def __init__(self, perf, nodes: list[NodeSpec], interference=None, mps_share=None,
                 rules: SimRules = SimRules(), fixed_steps: dict[str, float] | None = None) -> None:  # perf: PerfModel
        self._perf = perf
        self._fixed_steps = fixed_steps or {}  # trace-timed jobs' solo step, wherever they run (sim.durations)
        self._rules = rules
        self._stepped = rules.time_step_s is not None
        self._gpu_node: list[str] = []
        self._gpu_type: list[str] = []
        self._gpu_mem: list[int] = []
        for n in nodes:
            self._gpu_node += [n.name] * n.gpus
            self._gpu_type += [n.gpu_type] * n.gpus
            self._gpu_mem += [n.gpu_memory_mb] * n.gpus
        self._heap: list[tuple[float, int, ev.Event]] = []
        self._seq = 0
        self._runs: dict[str, _Run] = {}
        self._specs: dict[str, JobSpec] = {}
        self._training: dict[int, list[str]] = {}  # GPU -> jobs training on it (at most two)
        self._interference = interference
        self._mps_share = mps_share  # meshsched.perf.mps_share.MpsShareModel: truth for calibrated jobs
        self.oom_failures = 0
        self.lgrr_switches = 0  # MPS-share changes carried out (each cost LGRR_SWITCH_S)
        self._fit_count = 0
        self._report_count = 0
        self.due: dict[str, ev.IterationReport] = {}  # reports due now, one per job (the latest): take_reports()
        self._now = 0.0  # time of the last event popped
        self._handlers = {Launch: self._launch, Preempt: self._preempt, Kill: self._kill,
                          Reconfigure: self._reconfigure, ScheduleTimer: self._timer, FitModel: self._fit,
                          SignalJob: lambda a, now: None}  # a simulated job has no process to signal
        check_handlers("SimWorld", self._handlers)

    @property
    def interference(self):
        if self._interference is None:
            raise RuntimeError("jobs share GPUs but the simulator was given no interference model "
                               "(simulate(..., interference=...))")
        return self._interference

    def push(self, at: float, event: ev.Event) -> int:
        """Time-stepped rules: `at` moves to its step boundary (SimRules.step_of; a timer to the next one,
        step_after), and within a step events without a scheduling trigger come first, then timers, then
        releases, then arrivals (Lucid's order), so the step's last event carries a trigger and its pass
        (SteppedStack) stands for the whole step."""
        self._seq += 1
        rank = 0
        if self._stepped:
            rank = _STEP_RANK.get(type(event), 0)
            at = self._rules.step_after(at) if rank == 1 else self._rules.step_of(at)
        heapq.heappush(self._heap, (at, rank, self._seq, event))
        return self._seq

    def pop(self) -> tuple[float, ev.Event] | None:
        heap, runs = self._heap, self._runs
        while heap:  # (`_drop_stale`, inline: once per event)
            at, _, seq, event = heapq.heappop(heap)
            kind = type(event)
            if kind is ev.JobStarted or kind is ev.JobFinished:  # (neither is subclassed)
                run = runs.get(event.job_id)
                if run is None or run.token != seq:
                    continue  # superseded by a preemption, a kill or a rate change
            elif kind is ev.IterationReport:
                run = runs.get(event.job_id)
                if run is None or run.report != seq:
                    continue  # the job stopped, or a later re-rate reported since
            self._now = at
            return at, event
        return None

    def next_time(self) -> float | None:
        """When the next live event happens (None: nothing is left)."""
        return self._heap[0][0] if self._drop_stale() else None

    def _drop_stale(self) -> bool:
        heap = self._heap
        while heap:
            at, _, seq, event = heap[0]
            kind = type(event)
            if kind is ev.JobStarted or kind is ev.JobFinished:  # (neither is subclassed)
                run = self._runs.get(event.job_id)
                if run is None or run.token != seq:
                    heapq.heappop(heap)  # superseded by a preemption, a kill or a rate change
                    continue
            elif kind is ev.IterationReport:
                run = self._runs.get(event.job_id)
                if run is None or run.report != seq:
                    heapq.heappop(heap)  # the job stopped, or a later re-rate reported since
                    continue
            return True
        return False

    def submit(self, spec: JobSpec) -> None:
        self._specs[spec.job_id] = spec

    def _solo(self, run: _Run) -> float:
        fixed = self._fixed_steps.get(run.spec.job_id)
        if fixed is not None:
            return fixed
        if run.exec is not None and run.exec.plan is not None:  # an execution plan (Rubick): the plan model
            return self._perf.plan_iteration_time(run.spec.model, run.exec, self._shape(run.gpus))
        if run.spec.plan is not None and hasattr(self._perf, "plan_iteration_time"):  # no plan layer: as asked
            asked = ExecConfig(1, plan=run.spec.plan, cpus_per_gpu=-(-run.spec.cpus // run.spec.gpus) if run.spec.cpus else None)
            return self._perf.plan_iteration_time(run.spec.model, asked, self._shape(run.gpus))
        return self._perf.iteration_time(
            run.spec.model, self._gpu_type[run.gpus[0]], self._shape(run.gpus), run.micro_batch * run.accumulation,
            run.accumulation,
        )

    def execute(self, actions: list[Action | ScheduleTimer | FitModel], now: float) -> None:
        handlers = self._handlers
        for a in actions:
            h = handlers.get(type(a))
            if h is None:
                dispatch("SimWorld", handlers, a, now)  # (raises UnknownAction)
            h(a, now)

    def _launch(self, a: Launch, now: float) -> None:
        spec = self._specs[a.job_id]
        x = a.exec
        run = _Run(spec, a.resume_from, 0.0, a.gpus, 0.0, x.micro_batch, x.accumulation, x)
        self._check_exec(x, len(a.gpus))
        run.solo_step = run.step_time = self._solo(run)
        self._runs[a.job_id] = run
        charge = self._rules.restart_charge(spec.gpus) if a.restart else None
        load = charge if charge is not None else self._perf.load_time(spec.model) if self._rules.load_time else 0.0
        run.token = self.push(now + load, ev.JobStarted(f"loaded-{a.job_id}", a.job_id))

    def _preempt(self, a: Preempt, now: float) -> None:
        run = self._runs.pop(a.job_id)
        if run.started_at is None:  # still loading: nothing new to save
            self.push(now, ev.JobPaused(f"paused-{a.job_id}", a.job_id, run.resume_from))
        else:
            done = min(run.spec.iterations, run.resume_from + (now - run.started_at) / run.step_time)
            # a fixed restart charge is paid at the restart: the GPUs come free at once
            pause = self._perf.pause_time(run.spec.model) if self._rules.restart_charge_s is None else 0.0
            self._stop_training(a.job_id, run, now)
            self.push(now + pause, ev.JobPaused(f"paused-{a.job_id}", a.job_id, done))

    def _kill(self, a: Kill, now: float) -> None:
        run = self._runs.pop(a.job_id, None)
        if run is not None and run.started_at is not None:
            self._stop_training(a.job_id, run, now)

    def _reconfigure(self, a: Reconfigure, now: float) -> None:
        """At a step boundary (free), by an LGRR switch (LGRR_SWITCH_S) or by checkpoint and restart (the job's
        pause plus load time), without progress meanwhile; its finish and its partners' are rescheduled."""
        run = self._runs.get(a.job_id)
        if run is None:
            return  # it ended before the reconfiguration reached it
        self._check_exec(a.exec, len(run.gpus))
        if run.started_at is not None:
            run.resume_from = min(run.spec.iterations, run.resume_from + (now - run.started_at) / run.step_time)
            run.started_at = now
        old = run.exec
        run.micro_batch, run.accumulation, run.exec = a.exec.micro_batch, a.exec.accumulation, a.exec
        run.solo_step = self._solo(run)
        delay = 0.0
        if a.restart:
            only_mps = old is not None and _restart_key(old) == _restart_key(a.exec)
            delay = LGRR_SWITCH_S if only_mps else self._perf.pause_time(run.spec.model) + self._perf.load_time(run.spec.model)
        if old is not None and old.mps_percentage != a.exec.mps_percentage:
            self.lgrr_switches += 1
        self.push(now + delay, ev.ReconfigureApplied(f"reconfigured-{a.job_id}", a.job_id, a.exec))  # before its report
        if run.started_at is not None:
            run.started_at = now + delay  # progress resumes after the restart
            self._rerate(a.job_id, run, now + delay)
            for p in self._partners(run):  # its share and samples change what its partners suffer
                self._rerate(p, self._runs[p], now)

    def _timer(self, a: ScheduleTimer, now: float) -> None:
        self.push(a.at, ev.Tick(f"tick-{a.key}", a.key))

    def _fit(self, a: FitModel, now: float) -> None:
        """Fit at once; the answer comes at the same simulated time (a replay stays deterministic)."""
        self._fit_count += 1
        self.push(now, ev.ModelFitted(f"fitted-{self._fit_count}", a.fit(a.request)))

    def _check_exec(self, x: ExecConfig, ranks: int) -> None:
        if x.plan is not None and not hasattr(self._perf, "plan_iteration_time"):
            raise RuntimeError(f"a job trains under execution plan {x.plan} but the simulator's performance model "
                               "has no plan model (simulate with meshsched.perf.plans.PlanPerfModel)")
        if x.local_batches is not None:
            x.samples(ranks)  # local_batches must name every rank
        if self._mps_share is None and is_calibrated(x):
            raise RuntimeError("a job trains under an MPS share or uneven samples but the simulator was given no "
                               "MPS-share model (simulate(..., mps_share=...))")

    def started(self, job_id: str, now: float) -> None:
        """Loading finished: schedule the finish from the job's true rate (and re-rate its partners)."""
        run = self._runs[job_id]
        partners = self._partners(run)
        if partners and not all(self._fits(run, self._runs[p], self._gpu_type[run.gpus[0]]) for p in partners):
            self._runs.pop(job_id)
            self.oom_failures += 1
            self.push(now, ev.JobFailed(f"oom-{job_id}", job_id, "out of GPU memory next to its partner"))
            return
        run.started_at = now
        for g in run.gpus:
            self._training.setdefault(g, []).append(job_id)
        if not partners:
            left = run.spec.iterations - run.resume_from
            run.token = self.push(now + left * run.step_time + self._rules.preemptive_end_lag_s,
                                  ev.JobFinished(f"finished-{job_id}", job_id))
            return
        run.shared = True
        run.partners.update(partners)
        self._rerate(job_id, run, now)
        for p in partners:
            prun = self._runs[p]
            prun.shared = True
            prun.partners.add(job_id)
            self._rerate(p, prun, now)

    def finished(self, job_id: str) -> None:
        """The job's JobFinished was popped: its partners speed up from now."""
        run = self._runs.pop(job_id, None)
        if run is not None and run.started_at is not None:
            self._stop_training(job_id, run, self._now)

    def take_reports(self) -> list[ev.IterationReport]:
        """The progress reports of jobs re-rated by the last event or actions, for the engine now (the loop
        delivers them after that event, as meshd turns the SDK's next report into an IterationReport)."""
        due = self.due
        if not due:
            return []  # (most events re-rate nobody)
        out = [r for r in due.values() if r.job_id in self._runs]
        due.clear()  # (the same dict: the loop reads it)
        return out

    def sharing_stats(self, job_id: str) -> tuple[bool, float] | None:
        run = self._runs.get(job_id)
        return None if run is None else (run.shared, run.xi_max)

    # ------------------------------------------------------------------ sharing internals

    def _partners(self, run: _Run) -> set[str]:
        out: set[str] = set()
        tr = self._training
        for g in run.gpus:
            lst = tr.get(g)
            if lst:
                out.update(lst)
        out.discard(run.spec.job_id)
        return out

    def _fits(self, a: _Run, b: _Run, gpu_type: str) -> bool:
        mem = self._gpu_mem[a.gpus[0]]
        if not pair_fits(a.spec.model, a.micro_batch, b.spec.model, b.micro_batch, mem):
            return False
        return self.interference.xi(a.spec.model, a.micro_batch, b.spec.model, b.micro_batch, gpu_type) is not None

    def _xi(self, run: _Run) -> float:
        """The largest slowdown `run` suffers on any of its GPUs from the job training next to it."""
        worst = 1.0
        gpu_type = self._gpu_type[run.gpus[0]]
        seen: set[str] = set()
        for g in run.gpus:
            for other in self._training.get(g, ()):
                if other == run.spec.job_id or other in seen:
                    continue
                seen.add(other)
                o = self._runs[other]
                x = self.interference.xi(run.spec.model, run.micro_batch, o.spec.model, o.micro_batch, gpu_type)
                xa = x[0] if x is not None else self.interference_default()
                worst = max(worst, xa)
        return worst

    @staticmethod
    def interference_default() -> float:
        from meshsched.perf.interference import DEFAULT_XI

        return DEFAULT_XI

    def _rerate(self, job_id: str, run: _Run, now: float) -> None:
        """Bring progress up to `now` at the old rate, then reschedule the finish at the new one."""
        if run.started_at is None:
            return
        done = min(run.spec.iterations, run.resume_from + max(0.0, now - run.started_at) / run.step_time)
        at = max(now, run.started_at)  # later than now while a reconfiguration's restart is under way
        run.resume_from, run.started_at = done, at
        xi = self._xi(run)
        run.xi_max = max(run.xi_max, xi)
        run.step_time = self._calibrated_step(run) if self._calibration_applies(run) else run.solo_step * xi
        run.token = self.push(at + (run.spec.iterations - done) * run.step_time + self._rules.preemptive_end_lag_s,
                              ev.JobFinished(f"finished-{job_id}", job_id))
        self._report(job_id, run, at, done)

    def _report(self, job_id: str, run: _Run, at: float, done: float) -> None:
        """What the SDK tells meshd once the job trains at its new rate: its progress and its true step time.
        Due now, or (after a reconfiguration's restart) when it trains again."""
        self._report_count += 1
        report = ev.IterationReport(f"report-{self._report_count}", job_id, done, run.step_time)
        if at > self._now:
            self.due.pop(job_id, None)
            run.report = self.push(at, report)
        else:
            run.report = 0  # a report pushed before (a restart's) is superseded
            self.due.pop(job_id, None)
            self.due[job_id] = report

    def _calibration_applies(self, run: _Run) -> bool:
        if self._mps_share is None:
            return False
        me = run.spec.job_id
        others = [self._runs[o] for g in run.gpus for o in self._training.get(g, ()) if o != me]
        if any(r.spec.plan is not None or (r.exec is not None and r.exec.plan is not None) for r in [run, *others]):
            return False  # a job under an execution plan has no MPS-share model: interference as uncalibrated
        return is_calibrated(run.exec) or any(is_calibrated(o.exec) for o in others)

    def _calibrated_step(self, run: _Run) -> float:
        """The slowest rank's step under the MPS-share model (see the module docstring)."""
        model, me = self._mps_share, run.spec.job_id
        gpu_type = self._gpu_type[run.gpus[0]]
        jp = self._job_perf(run)
        share = run.exec.mps_percentage / 100
        worst = 0.0
        for g, samples in zip(run.gpus, run.exec.samples(len(run.gpus))):
            partner = None
            for other in self._training.get(g, ()):
                if other != me:
                    o = self._runs[other]
                    x = self.interference.xi(run.spec.model, run.micro_batch, o.spec.model, o.micro_batch, gpu_type)
                    xi = x[0] if x is not None else self.interference_default()
                    partner = Partner(xi, self._job_perf(o).curve, o.exec.mps_percentage / 100)
            worst = max(worst, model.worker_step_s(jp.alpha_s, jp.beta_s, samples, jp.curve, share, partner))
        return worst

    def _job_perf(self, run: _Run):
        return job_perf(self._perf, self._mps_share, run.spec.model, self._gpu_type[run.gpus[0]], self._shape(run.gpus),
                        run.exec)

    def _stop_training(self, job_id: str, run: _Run, now: float) -> None:
        partners = self._partners(run)
        for g in run.gpus:
            lst = self._training.get(g)
            if lst and job_id in lst:
                lst.remove(job_id)
                if not lst:
                    del self._training[g]
        for p in partners:
            prun = self._runs.get(p)
            if prun is not None:
                self._rerate(p, prun, now)

    def _shape(self, gpus: tuple[int, ...]) -> tuple[int, ...]:
        node = self._gpu_node
        return placement_shape([node[g] for g in gpus])


def _restart_key(x: ExecConfig) -> tuple:
    """What a restart changes besides the MPS share (an LGRR switch changes only that)."""
    return x.memory_limit_mb, x.plan, x.gpus, x.cpus_per_gpu, x.memory_gb_per_gpu


# Delivery order within one step under time-stepped rules (the rest: 0, first)
_STEP_RANK = {ev.Tick: 1, ev.JobFailed: 2, ev.JobPaused: 2, ev.JobFinished: 2, ev.JobSubmitted: 3}
