"""The GPU-sharing policies' common pass (`SharingScheduler`): SJF on free GPUs, the subclass's `_share` when
they are short, and what every sharing policy needs (who may pair, when a waiting job would start: `Forecast`).

The sharing policies walk the queue shortest expected remaining time first (no preemption) and start a job on
free GPUs (fewest nodes) when it fits, exactly as `sjf` does. They differ in what happens when free GPUs are
short; then a job may share GPUs that hold exactly one job (never more than two jobs per GPU); on a cluster that
shares through MPS among several users (`one_user`), only a job of the same user (`SharingScheduler.foreign`
says who may not pair). Castor is in castor.py, the SJF-FFS and Lucid-like baselines in sharing_baselines.py.

On an arrival only the newcomer gets the sharing search (nothing was freed since the last pass); on a
release, the first SHARE_SEARCH_DEPTH queued jobs that do not fit on free GPUs do.

Estimates a policy can make: a running job's remaining iterations are extrapolated from its last progress
report at its reported step time (meshd: the SDK's reports; the simulator reports whenever it re-rates a job,
so a job slowed by its partner is extrapolated at its shared rate), else from the engine's solo estimate. Every
sharing start is recorded in `share_log` with the predicted JCT of the wait-instead alternative (the numerator
of Castor's sharing benefit, eq. 24).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from meshsched.perf.interference import Interference
from meshsched.perf.model import PerfModel
from meshsched.perf.placement import ideal_placement
from meshsched.policies.abilities import Prefills, can
from meshsched.policies.base import ClusterView, Cycle, Decision, Start, Trigger, Wait
from meshsched.policies.castor_occupancy import FollowingOccupancy
from meshsched.policies.occupancy import Host, Occupancy
from meshsched.policies.placement import Planner
from meshsched.state import ClusterState, Job

# On a release, at most this many queued jobs (the first in SJF order that do not fit on free GPUs) get the
# sharing search; the rest had theirs when they arrived and get it again as they move up the queue.
# A bound on the pass's cost under a backlog of thousands (castor.txt searches every pending job).
SHARE_SEARCH_DEPTH = 64


@dataclass(frozen=True, slots=True)
class ShareRecord:
    job_id: str
    start: float  # when the sharing start was decided
    wait_jct_from_start: float  # predicted time from `start` to completion had it waited for free GPUs
    shared_jct_from_start: float  # predicted time from `start` to completion when sharing
    partners: tuple[str, ...]


class SharingPass:
    """One scheduling pass's scratch (kept in `Cycle.scratch`): what the sharing search computes once per pass."""

    __slots__ = ("state", "cycle", "plan", "now", "claimed", "hosts", "ahead", "table", "forecast", "by_size",
                 "upcoming", "rest", "total", "lookahead", "judged", "usable", "foreign", "preempting",
                 "rather_preempt")

    def __init__(self, state: ClusterState, cycle: Cycle) -> None:
        self.state = state
        self.cycle = cycle
        self.plan: Planner = cycle.plan
        self.now = cycle.now
        self.claimed: set[int] = set()  # single-job GPUs given to a sharer in this pass
        self.hosts: list[Host] | None = None
        self.ahead = 0  # GPU demand queued before the job being judged (started or not)
        self.table = None  # Castor: its castor_tables.HostTable
        self.forecast: Forecast | None = None
        self.by_size: dict | None = None  # Lucid: hosts by GPU count
        # The walk of the queue (`SharingScheduler.place`): jobs looked at ahead of the walk, the rest of it,
        # how many of the next jobs a sharing search may be judged for at once (0: one at a time).
        self.upcoming: deque[Job] = deque()
        self.rest: Iterator[Job] = iter(())
        self.total = 0
        self.lookahead = 0
        self.judged: dict[str, object] = {}  # Castor: job -> its sharing arithmetic (`Castor._judge`)
        self.usable: dict[tuple, object] = {}  # SJF-FFS: shareable GPUs per kind of job (`SjfFfs._usable`)
        self.foreign: dict[str, np.ndarray | None] = {}  # one_user: per user, the hosts it may not pair with
        # `try_start` for a preemption layer that evicts longer jobs for this one when it is declined: the job
        # being searched may start now that way too (Castor weighs it, castor_preempt)
        self.preempting = False
        # `place(rather_preempt=...)`: a release pass under a layer that preempts for the jobs named here, the jobs
        # whose sharing search found preempting better than sharing (`preempting` is then on for every search)
        self.rather_preempt: set[str] | None = None

    def walk(self, queue: Iterator[Job]) -> Iterator[Job]:
        """The queue in order; `peek` may have pulled some of it ahead."""
        self.rest = queue
        upcoming = self.upcoming
        while True:
            if upcoming:
                yield upcoming.popleft()
            else:
                job = next(queue, None)
                if job is None:
                    return
                yield job

    def peek(self, n: int) -> deque[Job]:
        """The next (up to) `n` jobs of the walk after the current one, without consuming them."""
        upcoming = self.upcoming
        while len(upcoming) < n:
            job = next(self.rest, None)
            if job is None:
                break
            upcoming.append(job)
        return upcoming


