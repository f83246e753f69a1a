"""Lazer (lazer.txt section 4) as a preemption layer: event-driven SRTF whose preemptions are deferred by X
seconds chosen by Bayesian optimisation (meshsched.policies.lazer_opt).

On an arrival (Algorithm 1, lines 1-10) the newcomer j_new starts if the placement layer can start it; if not,
the scheduling orchestrator (Algorithm 2) looks among the running jobs (RQ: holding GPUs, not pausing, not in
the deferred-run queue) for the longest-remaining ones with a strictly longer remaining time than j_new until
their GPUs, with the free ones, make room for it. None: j_new waits in WQ (the engine's queue). Otherwise the
deferral predictor suggests X from the context c (Eq. 5); X = 0 preempts at once, X > 0 is a `Defer` decision
(an engine timer, never a thread): j_new goes to the deferred-wait queue (DWQ) and its candidates J_r to the
deferred-run queue (DRQ: they keep running and no other newcomer may take them). When the timer fires the
orchestrator runs again for j_new (J_r2, no second deferral): preempt, or back to WQ.
On a release (completion, a finished pause; lines 11-17) queued jobs start in SRTF order on what came free;
nothing is preempted. A deferred job starts too if GPUs come free for it (its deferral is then moot).
Beyond the paper (`_rescue`, issue 26): at a release the first queued job in SRTF order that cannot start is
handled as an arrival again (preempting longer jobs, deferred once, never a job still loading: its load would be
thrown away: sparing them cut castor+lazer's futile preemptions on the full trace's first 20,000 jobs at 1.5x
from 7.65 to 0.57 GPU-h), and at every pass the free GPUs it needs
(beside its deferral's victims, or completed by GPUs being paused) are kept from the jobs behind it; without
this a multi-GPU job starved behind a stream of longer 1-GPU jobs taking each GPU that came free. Under Castor,
a job its release pass declines because preempting longer jobs beats sharing is handled as an arrival too
(`_preempt_declined`).

F measurements (Eq. 2, `lazer_opt.ideal_deferral`): every prediction at t0 is pending with a candidate F (first 0):
a job with a shorter remaining time than j_new arriving D after t0 inside the candidate's load window
(F + p, F + p + l] pushes it to D - p; F is known, and |X - F| goes to the optimiser, at the first pass after that
window has passed with no such arrival, or once the candidate passes the upper bound h (F = h).

Memory: DWQ/DRQ, the pending measurements, the arrivals of the past hour and the optimiser's observations are
one frozen `LazerMemory`, engine state (`Remember`), so a new policy object (a restart, a new leader) carries on
from it. The policy keeps a working copy of the optimiser (rebuilt from the memory whenever it is not the one
it wrote) and asks for GP fits with `RequestFit`; the fitted model comes back as `view.model`. For a journal
the memory is JSON text (`encode_memory` / `decode_memory`); restored, the model is fitted again and the
deferrals' ends come back as timers (`next_timer`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace

from meshsched.policies.base import ClusterView, Cycle, Decision, Defer, Evict, Remember, RequestFit, Start, Trigger, Wait
from meshsched.policies.lazer_opt import (
    DeferralContext, DeferralOptimizer, Observation, OptimizerConfig, OptimizerState, fit_model, ideal_step,
    mean_interarrival, objective,
)
from meshsched.policies.lazer_room import room_with_partners
from meshsched.policies.placement import Unplaced
from meshsched.policies.queue import ShortestRemaining
from meshsched.policies.sharing_scheduler import SharingScheduler
from meshsched.state import Job, JobState

HOUR_S = 3600.0
LOADING_MODES = ("preempt", "spare", "last", "spare-reloads")


@dataclass(frozen=True, slots=True)
class Deferral:
    """j_new in the deferred-wait queue until `until`; `victims` (J_r) in the deferred-run queue meanwhile."""

    job_id: str
    until: float
    victims: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PendingMeasure:
    """A prediction made at `at` whose F is not known yet."""

    at: float
    job_id: str
    remaining_s: float  # j_new's remaining time at `at`: a shorter newcomer makes its load futile
    context: DeferralContext
    x: float
    candidate: float = 0.0  # the smallest deferral that avoided every shorter arrival so far (`ideal_step`)

    @property
    def window_end(self) -> float:
        """When the candidate's load window ends (after it, F = candidate)."""
        return self.at + self.candidate + self.context.max_pause_s + self.context.load_s


