"""The engine's handlers for what meshd tells it after a restart and during a run besides the cycle: jobs restored
from the journal or adopted still running, checkpoints saved, totals declared by the script, models fitted,
recovery done; and the re-timing of a job's partners when it starts or stops training. A mixin of `Engine`
(meshsched.engine), which owns the state these handlers change.
"""

from __future__ import annotations

from dataclasses import replace

from meshsched import events as ev
from meshsched.actions import Action
from meshsched.estimate import ideal_step_time
from meshsched.jobcontrol import controlled
from meshsched.policies.base import Trigger
from meshsched.state import ExecConfig, Job, JobState


class RecoveryHandlers:
    def _on_restored(self, e: ev.JobRestored, now: float, actions: list[Action]) -> Trigger | None:
        spec = e.spec
        if spec.job_id in self.state.jobs:
            raise ValueError(f"job {spec.job_id} already exists")
        ckpt = min(float(spec.iterations), max(0.0, e.checkpoint_iterations))
        state = JobState.PREEMPTED if e.preempted else JobState.PENDING
        job = Job(spec, ideal_step_time=ideal_step_time(self.estimator, self.state, spec), state=state, since=now,
                  progress_time=now, done_iterations=ckpt, checkpoint_iterations=ckpt, restarts=e.restarts)
        self.state.jobs[spec.job_id] = job
        if e.held or controlled(spec):
            job.held = e.held
            self.control.admit(job, now, e.stimulus_id)
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
        job = Job(spec, ideal_step_time=ideal_step_time(self.estimator, self.state, spec), state=JobState.RUNNING,
                  since=now, progress_time=now, done_iterations=done, checkpoint_iterations=ckpt, restarts=e.restarts)
        self.state.assign(spec.job_id, e.gpus)
        job.gpus = e.gpus
        job.exec = e.exec or ExecConfig.default_for(spec)
        job.acct.first_start = now
        job.step_time = self._estimate(job)
        self.state.jobs[spec.job_id] = job
        self._active[spec.job_id] = job
        self.control.adopted(job, e.time_limit_at, now)
        self._log(now, e.stimulus_id, job, f"re-adopted running on GPUs {fmt_gpus(e.gpus)}")
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
        queued = job.state.is_queued and job.job_id not in self.control.blocked
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

    def _partners_retimed(self, job: Job, now: float, stopped: bool) -> None:
        """`job` starts or stops training on its GPUs: the rate of each job training next to it changes now.
        A partner's progress is banked at its old rate, and a report measured partly before now loses its step
        time (`_on_report`); a partner left alone on all its GPUs has the engine's estimate alone until then.
        (The simulator's world reports the new rate at once; a real job only after a step at it.)"""
        gpus, jobs, me = self.state.gpus, self.state.jobs, job.job_id
        seen: set[str] = set()
        for g in job.gpus:
            on = gpus[g].jobs
            if len(on) < 2:
                continue  # (only `job` there: most jobs hold their GPUs alone)
            for other in on:
                if other == me or other in seen:
                    continue
                seen.add(other)
                p = jobs[other]
                if p.state is not JobState.RUNNING:
                    continue
                p.done_iterations = p.iterations_at(now)
                p.progress_time = p.rate_since = now
                self.state.touch(other)
                self._mark(other)
                alone = all(set(gpus[h].jobs) <= {me, other} for h in p.gpus)
                if stopped and alone and (p.exec is None or p.exec.plan is None):
                    p.step_time = self._estimate(p)


def fmt_gpus(gpus: tuple[int, ...]) -> str:
    return ",".join(map(str, gpus)) if len(gpus) <= 8 else f"{gpus[0]}..{gpus[-1]} ({len(gpus)})"
