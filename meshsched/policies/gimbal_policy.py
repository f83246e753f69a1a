"""Gimbal as the calibration layer (`X+gimbal`): Algorithm 1 run over a job's packing set, answered as
`Reconfigure` decisions (LGRR: the job's MPS share in 10% steps, a restart; LISS: per-rank samples, free).

When it runs: after a job's progress or per-rank reports (meshd) and whenever its packing set changes (the
engine's hook: a sharer starts training next to it, or a partner leaves). The packing set is the jobs
training on GPUs connected to the job's through sharing; jobs still loading do not count (they do not
compute yet). A set that breaks section 5.1's packing rules is not calibrated: its jobs go back to a full
share and even samples (the paper runs such sets without coordination).

The runtime information for Algorithm 1 (`gimbal.coordination_search`) is the MPS-share model's prediction
(`perf/mps_share.py`, through `job_perf`), corrected per rank by the job's reported per-rank step times when
it has them: the reports say which ranks straggle (each rank's measured/predicted ratio, normalised to mean 1
over the job's ranks), the model gives the absolute level and the effect of a calibration not yet tried. So
the search runs in one call on predictions, instead of exploring on the live jobs as the paper does; only
the calibration it settles on is applied, and only that pays LGRR switches. What a live search would have
paid is kept in the memo (`search_lgrr_s`).

Readings and limits:
- Remaining time (RemainingSteps / Throughput in eq. 1, 3, 5) with `horizon=drain` (the default) follows the
  set as it drains: the calibration's throughput lasts until the first job of the set finishes, then the
  others go on with the partners that remain (a job left with no partner at a full share, its samples
  rebalanced once, as this layer resets it), and so on. `horizon=static` is the paper's form, the current throughput until each
  job ends; it credits J_max with its partners' squeeze long after short partners would have finished, and on
  Philly slices it squeezed short 1-GPU partners of long 8-GPU jobs to 10% for hours.
- `ExecConfig` has one MPS share per job (meshd sets it for every rank's MPS client), so a step that squeezes
  some of a job's workers is evaluated, and applied, as squeezing all of them to the lowest share.
- An LGRR change is applied only when the objective's predicted gain (seconds) exceeds the switch cost
  (`switch`, default the paper's 3.6 s); otherwise only LISS is applied where it gains.
- Memory across calls lives in the engine (`Job.calibration`, a `CalibrationMemo` carried by the decisions):
  without per-rank reports the search reruns only when the packing set changes; with reports, at most once per
  collection window (60 s or 5 of the job's steps, whichever comes first: section 5.2) and not while a change is
  still being applied (its effect is not in the reports yet). With reports a step must gain more than the measurement noise (5%) to count.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from meshsched.perf.errors import UnknownProfile
from meshsched.perf.interference import DEFAULT_XI
from meshsched.perf.mps_share import MpsShareModel, Partner
from meshsched.policies.base import ClusterView, Reconfigure
from meshsched.policies.gimbal import (
    COLLECT_MAX_S,
    COLLECT_MAX_STEPS,
    LGRR_SWITCH_S,
    MPS_MAX,
    STRAGGLER_TOLERANCE,
    Calibration,
    JobCalibration,
    JobPerf,
    Objective,
    PackedJob,
    PackingSet,
    Runtime,
    WorkerId,
    WorkerSetting,
    check_mps_percent,
    coordination_search,
    liss,
    split_workers,
)
from meshsched.policies.gimbal_packing import packing_violation
from meshsched.state import CalibrationMemo, ExecConfig, Job, JobState


def job_perf(perf, mps: MpsShareModel, model: str, gpu_type: str, shape: tuple[int, ...], x: ExecConfig) -> JobPerf:
    """A job's worker as the share model sees it, in seconds: alpha + beta * samples at a full share alone equals
    the iteration model's step (perf.iteration_time) at the even per-GPU batch. The all-reduce and the
    accumulation's extra passes are folded into alpha and beta in proportion, so a share, a partner or a sample
    change scales the whole step, as the uncalibrated simulator's interference does. The share curve is the
    family's at the micro-batch (what occupies the GPU at once)."""
    solo = perf.iteration_time(model, gpu_type, shape, x.per_gpu_batch, x.accumulation)
    p = perf.profile(model, gpu_type).params
    fixed, per_sample = x.accumulation * p.alpha_comp, p.beta_comp
    k = solo / (fixed + per_sample * x.per_gpu_batch)
    return JobPerf(fixed * k, per_sample * k, mps.curve(model, x.micro_batch))


