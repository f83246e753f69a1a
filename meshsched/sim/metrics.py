"""What a replay achieved: JCT percentiles, queueing, makespan, Lazer's L/P and futile time, utilisation (useful
and busy), deadlines."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from meshsched.policies.abilities import KeepsShareLog
from meshsched.policies.stack import PolicyStack
from meshsched.sim.loop import SimResult
from meshsched.state import Job, JobState


@dataclass(frozen=True)
class Summary:
    policy: str
    jobs: int
    completed: int
    unschedulable: int  # larger than the cluster: never started, reported, not dropped
    unfinished: int  # neither completed nor unschedulable (should be 0 at the end of a replay)
    jct_mean_h: float
    jct_p50_h: float
    jct_p95_h: float
    jct_p99_h: float
    wait_mean_h: float
    wait_p50_h: float
    wait_p95_h: float
    makespan_h: float
    load_gpu_h: float  # L: GPU-hours spent loading
    pause_gpu_h: float  # P: GPU-hours spent saving checkpoints
    futile_gpu_h: float  # GPU-hours of loads thrown away by preemption (Lazer Eq. 2)
    futile_preemptions: int
    preemptions: int
    gpu_utilisation: float  # "busy": training GPU-time / (cluster GPUs x makespan); a slowed shared job counts more
    useful_utilisation: float  # "util": useful GPU-time (work done, at each job's solo speed) / (GPUs x makespan)
    deadline_met: float  # fraction of jobs with a deadline that completed by it
    events: int


def summarise(result: SimResult, policy: str) -> Summary:
    jobs = list(result.engine.state.jobs.values())
    total = result.cluster.total_gpus
    done = [j for j in jobs if j.state is JobState.COMPLETED]
    unsched = sum(1 for j in jobs if j.state.is_queued and j.spec.gpus > total)
    jct = np.array([j.acct.finish_time - j.spec.submit_time for j in done]) / 3600.0
    wait = np.array([j.acct.wait_time for j in done]) / 3600.0
    first = min((j.spec.submit_time for j in jobs), default=0.0)
    last = max((j.acct.finish_time for j in done), default=first)
    makespan = last - first
    gpu_h = lambda attr: sum(getattr(j.acct, attr) * j.spec.gpus for j in jobs) / 3600.0  # noqa: E731
    with_deadline = [j for j in jobs if j.spec.deadline is not None and not (j.state.is_queued and j.spec.gpus > total)]
    met = sum(1 for j in with_deadline if j.state is JobState.COMPLETED and j.acct.finish_time <= j.spec.deadline + 1e-9)

    def pct(a: np.ndarray, q: float) -> float:
        return float(np.percentile(a, q)) if a.size else float("nan")

    return Summary(
        policy=policy,
        jobs=len(jobs),
        completed=len(done),
        unschedulable=unsched,
        unfinished=len(jobs) - len(done) - unsched - sum(1 for j in jobs if j.state in (JobState.FAILED, JobState.CANCELLED)),
        jct_mean_h=float(jct.mean()) if jct.size else float("nan"),
        jct_p50_h=pct(jct, 50),
        jct_p95_h=pct(jct, 95),
        jct_p99_h=pct(jct, 99),
        wait_mean_h=float(wait.mean()) if wait.size else float("nan"),
        wait_p50_h=pct(wait, 50),
        wait_p95_h=pct(wait, 95),
        makespan_h=makespan / 3600.0,
        load_gpu_h=gpu_h("load_time"),
        pause_gpu_h=gpu_h("pause_time"),
        futile_gpu_h=gpu_h("futile_time"),
        futile_preemptions=sum(j.acct.futile_preemptions for j in jobs),
        preemptions=sum(j.acct.preemptions for j in jobs),
        gpu_utilisation=(gpu_h("run_time") * 3600.0 / (total * makespan)) if makespan > 0 else 0.0,
        useful_utilisation=(useful_gpu_seconds(jobs) / (total * makespan)) if makespan > 0 else 0.0,
        deadline_met=(met / len(with_deadline)) if with_deadline else float("nan"),
        events=result.events,
    )


def useful_gpu_seconds(jobs: list[Job]) -> float:
    """GPU-seconds of useful work: each job's iterations done, at its solo speed (`ideal_step_time`, alone on its
    best placement), times its GPUs. Unlike run time it does not grow when sharing slows a job down, so it is
    comparable across exclusive and sharing policies: sharing shows as what it gains (more work per GPU-hour)."""
    return sum(j.done_iterations * j.ideal_step_time * j.spec.gpus for j in jobs)


JOB_COLUMNS = (
    "job_id", "state", "gpus", "model", "batch_size", "iterations", "submit_time", "first_start",
    "finish_time", "jct", "wait_time", "load_time", "run_time", "pause_time", "futile_time",
    "preemptions", "deadline", "deadline_met",
)  # fmt: skip


def job_row(job: Job) -> dict[str, object]:
    a, s = job.acct, job.spec
    finished = job.state is JobState.COMPLETED
    return {
        "job_id": s.job_id,
        "state": job.state.value,
        "gpus": s.gpus,
        "model": s.model,
        "batch_size": s.batch_size,
        "iterations": s.iterations,
        "submit_time": round(s.submit_time, 3),
        "first_start": "" if a.first_start is None else round(a.first_start, 3),
        "finish_time": "" if a.finish_time is None else round(a.finish_time, 3),
        "jct": round(a.finish_time - s.submit_time, 3) if finished else "",
        "wait_time": round(a.wait_time, 3),
        "load_time": round(a.load_time, 3),
        "run_time": round(a.run_time, 3),
        "pause_time": round(a.pause_time, 3),
        "futile_time": round(a.futile_time, 3),
        "preemptions": a.preemptions,
        "deadline": "" if s.deadline is None else round(s.deadline, 3),
        "deadline_met": "" if s.deadline is None else int(finished and a.finish_time <= s.deadline + 1e-9),
    }


def summary_dict(s: Summary) -> dict[str, object]:
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in asdict(s).items()}


@dataclass(frozen=True)
class SharingSummary:
    """GPU sharing under a sharing policy; benefit is Castor eq. 24, t_solo / t_colocation per shared job.

    t_colocation is the job's JCT as simulated. t_solo is its JCT had it waited for its partners' GPUs
    instead (no new arrivals, as the paper assumes): its wait until the sharing start, plus the partners'
    predicted remaining time then (the policy's estimate), plus its own solo run time; recorded by the
    policy at the sharing decision (`share_log`).
    """

    shared_jobs: int
    shared_fraction: float
    benefit_mean: float
    benefit_p50: float
    benefit_below_1: float  # fraction of shared jobs for which sharing was worse than waiting


def sharing_summary(result: SimResult) -> SharingSummary | None:
    stack = result.engine.policy  # a PolicyStack: the placement layer keeps the log (None: a policy that never shares)
    layer = stack.placement if isinstance(stack, PolicyStack) else stack
    if not isinstance(layer, KeepsShareLog):
        return None
    log = layer.share_log
    jobs = result.engine.state.jobs
    ratios = []
    for rec in log.values():
        j = jobs.get(rec.job_id)
        if j is None or j.state is not JobState.COMPLETED:
            continue
        coloc = j.acct.finish_time - j.spec.submit_time
        solo = (rec.start - j.spec.submit_time) + rec.wait_jct_from_start
        if coloc > 0:
            ratios.append(solo / coloc)
    a = np.array(ratios)
    nan = float("nan")
    return SharingSummary(
        shared_jobs=len(ratios),
        shared_fraction=len(ratios) / max(1, len(jobs)),
        benefit_mean=float(a.mean()) if a.size else nan,
        benefit_p50=float(np.median(a)) if a.size else nan,
        benefit_below_1=float((a < 1).mean()) if a.size else nan,
    )