@dataclass(frozen=True, slots=True)
class LazerMemory:
    """Lazer's engine state."""

    optimizer: OptimizerState
    deferrals: tuple[Deferral, ...] = ()
    pending: tuple[PendingMeasure, ...] = ()
    arrivals: tuple[float, ...] = ()  # submit times in the past hour (the context's mean inter-arrival)


@dataclass(frozen=True, slots=True)
class Orchestrated:
    """Algorithm 2's answer: J_r and where j_new then fits."""

    victims: tuple[Job, ...]
    spot: list[tuple[str, int]]


class Lazer:
    """The preemption layer. `perf` gives load and pause times (the context); `config` the optimiser."""

    periodic = False
    order = ShortestRemaining()

    def __init__(self, perf, config: OptimizerConfig | None = None, name: str = "lazer", spare_loading: bool = False,
                 loading: str | None = None) -> None:
        self.name = name
        self.perf = perf
        self.config = config or OptimizerConfig()
        # what Algorithm 2 does with a candidate still loading (see orchestrate): preempt (the paper), spare or
        # last (beyond the paper)
        self.loading = loading or ("spare" if spare_loading else "preempt")
        if self.loading not in LOADING_MODES:
            raise ValueError(f"loading must be one of {', '.join(LOADING_MODES)}, not {self.loading!r}")
        self._opt = DeferralOptimizer(self.config)
        self._synced: OptimizerState | None = None  # the optimiser state this copy last wrote to the memory
        self._model: object | None = None  # the model last installed from the view
        self._asked = 0  # observations in the last fit asked for (not memory: after a restart, ask again)

    # ------------------------------------------------------------------ the layer's protocol

    @property
    def spare_loading(self) -> bool:
        return self.loading == "spare"

    def queue_key(self, job: Job) -> tuple:
        return self.order.priority(job, job.since)

    def next_timer(self, view: ClusterView, now: float) -> float | None:
        """Event-driven: only the deferrals' ends (the engine arms those it was told of by `Defer`; this names
        them again when the memory comes back without the engine's timers, as after a meshd restart)."""
        mem = view.memory
        if not isinstance(mem, LazerMemory):
            return None
        ends = [d.until for d in mem.deferrals if d.until > now and view.job(d.job_id).state.is_queued]
        return min(ends) if ends else None

    def encode_memory(self, memory: LazerMemory) -> str:
        """The memory as JSON text, for a journal; `decode_memory` gives back an equal value."""
        return json.dumps(asdict(memory), separators=(",", ":"))

    def decode_memory(self, text: str) -> LazerMemory:
        d = json.loads(text)
        o = d["optimizer"]
        obs = tuple(Observation(DeferralContext(**x["context"]), x["x"], x["f"]) for x in o["observations"])
        state = OptimizerState(obs, o["fitted_observations"], o["bootstrap_issued"], o["exploiting"])
        return LazerMemory(
            state,
            tuple(Deferral(x["job_id"], x["until"], tuple(x["victims"])) for x in d["deferrals"]),
            tuple(PendingMeasure(x["at"], x["job_id"], x["remaining_s"], DeferralContext(**x["context"]), x["x"],
                                 x["candidate"]) for x in d["pending"]),
            tuple(d["arrivals"]),
        )

    def schedule(self, view: ClusterView, cycle: Cycle, placement) -> list[Decision]:
        now = cycle.now
        mem = before = self._sync(view)
        out: list[Decision] = []
        arrived = view.job(cycle.arrived) if cycle.arrived is not None else None
        if arrived is not None:
            mem = replace(mem, arrivals=tuple(t for t in mem.arrivals if t > now - HOUR_S) + (now,))
        pending, changed = self._measure(mem.pending, arrived, now)
        if changed:
            mem = replace(mem, pending=pending)
        # deferrals that ran out (or whose job started or left): their victims go back to RQ
        live = tuple(d for d in mem.deferrals if d.until > now and view.job(d.job_id).state.is_queued)
        expired = [d for d in mem.deferrals if d not in live]
        if expired:
            mem = replace(mem, deferrals=live)
        evicted: set[str] = set()
        rescued, kept = None, mem
        if view.queue_length:
            mem, rescued = self._rescue(view, cycle, placement, mem, evicted, out)
        ours = len(out)
        if cycle.trigger is Trigger.RELEASE:
            declined = self._complete(view, cycle, placement, out)
            if ours and any(type(d) is Start and d.job_id == rescued for d in out[ours:]):
                del out[:ours]  # the sharing placement started it after all: no preemption, no deferral for it
                mem = kept
                evicted.clear()
            if declined:
                mem = self._preempt_declined(view, cycle, placement, declined - {rescued}, mem, evicted, out)
            if evicted:  # no job shares a GPU being drained for the rescued job
                out[:] = _drop_shares_on(view, out, evicted)
        started = {d.job_id for d in out} | {rescued}
        for d in sorted(expired, key=lambda d: (d.until, d.job_id)):  # Algorithm 1, lines 8-10
            job = view.job(d.job_id)
            if job.state.is_queued and job.job_id not in started:
                mem = self._consider(view, cycle, placement, job, mem, evicted, out, may_defer=False)
        if arrived is not None and arrived.state.is_queued and arrived.spec.gpus <= view.total_gpus:
            mem = self._consider(view, cycle, placement, arrived, mem, evicted, out, may_defer=True)
        if mem is not before:
            out.append(Remember(replace(mem, optimizer=self._state())))
        if self._opt.needs_fit() and len((request := self._opt.fit_request()).observations) > self._asked:
            self._asked = len(request.observations)
            out.append(RequestFit(fit_model, request))
        return out

    def _complete(self, view: ClusterView, cycle: Cycle, placement, out: list[Decision]) -> set[str]:
        """The completion handler (Algorithm 1, lines 11-17): queued jobs, shortest remaining first, start on
        what came free; nothing is preempted. A placement that shares GPUs (a SharingScheduler: Castor, sjf-ffs, ...)
        runs its own release pass over the same queue, which bounds its sharing searches per pass (Castor's
        depth): one try_start per queued job made castor+lazer+gimbal's release passes 90 % of a busy-window
        replay (80,000 sharing searches for 500 jobs, issue 26). Returns the jobs that placement declined because
        preempting longer jobs beats sharing (Castor under this layer, `_preempt_declined`)."""
        declined: set[str] = set()
        if isinstance(placement, SharingScheduler):
            out.extend(placement.place(view, cycle, rather_preempt=declined))
            return declined
        # a monotone placement that failed N GPUs fails every larger job on as many nodes (`Unplaced`)
        no_start = Unplaced(cycle.plan.node_size, view.queued_gpu_counts(), view.total_gpus)
        for job in view.queue():
            need = job.spec.gpus
            if no_start.blocks(need):
                continue
            d = placement.try_start(view, cycle, job)
            if isinstance(d, Start):
                out.append(d)
            elif placement.monotone:
                no_start.failed(need)
                if no_start.every:
                    break
        return declined

    def _preempt_declined(self, view, cycle, placement, declined: set[str], mem: LazerMemory, evicted: set[str],
                          out: list[Decision]) -> LazerMemory:
        """Beyond the paper (issue 26): a queued job the sharing placement declined in this release pass because
        starting it alone by preempting longer jobs adds less JCT than sharing (Castor, castor_preempt) gets
        Algorithm 1's arrival handling, shortest first: Algorithm 2 on the GPUs the pass left free, deferred once
        as an arrival is. Declining without preempting made it wait instead (Sia Saturn-1: the short jobs lost
        2.2 h against srtf that way)."""
        now = cycle.now
        live = {d.job_id for d in mem.deferrals if d.until > now}
        jobs = [view.job(j) for j in declined if j not in live]
        for job in sorted((j for j in jobs if j.state.is_queued), key=lambda j: self.order.priority(j, now)):
            deferred_before = any(p.job_id == job.job_id for p in mem.pending) or job.deferred_until is not None
            mem = self._consider(view, cycle, placement, job, mem, evicted, out, may_defer=not deferred_before,
                                 pool=cycle.plan.free_map(), loading="last")
        return mem

    def _rescue(self, view, cycle, placement, mem: LazerMemory, evicted: set[str], out: list[Decision]
                ) -> tuple[LazerMemory, str | None]:
        """Beyond the paper, against starvation (issue 26): on a release, the first queued job in SRTF
        order that cannot start on what is free (the jobs before it taking theirs) gets Algorithm 1's arrival
        handling again: its spot is kept from the jobs behind it if the GPUs being paused complete it, else the
        orchestrator looks for longer-remaining jobs to preempt (deferred as on an arrival, unless it was
        deferred before). Lazer considered preemption only on arrivals, so a multi-GPU job that found only
        shorter jobs running waited while the longer 1-GPU jobs behind it took each GPU that came free: 168 h
        for a 0.04 h run on Alibaba's trace, where plain SRTF re-decides on every pass. Under a sharing placement
        (Castor) only a head that has waited longer than its remaining run time: a reservation for every blocked
        head there cost the short jobs more than it saved (Alibaba window: castor+lazer+gimbal+rubick 1.698 h
        against 1.457 h with this threshold)."""
        head, free = self._blocked_head(view, cycle, mem)
        if head is None or head.job_id == cycle.arrived:  # a newcomer: Algorithm 1's arrival handling below
            return mem, None
        if isinstance(placement, SharingScheduler) and cycle.now - head.spec.submit_time < head.remaining_time(cycle.now):
            return mem, None  # a sharing placement may still pair it: only once it has waited longer than it runs
        plan = cycle.plan
        deferral = next((d for d in mem.deferrals if d.job_id == head.job_id and d.until > cycle.now), None)
        if deferral is not None:  # its victims are held for it; keep the free GPUs beside them from the jobs behind
            gpus = view.cluster_state().gpus
            want = head.spec.gpus
            for node in sorted({gpus[g].node for v in deferral.victims for g in view.job(v).gpus}):
                if want > 0 and free.get(node, 0):
                    want -= plan.withhold(node, min(want, free[node]))
            return mem, None
        pool = dict(free)
        for node, n in view.pausing_by_node().items():
            pool[node] = pool.get(node, 0) + n
        spot = plan.compact(pool, head.spec.gpus)
        if spot is not None:  # room is coming: keep its free GPUs from the jobs behind
            for node, count in spot:
                plan.withhold(node, min(count, free.get(node, 0)))
            return mem, None
        if cycle.trigger is not Trigger.RELEASE:  # an arrival or a deferral's end: Algorithm 1 as in the paper
            return mem, None
        deferred_before = any(p.job_id == head.job_id for p in mem.pending) or head.deferred_until is not None
        mem = self._consider(view, cycle, placement, head, mem, evicted, out, may_defer=not deferred_before,
                             pool=free, loading="spare-reloads")
        return mem, head.job_id

    def _blocked_head(self, view, cycle, mem: LazerMemory) -> tuple[Job | None, dict[str, int]]:
        """The first queued job (SRTF order) that the free GPUs left by the jobs before it cannot hold (None if
        every job fits), and the free GPUs per node the jobs before it leave."""
        plan = cycle.plan
        free = plan.free_map()
        total = view.total_gpus
        for job in view.queue():
            need = job.spec.gpus
            if need > total:
                continue
            spot = plan.compact(free, need)
            if spot is None:
                return job, free
            for node, count in spot:
                free[node] -= count
        return None, free

    # ------------------------------------------------------------------ Algorithm 1 for one job

    def _consider(self, view, cycle, placement, job: Job, mem: LazerMemory, evicted: set[str], out: list[Decision],
                  may_defer: bool, pool: dict[str, int] | None = None, loading: str | None = None) -> LazerMemory:
        """`pool`: `_rescue`'s free GPUs left by the queued jobs before `job` (which cannot start on them; the
        release pass may still share it), else the plan's. `loading`: `orchestrate`'s."""
        now = cycle.now
        if pool is None:
            d = placement.try_start(view, cycle, job)
            if isinstance(d, Start):
                out.append(d)
                return mem
        held = {v for x in mem.deferrals for v in x.victims} | evicted
        found = self.orchestrate(view, cycle, job, held, pool, loading)
        if found is None:
            if not may_defer and pool is None:
                out.append(Wait(job.job_id, f"{self.name}: deferral over; no lower-priority jobs to preempt (WQ)"))
            return mem
        names = ",".join(v.job_id for v in found.victims)
        if may_defer:
            remaining = job.remaining_time(now)
            ctx = DeferralContext(
                mean_interarrival(mem.arrivals, now, HOUR_S), remaining, self._load(job),
                max(self._pause(v) for v in found.victims),
            )
            s = self._opt.decide(ctx)
            mem = replace(mem, pending=mem.pending + (PendingMeasure(now, job.job_id, remaining, ctx, s.x),))
            if s.x > 0.0:
                until = now + s.x
                mem = replace(mem, deferrals=mem.deferrals + (Deferral(job.job_id, until, tuple(v.job_id for v in found.victims)),))
                out.append(Defer(job.job_id, until, f"Deferred ({self.name}: preempting {names} in {s.x:.0f}s, "
                                                    f"X from the {s.stage.value} stage)"))
                if pool is not None:  # `_rescue`: the spot's free GPUs wait with it (not taken by the jobs behind)
                    for node, count in found.spot:
                        cycle.plan.withhold(node, min(count, pool.get(node, 0)))
                return mem
        for v in found.victims:
            evicted.add(v.job_id)
            out.append(Evict(v.job_id, f"{self.name}: preempted for {job.job_id}"))
        for node, count in found.spot:  # hold the spot's free GPUs for j_new; the rest come from the victims
            cycle.plan.withhold(node, count if pool is None else min(count, pool.get(node, 0)))
        return mem

    def orchestrate(self, view: ClusterView, cycle: Cycle, job: Job, held: set[str],
                    pool: dict[str, int] | None = None, loading: str | None = None) -> Orchestrated | None:
        """Algorithm 2: running jobs (not pausing, not in `held`: DRQ or already evicted) with a strictly longer
        remaining time than `job`, longest first, until they and the free GPUs make a compact spot for it;
        only those on the spot are J_r. None if no such set exists. Beyond the paper: preempting a job still
        loading is by definition a futile preemption (Eq. 2), which the paper's orchestrator allows and only the
        deferral avoids; with `loading=spare` such a job is no candidate; with `last` it is taken only when the
        others do not suffice, and so is, before it, a running job that has not yet trained for as long as its
        load took (preempting it right after its load throws that load away as surely, though Eq. 2 does not
        count it: without this tier the waste moves just past the load's end, measured). `loading` overrides the
        mode for one call (a release's preemptions: `_rescue` spares, `_preempt_declined` takes them last)."""
        now = cycle.now
        prio = self.order.priority(job, now)
        ranked = [(p, j) for p, j in cycle.worst_first(self.order) if j.job_id not in held]
        if pool is not None:  # `_rescue`: no job whose state changed at this instant (no preempt-restart cycle)
            ranked = [(p, j) for p, j in ranked if j.since < now]
        mode = loading or self.loading
        if mode != "preempt":
            still = JobState.LOADING
            eligible = [(p, j) for p, j in ranked if p[0] > prio[0]]  # Algorithm 2's preemption condition
            if mode == "spare":
                ranked = [(p, j) for p, j in eligible if j.state is not still]
            else:  # last: those whose load has paid off first, then the others, then the loading ones
                if mode == "spare-reloads":  # ... but never one loading again after a preemption
                    eligible = [(p, j) for p, j in eligible if j.state is not still or j.restarts < 2]
                tiers: tuple[list, list, list] = ([], [], [])
                for p, j in eligible:
                    tiers[2 if j.state is still else 0 if now - j.since >= self._load(j) else 1].append((p, j))
                ranked = tiers[0] + tiers[1] + tiers[2]
        free = cycle.plan.free_map() if pool is None else dict(pool)
        spot, chosen = room_with_partners(view, cycle.plan, free, job.spec.gpus, prio, ranked, held)
        if spot is None:
            return None
        on_spot = {node for node, _ in spot}
        gpus = view.cluster_state().gpus
        ids = {v.job_id for v in chosen}  # a victim whose every GPU keeps a partner frees nothing: not taken
        victims = [v for v in chosen if any(gpus[g].node in on_spot and ids.issuperset(gpus[g].jobs) for g in v.gpus)]
        return Orchestrated(tuple(victims), spot) if victims else None

    # ------------------------------------------------------------------ F measurements (Eq. 2)

    def _measure(self, pending: tuple[PendingMeasure, ...], arrived: Job | None, now: float
                 ) -> tuple[tuple[PendingMeasure, ...], bool]:
        keep, changed = [], False
        shorter = arrived.remaining_time(now) if arrived is not None else math.inf
        high = self.config.high_s
        for p in pending:
            if now > p.window_end:
                f = p.candidate  # no shorter job came while j_new would have paused its victims and loaded
            elif shorter < p.remaining_s and arrived.job_id != p.job_id:
                c = ideal_step(p.candidate, now - p.at, p.context.max_pause_s, p.context.load_s)
                if c <= high:
                    keep.append(replace(p, candidate=c) if c != p.candidate else p)
                    changed = changed or c != p.candidate
                    continue
                f = high  # no deferral within [0, h] avoids the arrivals: h is the closest
            else:
                keep.append(p)
                continue
            self._opt.observe(p.context, p.x, objective(p.x, f))
            changed = True
        return (tuple(keep) if changed else pending), changed

    # ------------------------------------------------------------------ memory

    def _sync(self, view: ClusterView) -> LazerMemory:
        mem = view.memory if isinstance(view.memory, LazerMemory) else None
        state = mem.optimizer if mem is not None else None
        if state is not self._synced:  # written by another policy object (restart, new leader): carry on from it
            self._opt = (DeferralOptimizer(self.config) if state is None
                         else DeferralOptimizer.restore(self.config, state, fit=False))
            self._synced, self._model, self._asked = state, None, 0
        model = view.model
        if model is not None and model is not self._model:
            self._model = model
            self._opt.install(model)
        return mem if mem is not None else LazerMemory(self._opt.state())

    def _state(self) -> OptimizerState:
        self._synced = self._opt.state()
        return self._synced

    def _load(self, job: Job) -> float:
        return _overhead(self.perf, "load_time", job.spec.model)

    def _pause(self, job: Job) -> float:
        # a job still loading has nothing new to save: it stops at once
        return 0.0 if job.state is JobState.LOADING else _overhead(self.perf, "pause_time", job.spec.model)


def _drop_shares_on(view: ClusterView, out: list[Decision], evicted: set[str]) -> list[Decision]:
    """`out` without the Starts that share a GPU with a job evicted in this pass (its GPUs are drained for
    another: a partner there would be preempted at the next pass, and the evicted job could take its place back)."""
    drained = {g for v in evicted for g in view.job(v).gpus}
    return [d for d in out if type(d) is not Start or drained.isdisjoint(d.gpus)]


def _overhead(perf, what: str, model: str) -> float:
    if perf is None:
        return 0.0
    try:
        return float(getattr(perf, what)(model))
    except KeyError:  # UnknownProfile: a model with no measured overheads (a user's script)
        return 0.0