def is_calibrated(x: ExecConfig | None) -> bool:
    """Whether a job trains under a calibration (a reduced MPS share or uneven samples)."""
    return x is not None and (x.mps_percentage != MPS_MAX or x.local_batches is not None)


@dataclass
class GimbalCalibration:
    """The calibration layer: `calibrate(view, job, now)` -> Reconfigure decisions for the job's packing set."""

    objective: Objective
    perf: object  # meshsched.perf.PerfModel
    interference: object  # meshsched.perf.interference.Interference
    mps_share: MpsShareModel
    switch_s: float = LGRR_SWITCH_S
    drain: bool = True  # remaining time as the set drains (see the module docstring); False: the paper's static
    name: str = "gimbal"
    # Keep each evaluation within one search (a calibration asked again, a drain stage, a worker's step): the same
    # numbers, computed once. False: every one from scratch (the reference the tests compare the memo with).
    memo: bool = True

    def calibrate(self, view: ClusterView, job: Job, now: float) -> list[Reconfigure]:
        if job.state is not JobState.RUNNING:
            return []
        members = self._packing_members(view, job)
        if any(_current(j).plan is not None for j in members):
            return []  # a job under an execution plan (TP/PP/ZeRO) is the plan layer's, not a data-parallel share
        sig = tuple((j.job_id, j.gpus, j.spec.iterations) for j in members)  # a length declared later: search again
        measured = {j.job_id for j in members if _reports(j)}
        memo = job.calibration
        if memo is not None and memo.packing == sig and (not measured or not _collected(job, memo, now)):
            return []
        if measured and any(j.exec_pending is not None for j in members):
            return []  # a change is still being applied: its effect is not measured yet (the next report retries)
        try:
            return self._calibrate_set(view, members, sig, measured, now)
        except (UnknownProfile, ValueError):
            return []  # a job without a profile, or a share outside LGRR's steps: left as it is

    # -- the packing set -------------------------------------------------------------------------------

    @staticmethod
    def _packing_members(view: ClusterView, job: Job) -> list[Job]:
        """Training jobs connected to `job` through shared GPUs (itself included), sorted by id. It walks the
        GPUs' holders (the cluster state's occupancy), not every job holding GPUs."""
        state = view.cluster_state()
        gpus, jobs, running = state.gpus, state.jobs, JobState.RUNNING
        seen, todo = {job.job_id: job}, [job]
        while todo:
            j = todo.pop()
            for g in j.gpus:
                for oid in gpus[g].jobs:
                    if oid not in seen:
                        o = jobs[oid]
                        if o.state is running:
                            seen[oid] = o
                            todo.append(o)
        return [seen[k] for k in sorted(seen)]

    # -- Algorithm 1 on predictions ----------------------------------------------------------------------

    def _calibrate_set(self, view, members, sig, measured, now) -> list[Reconfigure]:
        perf_of, packed, initial = {}, [], []
        for j in members:
            x = _current(j)
            check_mps_percent(x.mps_percentage)
            gpu_type = view.gpu_type(j.gpus[0])
            shape = tuple(sorted(_count_by(view.node_of(g) for g in j.gpus), reverse=True))
            jp = job_perf(self.perf, self.mps_share, j.spec.model, gpu_type, shape, x)
            perf_of[j.job_id] = jp
            left = max(0.0, j.spec.iterations - _done(j, now))
            deadline = None if j.spec.deadline is None else j.spec.deadline - now
            gpus = tuple((view.node_of(g), g) for g in j.gpus)
            packed.append(PackedJob(j.job_id, gpus, left, jp.curve.saturation, deadline))
            initial.append(JobCalibration(j.job_id, tuple(WorkerSetting(x.mps_percentage, b)
                                                          for b in x.samples(len(j.gpus)))))
        start = Calibration(tuple(initial))
        by_id = {j.job_id: j for j in members}

        def xi(a: str, b: str) -> float:
            ja, jb = by_id[a], by_id[b]
            got = self.interference.xi(ja.spec.model, _current(ja).micro_batch, jb.spec.model,
                                       _current(jb).micro_batch, view.gpu_type(ja.gpus[0]))
            return DEFAULT_XI if got is None else got[0]

        def model(cal: Calibration) -> Runtime:
            return _runtime(packed, perf_of, xi, self.mps_share, _one_share_per_job(cal))

        correction = self._corrections(packed, model(start), by_id, measured)

        corrected = _corrector(perf_of, xi, self.mps_share, correction, self.memo)

        even = Calibration(tuple(JobCalibration.even(jc.job, jc.global_batch, len(jc.settings)) for jc in start.jobs))
        if len(members) == 1:  # alone: a full share, samples balanced on the (reported) rank speeds
            best = _alone(packed, even, {members[0].job_id}, corrected)
            return self._decide(members, sig, start, best, corrected(packed, best), None, now,
                                "gimbal: trains alone: full share, balanced samples")
        why = packing_violation({pj.job: pj.gpus for pj in packed})
        if why is not None:
            return self._decide(members, sig, start, even, model(even), None, now,
                                f"gimbal: not calibrated ({why}): full share, even samples")
        pset = PackingSet(tuple(packed))

        evaluated: dict[Calibration, Runtime] = {}  # by the calibration asked, and by its one-share form
        stages: dict | None = {} if self.memo else None  # the drain's later stages, shared by every evaluation

        def evaluate(cal: Calibration) -> Runtime:
            got = evaluated.get(cal)
            if got is None:
                one = _one_share_per_job(cal)
                got = evaluated.get(one)
                if got is None:
                    got = corrected(packed, one)
                    if self.drain:
                        got = DrainRuntime(got.worker_step_s, got.comm_s, _drain(packed, one, got, corrected, stages))
                    if self.memo:
                        evaluated[one] = got
                if self.memo:
                    evaluated[cal] = got
            return got

        noise = STRAGGLER_TOLERANCE if measured else 0.0
        r = coordination_search(pset, start, evaluate, self.objective, lgrr_switch_s=self.switch_s, min_gain=noise)
        best, gain = _one_share_per_job(r.best), r.initial_objective - r.best_objective
        lgrr = _mps_changed(start, best)
        name = self.objective.name
        reason = f"gimbal {name}: objective {r.initial_objective:.0f}s -> "
        if lgrr and gain <= self.switch_s:  # an LGRR switch would cost more than it gains: LISS only
            best = _liss_only(pset, start, evaluate, self.objective, noise)
            reason += f"{self.objective.value(pset, evaluate(best)):.0f}s (LISS only; LGRR gain {gain:.1f}s < switch)"
        else:
            reason += f"{self.objective.value(pset, evaluate(best)):.0f}s in {len(r.steps)} step(s), {r.exit}"
        return self._decide(members, sig, start, best, evaluate(best), (pset.j_max.job, r.switch_cost_s), now, reason)

    def _decide(self, members, sig, start, best, runtime, lead, now, reason) -> list[Reconfigure]:
        """One decision per member (the memo rides on it even when its config stays)."""
        out = []
        for j in members:
            current = _current(j)
            settings = best.job(j.job_id).settings
            samples = tuple(s.samples for s in settings)
            new = replace(current, mps_percentage=settings[0].mps_percent,
                          local_batches=None if len(set(samples)) == 1 else samples)
            step = max(runtime.worker_step_s[WorkerId(j.job_id, r)] for r in range(len(settings)))
            m = j.calibration or CalibrationMemo((), now)
            changed, lgrr = new != current, new.mps_percentage != current.mps_percentage
            memo = CalibrationMemo(
                packing=sig, at=now, searches=m.searches + (lead is not None), changes=m.changes + changed,
                lgrr_changes=m.lgrr_changes + lgrr, lgrr_paid_s=m.lgrr_paid_s + (self.switch_s if lgrr else 0.0),
                search_lgrr_s=m.search_lgrr_s + (lead[1] if lead is not None and lead[0] == j.job_id else 0.0),
                done=_done(j, now), step_s=step,
            )
            out.append(Reconfigure(j.job_id, new, reason, memo))
        return out

    @staticmethod
    def _corrections(packed, predicted: Runtime, by_id, measured) -> dict[WorkerId, float]:
        """Per rank: measured/predicted step, normalised to mean 1 over the job's ranks (which ranks straggle)."""
        out = {}
        for pj in packed:
            if pj.job not in measured:
                continue
            ws = pj.workers()
            ratio = [m / predicted.worker_step_s[w] for w, m in zip(ws, by_id[pj.job].rank_step_times)]
            mean = statistics.fmean(ratio)
            out.update({w: q / mean for w, q in zip(ws, ratio)})
        return out