@dataclass
class SharingScheduler:
    """SJF on free GPUs; what to do when they are short is the subclass's `_share`."""

    name: str = "sharing"
    perf: PerfModel | None = None  # handed in: PolicyHandle
    interference: Interference | None = None
    depth: int = 0  # release passes: queued jobs given the sharing search (0: SHARE_SEARCH_DEPTH)
    share_log: dict[str, ShareRecord] = field(default_factory=dict, repr=False)
    _prefilled: set = field(default_factory=set, repr=False)
    _occ: Occupancy | None = field(default=None, repr=False)
    _shapes: dict = field(default_factory=dict, repr=False)  # Lucid: hosts by size, for the current hosts
    _shapes_at: tuple | None = field(default=None, repr=False)
    one_user: bool = False  # MPS among several users: pair only jobs of one user (PolicyHandle.one_user_per_gpu)
    periodic = False
    monotone = False  # a job that cannot start on free GPUs may still share

    def __post_init__(self) -> None:
        if self.perf is None or self.interference is None:
            raise ValueError(f"{self.name} needs the performance model and the interference predictor "
                             "(build it with make_policy, which hands them in)")
        self.depth = self.depth or SHARE_SEARCH_DEPTH

    # -- protocol ----------------------------------------------------------------------------------------
    def queue_key(self, job: Job) -> tuple:
        return (job.remaining_time(job.since), job.spec.submit_time)

    def place(self, view: ClusterView, cycle: Cycle, rather_preempt: set[str] | None = None) -> list[Decision]:
        """A pass over the queue: free GPUs, else a sharing search. `rather_preempt` (a release pass of a preemption
        layer that evicts longer jobs for a job added to it, lazer): each search weighs starting by preemption too,
        and a job declined because that beats sharing is added to the set."""
        if view.queue_length == 0:
            return []
        ps = self._pass(view, cycle)
        if rather_preempt is not None and cycle.trigger is not Trigger.ARRIVAL:
            ps.rather_preempt, ps.preempting = rather_preempt, True
            try:
                return self._place_all(view, cycle, ps)
            finally:
                ps.rather_preempt, ps.preempting = None, False
        return self._place_all(view, cycle, ps)

    def _place_all(self, view: ClusterView, cycle: Cycle, ps: SharingPass) -> list[Decision]:
        plan = ps.plan
        total = view.total_gpus
        out: list[Decision] = []
        no_start = total + 1
        min_need = view.min_queued_gpus
        arrival = cycle.trigger is Trigger.ARRIVAL
        newcomer_seen = not arrival
        searches = 0
        ahead = 0  # GPUs asked for by the queued jobs before `job` in this pass (started or not)
        ps.total = total
        for job in ps.walk(view.queue()):
            if arrival and not newcomer_seen and no_start <= min_need:
                # Nothing before the newcomer can start on free GPUs: skip to its sharing search.
                newcomer = view.job(view.arrived)
                if newcomer.spec.gpus <= total:
                    ps.ahead = view.demand_ahead(view.arrived)
                    d = self._share(view, ps, newcomer)
                    if d is not None:
                        out.append(d)
                break
            need = job.spec.gpus
            if need > total:
                continue
            ps.ahead, ahead = ahead, ahead + need
            if arrival and newcomer_seen and no_start <= min_need:
                break  # nothing later can start on free GPUs, and the newcomer has had its sharing search
            if job.job_id == view.arrived:
                newcomer_seen = True
            if need < no_start:
                gpus = plan.take(need) if need <= plan.free_total else None
                if gpus is not None:
                    out.append(Start(job.job_id, gpus, f"{self.name}: {need} GPU(s) free"))
                    continue
                no_start = need
            if arrival and job.job_id != view.arrived:
                continue  # nothing was freed: only the newcomer can have gained a way to share
            if not arrival:
                if searches >= self.depth:
                    if no_start <= min_need:
                        break  # nothing later can start on free GPUs or get a sharing search
                    continue
                searches += 1
                ps.lookahead = self.depth - searches  # the jobs after this one that may be searched too
            d = self._share(view, ps, job)
            if d is not None:
                out.append(d)
            if self._spent(ps, min_need):
                break  # no later job can start on free GPUs or share
        return out

    def try_start(self, view: ClusterView, cycle: Cycle, job: Job) -> Decision | None:
        """One job, for a preemption layer that owns the pass: free GPUs, else the sharing search."""
        ps = self._pass(view, cycle)
        need = job.spec.gpus
        plan = ps.plan
        gpus = plan.take(need) if need <= plan.free_total else None
        if gpus is not None:
            return Start(job.job_id, gpus, f"{self.name}: {need} GPU(s) free")
        # srtf and lazer evict for the newcomer on an arrival, for any job otherwise (a release, a deferral's end)
        ps.preempting = cycle.arrived is None or cycle.arrived == job.job_id
        try:
            return self._share(view, ps, job)
        finally:
            ps.preempting = False

    def next_timer(self, view: ClusterView, now: float) -> float | None:
        return None

    # -- helpers -----------------------------------------------------------------------------------------
    def _pass(self, view: ClusterView, cycle: Cycle) -> SharingPass:
        ps = cycle.scratch.get(self.name)
        if ps is None:
            state = view.cluster_state()  # read-only: GPU occupancy for the sharing search
            for t in state.gpu_types:
                self._prefill(t)
            ps = cycle.scratch[self.name] = SharingPass(state, cycle)
        return ps

    def _prefill(self, gpu_type: str) -> None:
        if gpu_type not in self._prefilled and can(self.interference, Prefills):
            self._prefilled.add(gpu_type)
            self.interference.prefill(gpu_type)

    def _hosts(self, view: ClusterView, ps: SharingPass) -> list[Host]:
        if ps.hosts is None:
            ps.hosts = self._occupancy(view, ps.state).hosts
        return ps.hosts

    def _occupancy(self, view: ClusterView, state) -> Occupancy:
        """Jobs holding GPUs as arrays, brought up to date with the state's change log (see `occupancy`; after a
        change the log cannot name, by re-reading only the holders that moved: `castor_occupancy`)."""
        occ = self._occ
        if occ is None or occ.state is not state:
            gpus = state.gpus

            def group(j: Job) -> tuple:
                g = gpus[j.gpus[0]]
                return (j.spec.model, self.micro_batch(j), g.gpu_type, g.memory_mb)

            self._occ = occ = FollowingOccupancy(state, view.holding(), self._solo_step, group)
        else:
            occ.refresh(view.holding())
        return occ

    @staticmethod
    def micro_batch(job: Job) -> int:
        """The per-GPU micro-batch the job trains with, or will once a Reconfigure asked for reaches it (its pending
        ExecConfig, else its ExecConfig; before any start, its whole per-GPU batch): a partner placed beside a job
        that is going back to its larger solo micro-batch must fit next to that one."""
        x = job.exec_pending or job.exec
        return x.micro_batch if x is not None else max(1, job.spec.batch_size // job.spec.gpus)

    def _remaining_iters(self, job: Job, now: float) -> float:
        return max(0.0, job.spec.iterations - job.iterations_at(now))

    def _solo_step(self, job: Job) -> float:
        return job.step_time if job.step_time > 0 else job.ideal_step_time

    def _step(self, job: Job, gpu_type: str, node_size: int, micro: int, accumulation: int) -> float:
        """Solo step time of `job` on a compact placement with micro-batch `micro` and `accumulation` steps."""
        placement = ideal_placement(job.spec.gpus, node_size)
        return self.perf.iteration_time(job.spec.model, gpu_type, placement, micro * accumulation, accumulation)

    def wait_start(self, view, ps: SharingPass, job: Job) -> float:
        """Seconds from now until `job` could start on free GPUs if it waits (see `Forecast`)."""
        if ps.forecast is None:
            ps.forecast = Forecast(self._occupancy(view, ps.state), ps.now)
        return ps.forecast.wait(job.spec.gpus, ps.ahead)

    def _record(self, view, ps: SharingPass, job: Job, partners, t_b_alone: float, shared_jct: float) -> None:
        """Log a sharing start with the JCT it would have had waiting until GPUs free up (eq. 24's numerator)."""
        now = ps.now
        wait = self.wait_start(view, ps, job) + t_b_alone * self._remaining_iters(job, now)
        self.share_log[job.job_id] = ShareRecord(job.job_id, now, wait, shared_jct, tuple(sorted(p.job_id for p in partners)))

    def _share(self, view, ps: SharingPass, job: Job) -> Decision | None:
        raise NotImplementedError

    # -- who may pair ------------------------------------------------------------------------------------
    def foreign(self, job: Job, host: Job) -> bool:
        """`job` may not share `host`'s GPUs: under `one_user` they belong to different users (an MPS server
        serves one user per GPU at a time), or a GPU fault hit the two together (`Job.may_pair`,
        meshsched.faults). Every sharing policy asks this of each partner it considers."""
        return (self.one_user and host.spec.user != job.spec.user) or not job.may_pair(host)

    def foreign_wait(self, job: Job, host: Job) -> Wait:
        """The pending reason of a job whose only partners were other users' jobs (or jobs it faulted with)."""
        if not job.may_pair(host):
            return Wait(job.job_id, f"{self.name}: would share with {host.job_id}, which a GPU fault hit with it "
                                    "(that pair is not formed again; waiting)")
        return Wait(job.job_id, f"{self.name}: would share with {host.job_id} of user {host.spec.user}, not "
                                f"{job.spec.user}; under MPS a GPU serves one user at a time (waiting)")

    def _foreign_hosts(self, view, ps: SharingPass, job: Job) -> np.ndarray | None:
        """Which of the pass's hosts (`occ.hosts`' order) `job` may not pair with; None when it may pair with all."""
        if not self.one_user and not job.avoid:
            return None
        user = job.spec.user if not job.avoid else f"job {job.job_id}"  # a job with pairs to avoid: its own mask
        if user not in ps.foreign:
            mask = np.array([self.foreign(job, h.job) for h in self._hosts(view, ps)], dtype=bool)
            ps.foreign[user] = mask if mask.any() else None
        return ps.foreign[user]

    def _spent(self, ps: SharingPass, need: int) -> bool:
        """Whether no job needing `need` GPUs or more can get any in the rest of this pass."""
        return False


def compact_nodes(pool: dict[str, int], need: int, node_size: int) -> list[str] | None:
    """Nodes that can hold `need` GPUs as compactly as free placement requires, from per-node availability."""
    if need <= node_size:
        fits = [n for n, c in pool.items() if c >= need]
        return [fits[0]] if fits else None
    want_nodes = -(-need // node_size)
    ranked = sorted(pool, key=lambda n: -pool[n])[:want_nodes]
    return ranked if sum(pool[n] for n in ranked) >= need else None


class Forecast:
    """When GPUs are predicted to come free, seconds from now: the start time of the "wait" alternative.

    A GPU comes free when the last of its jobs ends (remaining iterations x solo step time; a job saving a
    checkpoint ends now). A job needing `need` GPUs that waits cannot start before
    * some node has min(need, node size) GPUs free (ceil(need / node size) whole nodes for a larger job), and
    * `ahead + need` GPUs have come free cluster-wide, where `ahead` is what the jobs queued before it ask for
      (they are served first).
    The estimate is the later of the two: a lower bound (later arrivals and sharing slow-downs are ignored),
    so it favours waiting.
    """

    def __init__(self, occ: Occupancy, now: float) -> None:
        mat = occ.free_times(now)
        self.node_size = node_size = occ.node_size
        self.by_count = mat.min(axis=0) if len(mat) else np.full(node_size, np.inf)  # [k]: some node has k+1 free
        self.whole = np.sort(mat[:, -1])  # when each node is entirely free, earliest first
        flat = mat.ravel()
        self.flat = np.sort(flat[np.isfinite(flat)])

    def wait(self, need: int, ahead: int) -> float:
        if need <= self.node_size:
            frag = float(self.by_count[need - 1])
        else:
            k = -(-need // self.node_size)
            frag = float(self.whole[k - 1]) if k <= len(self.whole) else float("inf")
        flat = self.flat  # demand past the cluster's GPUs: the last current job's end is the bound
        queue = float(flat[min(ahead + need, len(flat)) - 1]) if len(flat) else float("inf")
        return max(frag, queue)

    def waits(self, need: np.ndarray, ahead: np.ndarray) -> np.ndarray:
        """`wait` for many jobs at once (the same numbers)."""
        ns, whole, flat = self.node_size, self.whole, self.flat
        small = self.by_count[np.minimum(need, ns) - 1]
        k = -(-need // ns)
        big = np.append(whole, np.inf)[np.minimum(k, len(whole) + 1) - 1]
        frag = np.where(need <= ns, small, big)
        if not len(flat):
            return np.maximum(frag, np.inf)
        return np.maximum(frag, flat[np.minimum(ahead + need, len(flat)) - 1])