@dataclass(frozen=True)
class DrainRuntime(Runtime):
    """A Runtime whose remaining times follow the packing set as it drains (`_drain`)."""

    drained_s: Mapping[str, float] = field(default_factory=dict)

    def remaining_s(self, job: PackedJob) -> float:
        return self.drained_s[job.job]


def _drain(packed, cal: Calibration, first: Runtime, runtime_of, stages: dict | None = None) -> dict[str, float]:
    """Seconds until each job finishes when the set runs under `cal` until its first job ends, then the rest
    with the partners that remain (a job with none at a full share and even samples), and so on."""
    left = {j.job: j.remaining_steps for j in packed}
    active, now, out, rt = list(packed), 0.0, {}, first
    while active:
        step = {j.job: rt.job_step_s(j) for j in active}
        nxt = min(active, key=lambda j: (left[j.job] * step[j.job], j.job))
        dt = left[nxt.job] * step[nxt.job]
        now += dt
        for j in active:
            left[j.job] = max(0.0, left[j.job] - dt / step[j.job])
        out[nxt.job] = now
        active = [j for j in active if j.job != nxt.job]
        if active:
            gpus = {}
            for j in active:
                for g in j.gpus:
                    gpus[g] = gpus.get(g, 0) + 1
            alone = {j.job for j in active if all(gpus[g] == 1 for g in j.gpus)}
            cal = Calibration(tuple(jc for jc in cal.jobs if any(j.job == jc.job for j in active)))
            key = (tuple(j.job for j in active), cal, frozenset(alone))
            got = None if stages is None else stages.get(key)
            if got is None:
                got = _alone(active, cal, alone, runtime_of)
                got = (got, runtime_of(active, got))
                if stages is not None:
                    stages[key] = got
            cal, rt = got
    return out


def _alone(active, cal: Calibration, alone: set[str], runtime_of) -> Calibration:
    """`cal` with the jobs in `alone` at a full share and their samples balanced by one LISS round."""
    full = Calibration(tuple(
        JobCalibration(jc.job, tuple(WorkerSetting(MPS_MAX, s.samples) for s in jc.settings)) if jc.job in alone else jc
        for jc in cal.jobs))
    rt = runtime_of(active, full)
    return full.apply([p for j in active if j.job in alone for p in liss(j, full, rt)])


def _runtime(jobs, perf_of, xi, model: MpsShareModel, cal: Calibration, cache: dict | None = None) -> Runtime:
    """Each worker's predicted step under `cal`, its GPU partner's share and curve included (any layout).
    `cache`: worker steps by (job, samples, share, partner, partner's share), for calls over one set's jobs."""
    on_gpu: dict = {}
    for j in jobs:
        for w, g in zip(j.workers(), j.gpus):
            on_gpu.setdefault(g, []).append(w)
    cache = {} if cache is None else cache
    steps = {}
    for j in jobs:
        p = perf_of[j.job]
        settings = cal.job(j.job).settings
        for w, g in zip(j.workers(), j.gpus):
            s = settings[w.rank]
            other = None
            for o in on_gpu[g]:
                if o.job != j.job:
                    other = o
            theirs = None if other is None else (other.job, cal.setting(other).mps_percent)
            key = (j.job, s.samples, s.mps_percent, theirs)
            t = cache.get(key)
            if t is None:
                partner = None if other is None else Partner(xi(j.job, other.job), perf_of[other.job].curve,
                                                             theirs[1] / 100)
                t = cache[key] = model.worker_step_s(p.alpha_s, p.beta_s, s.samples, p.curve, s.mps_percent / 100,
                                                     partner)
            steps[w] = t
    return Runtime(steps)


def _corrector(perf_of, xi, model: MpsShareModel, correction, memo: bool):
    """`corrected(active, cal)`: the Runtime of the jobs `active` under `cal`, each rank's step times its measured
    correction; with `memo`, each (jobs, calibration) and each worker's setting computed once in this search."""
    seen: dict = {}
    worker_steps: dict | None = {} if memo else None

    def corrected(active, cal: Calibration) -> Runtime:
        key = (tuple(pj.job for pj in active), cal)
        got = seen.get(key)
        if got is None:
            got = _runtime(active, perf_of, xi, model, cal, worker_steps)
            if correction:  # (no reported ranks: the prediction as it is)
                got = Runtime({w: t * correction.get(w, 1.0) for w, t in got.worker_step_s.items()})
            if memo:
                seen[key] = got
        return got

    return corrected


def _done(j: Job, now: float) -> float:
    """Iterations done by `now`: from the memo's prediction when it is newer than anything the job reported
    (the memo predicts per-rank steps under the calibration; a report gives the job's step only), else the engine's."""
    m = j.calibration
    if m is not None and m.step_s > 0 and m.at >= max(j.progress_time, j.since):
        return min(float(j.spec.iterations), m.done + (now - m.at) / m.step_s)
    return j.iterations_at(now)


def _collected(j: Job, memo: CalibrationMemo, now: float) -> bool:
    """Whether the runtime information for a new step is in: 60 s or 5 of the job's steps since its last search,
    whichever comes first (section 5.2)."""
    return now - memo.at >= COLLECT_MAX_S or _done(j, now) - memo.done >= COLLECT_MAX_STEPS


def _mps_changed(a: Calibration, b: Calibration) -> bool:
    return any(x.mps_percent != y.mps_percent for jc in a.jobs for x, y in zip(jc.settings, b.job(jc.job).settings))


def _current(j: Job) -> ExecConfig:
    return j.exec_pending or j.exec or ExecConfig.default_for(j.spec)


def _reports(j: Job) -> bool:
    t = j.rank_step_times
    return len(t) == len(j.gpus) and all(v > 0 and math.isfinite(v) for v in t)


def _count_by(items) -> list[int]:
    out: dict = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return list(out.values())


def _one_share_per_job(cal: Calibration) -> Calibration:
    """One MPS share per job (ExecConfig's): the lowest its workers were given (`cal` itself when it has that)."""
    if all(s.mps_percent == jc.settings[0].mps_percent for jc in cal.jobs for s in jc.settings):
        return cal
    return Calibration(tuple(
        JobCalibration(jc.job, tuple(WorkerSetting(min(t.mps_percent for t in jc.settings), s.samples)
                                     for s in jc.settings))
        for jc in cal.jobs))


def _liss_only(pset, start: Calibration, evaluate, objective, noise: float) -> Calibration:
    """The start with LISS rebalancing every straggling job, if that lowers the objective by more than `noise`."""
    rt = evaluate(start)
    moves = [p for j in pset.jobs if split_workers(j, rt)[0] for p in liss(j, start, rt)]
    cal = start.apply(moves)
    before, after = objective.value(pset, rt), objective.value(pset, evaluate(cal))
    return cal if after < before - noise * abs(before) else start
