"""GPU-sharing policies' common pass (`SharingScheduler`) and Castor's SJF-BSBF (castor.txt Algorithm 1).

The sharing policies walk the queue shortest expected remaining time first (no preemption) and start a job on
free GPUs (fewest nodes) when it fits, exactly as `sjf` does. They differ in what happens when free GPUs are
short; then a job may share GPUs that hold exactly one job (never more than two jobs per GPU); on a cluster that
shares through MPS among several users (`one_user`), only a job of the same user (`SharingScheduler.foreign`
says who may not pair). The SJF-FFS and Lucid-like baselines are in `sharing_baselines.py`; castor:

* for each running job A whose GPUs hold only A, Algorithm 2 (`sharing.best_sub_batch`) picks the
  new job's micro-batch (gradient accumulation keeps its global batch; memory must fit next to A) and
  Theorem 1's pair arithmetic says whether starting now beats waiting. Where the paper's wait alternative
  starts the new job when A ends (kappa = t_A i_A), ours starts it when GPUs are forecast free for it
  anywhere (`_Forecast`: holders' remaining time per node, and the GPU demand queued ahead), which on a
  large cluster is usually much sooner; eq. 24's sharing benefit defines the wait the same way. The jobs
  for which sharing pays are sorted by the pair's predicted mean JCT and their GPUs taken until the job
  fits (free GPUs on the same nodes fill the rest); if no such set exists, the job waits: waiting is
  better (its pending reason says why).

On an arrival only the newcomer gets the sharing search (nothing was freed since the last pass); on a
release, the first SHARE_SEARCH_DEPTH queued jobs that do not fit on free GPUs do.

Estimates a policy can make: a running job's remaining iterations are extrapolated from its last progress
report at its reported step time (meshd: the SDK's reports; the simulator reports whenever it re-rates a job,
so a job slowed by its partner is extrapolated at its shared rate), else from the engine's solo estimate. Every sharing start is recorded in `share_log` with the predicted JCT of
the wait-instead alternative (the numerator of Castor's sharing benefit, eq. 24).

Speed: the holders' arrays (`occupancy.Occupancy`) follow the state's change log instead of being rebuilt;
xi per (new job's model and batch, sub-batch, host group) and step times per kind of new job are kept in
stacked tables (`_Kinds`); a release pass judges the queued jobs it may search next all at once, in blocks
whose arrays stay in the CPU cache (the same element-wise arithmetic, so the same numbers; a host taken in
between only drops its column), with the share-or-wait flags of every job computed together; the partner
search finds where adding partners one by one first holds the job with one count over all prefixes
(`_holding_prefix`); an arrival pass skips to the newcomer once nothing before it can start. The arithmetic
runs over the hosts still alive only (any other column is +inf); a pass stops once the free GPUs and the alive
hosts' GPUs are fewer than the smallest queued job asks for; a per-node bound on what partners could gather
(`_HostTable.gathers`) answers most "cannot hold it compactly" cases before the exact search. Decisions are
those of the one-job-at-a-time search.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from meshsched.perf.errors import UnknownProfile
from meshsched.perf.memory import pair_fits
from meshsched.perf.placement import ideal_placement
from meshsched.policies.base import ClusterView, Cycle, Decision, Start, Trigger, Wait
from meshsched.policies.occupancy import Host, Occupancy
from meshsched.policies.placement import Planner
from meshsched.policies.sharing import BatchChoice, sub_batches, theorem1
from meshsched.state import ClusterState, ExecConfig, Job

# On a release, at most this many queued jobs (the first in SJF order that do not fit on free GPUs) get the
# sharing search; the rest had theirs when they arrived and get it again as they move up the queue.
# A bound on the pass's cost under a backlog of thousands (castor.txt searches every pending job).
_CHUNK = 1 << 14  # array elements per block of jobs judged together (a block's temporaries stay in the CPU cache)
SHARE_SEARCH_DEPTH = 64  # combined busy fraction of the pair; documented assumption (see `utilisation`)


@dataclass(frozen=True, slots=True)
class ShareRecord:
    job_id: str
    start: float  # when the sharing start was decided
    wait_jct_from_start: float  # predicted time from `start` to completion had it waited for free GPUs
    shared_jct_from_start: float  # predicted time from `start` to completion when sharing
    partners: tuple[str, ...]


class SharingPass:
    """One scheduling pass's scratch (kept in `Cycle.scratch`): what the sharing search computes once per pass."""

    __slots__ = ("state", "plan", "now", "claimed", "hosts", "ahead", "table", "forecast", "by_size",
                 "upcoming", "rest", "total", "lookahead", "judged", "usable", "foreign")

    def __init__(self, state: ClusterState, cycle: Cycle) -> None:
        self.state = state
        self.plan: Planner = cycle.plan
        self.now = cycle.now
        self.claimed: set[int] = set()  # single-job GPUs given to a sharer in this pass
        self.hosts: list[Host] | None = None
        self.ahead = 0  # GPU demand queued before the job being judged (started or not)
        self.table: _HostTable | None = None
        self.forecast: _Forecast | None = None
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
    perf: object | None = None  # meshsched.perf.PerfModel (handed in: PolicyHandle)
    interference: object | None = None  # meshsched.perf.interference.Interference
    depth: int = 0  # release passes: queued jobs given the sharing search (0: SHARE_SEARCH_DEPTH)
    share_log: dict[str, ShareRecord] = field(default_factory=dict, repr=False)
    _prefilled: set = field(default_factory=set, repr=False)
    _occ: Occupancy | None = field(default=None, repr=False)
    _shapes: dict = field(default_factory=dict, repr=False)  # Lucid: hosts by size, for the current hosts
    _shapes_at: tuple | None = field(default=None, repr=False)
    _kinds: dict = field(default_factory=dict, repr=False)  # Castor: per job kind and GPU type, step times
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

    def place(self, view: ClusterView, cycle: Cycle) -> list[Decision]:
        if view.queue_length == 0:
            return []
        ps = self._pass(view, cycle)
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
        return self._share(view, ps, job)

    def next_timer(self, view: ClusterView, now: float) -> float | None:
        return None

    # -- helpers -----------------------------------------------------------------------------------------
    def _pass(self, view: ClusterView, cycle: Cycle) -> SharingPass:
        ps = cycle.scratch.get(self.name)
        if ps is None:
            state = view._state  # read-only: GPU occupancy for the sharing search  # noqa: SLF001
            for t in state.gpu_types:
                self._prefill(t)
            ps = cycle.scratch[self.name] = SharingPass(state, cycle)
        return ps

    def _prefill(self, gpu_type: str) -> None:
        prefill = getattr(self.interference, "prefill", None)
        if prefill is not None and gpu_type not in self._prefilled:
            self._prefilled.add(gpu_type)
            prefill(gpu_type)

    def _hosts(self, view: ClusterView, ps: SharingPass) -> list[Host]:
        if ps.hosts is None:
            ps.hosts = self._occupancy(view, ps.state).hosts
        return ps.hosts

    def _occupancy(self, view: ClusterView, state) -> Occupancy:
        """Jobs holding GPUs as arrays, brought up to date with the state's change log (see `occupancy`)."""
        occ = self._occ
        if occ is None or occ.state is not state:
            gpus = state.gpus

            def group(j: Job) -> tuple:
                g = gpus[j.gpus[0]]
                return (j.spec.model, self.micro_batch(j), g.gpu_type, g.memory_mb)

            self._occ = occ = Occupancy(state, view.holding(), self._solo_step, group)
        else:
            occ.refresh(view.holding())
        return occ

    @staticmethod
    def micro_batch(job: Job) -> int:
        """The per-GPU micro-batch the job trains with (its ExecConfig; before any start, its whole per-GPU batch)."""
        x = job.exec
        return x.micro_batch if x is not None else max(1, job.spec.batch_size // job.spec.gpus)

    def _remaining_iters(self, job: Job, now: float) -> float:
        return max(0.0, job.spec.iterations - job.iterations_at(now))

    def _solo_step(self, job: Job) -> float:
        return job.step_time if job.step_time > 0 else job.ideal_step_time

    def _step(self, job: Job, gpu_type: str, node_size: int, micro: int, accumulation: int) -> float:
        """Solo step time of `job` on a compact placement with micro-batch `micro` and `accumulation` steps."""
        placement = ideal_placement(job.spec.gpus, node_size)
        return self.perf.iteration_time(job.spec.model, gpu_type, placement, micro * accumulation, accumulation)

    def _pick_free(self, state, plan, node: str, count: int) -> list[int]:
        """Claim `count` free GPUs of `node` from the pass's planner (they must be there)."""
        got = plan.withhold(node, count)
        taken = plan._taken  # noqa: SLF001 - keep the planner from handing these out again
        picked = [g for g in state.nodes[node].gpus if not state.gpus[g].jobs and g not in taken][:got]
        taken.update(picked)
        return picked

    def wait_start(self, view, ps: SharingPass, job: Job) -> float:
        """Seconds from now until `job` could start on free GPUs if it waits (see `_Forecast`)."""
        if ps.forecast is None:
            ps.forecast = _Forecast(self._occupancy(view, ps.state), ps.now)
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
        serves one user per GPU at a time). Every sharing policy asks this of each partner it considers."""
        return self.one_user and host.spec.user != job.spec.user

    def foreign_wait(self, job: Job, host: Job) -> Wait:
        """The pending reason of a job whose only partners were other users' jobs."""
        return Wait(job.job_id, f"{self.name}: would share with {host.job_id} of user {host.spec.user}, not "
                                f"{job.spec.user}; under MPS a GPU serves one user at a time (waiting)")

    def _foreign_hosts(self, view, ps: SharingPass, job: Job) -> np.ndarray | None:
        """Which of the pass's hosts (`occ.hosts`' order) `job` may not pair with; None when it may pair with all."""
        if not self.one_user:
            return None
        user = job.spec.user
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


def _holding_prefix(occ: Occupancy, free: dict[str, int], order: np.ndarray, need: int, node_size: int) -> int | None:
    """How many of the candidate hosts (columns, in `order`) `_place` adds one by one, each host's single-job GPUs
    joining `free` (GPUs per node), before `_Spot` finds nodes that hold `need` GPUs compactly (at least one: it
    adds before it checks); None when all of them together cannot. A node's count only grows as hosts are added,
    so this is the first prefix passing the test, found for every prefix at once."""
    n, width = len(order), len(occ.node_gpus)
    at = np.full(len(occ.solo_of) + 1, n, dtype=np.int64)  # by a host's first GPU: its place in `order` (n: not a
    at[occ.first_gpu(order)] = np.arange(n)  # candidate; the last slot answers solo_of == -1, a GPU of no host)
    when, node = at[occ.solo_of], occ.gpu_node  # per GPU: the candidate bringing it, and its live node's row
    keep = (when < n) & (node < width)
    when, node = when[keep], node[keep]
    base = np.zeros(width, dtype=np.int64)
    row = occ.node_row
    for name, c in free.items():
        base[row[name]] += c
    if need <= node_size:  # one node: the first prefix bringing some node's (need - free)-th GPU
        short = need - base
        if (short <= 0).any():
            return 1
        if not (np.bincount(node, minlength=width) >= short).any():
            return None  # no node gets there even with every candidate
        o = np.argsort(node * (n + 1) + when)  # by node, then by the candidate bringing the GPU
        node, when = node[o], when[o]
        rank = np.arange(len(o)) - np.searchsorted(node, node)  # place among its node's GPUs, earliest first
        hit = when[rank == short[node] - 1]
        return int(hit.min()) + 1 if len(hit) else None
    # several whole nodes: the first prefix whose `want` fullest nodes add up to `need` (binary search: the
    # total only grows with the prefix)
    want = -(-need // node_size)

    def holds(k: int) -> bool:
        counts = base + np.bincount(node[when < k], minlength=width)
        return int(counts.sum() if want >= width else np.partition(counts, width - want)[width - want:].sum()) >= need

    if not holds(n):
        return None
    lo, hi = 1, n
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


class _Spot:
    """`_spot` kept up to date as GPUs are added to a pool one node at a time: the same answer, without
    rescanning every node after each addition."""

    def __init__(self, pool: dict[str, int], need: int, node_size: int) -> None:
        self.pool, self.need, self.node_size = pool, need, node_size
        self.rank = {n: r for r, n in enumerate(pool)}  # the pool's iteration order (first fit wins ties)
        if need <= node_size:
            fits = [n for n, c in pool.items() if c >= need]
            self.first = fits[0] if fits else None
        else:
            self.want = -(-need // node_size)
            self.hist: dict[int, int] = {}
            for c in pool.values():
                self.hist[c] = self.hist.get(c, 0) + 1

    def add(self, node: str, count: int) -> None:
        pool = self.pool
        old = pool.get(node)
        new = pool[node] = (old or 0) + count
        if old is None:
            self.rank[node] = len(self.rank)
        if self.need <= self.node_size:
            if new >= self.need and (self.first is None or self.rank[node] < self.rank[self.first]):
                self.first = node
        else:
            hist = self.hist
            if old is not None:
                hist[old] -= 1
            hist[new] = hist.get(new, 0) + 1

    def nodes(self) -> list[str] | None:
        if self.need <= self.node_size:
            return None if self.first is None else [self.first]
        left, total = self.want, 0
        for c in sorted(self.hist, reverse=True):
            n = min(left, self.hist[c])
            total += n * c
            left -= n
            if not left:
                break
        return compact_nodes(self.pool, self.need, self.node_size) if total >= self.need else None


class _HostTable:
    """The pass's view of the single-job hosts (`occ.hosts`, one column each for the vectorised Algorithm 2):
    their solo step time and remaining iterations now, and which are still free to take a sharer."""

    def __init__(self, occ: Occupancy, now: float) -> None:
        self.occ = occ
        rows = occ.host_rows
        self.code = occ.host_code
        self.ta = occ.solo[rows]
        self.ia = occ.remaining_iters(now)[rows]
        self.end_a = self.ta * self.ia  # A's end if B waits
        self.alive = self.ia > 0
        self.free_single = int(occ.host_gpus[self.alive].sum())
        self.claims = 0  # hosts taken in this pass so far
        self._room: tuple[list[int], int, int] | None = None  # `gathers`: per-node counts, most first, and
        # the free and single GPUs when counted

    def gathers(self, plan: Planner, need: int) -> bool:
        """False when no node (no ceil(need / node size) whole nodes) holds `need` GPUs even counting every free
        GPU and every GPU of a host still alive: no set of partners can then hold the job. True: it may. The
        per-node counts are kept, and recounted only when the GPUs taken since could have made the difference
        (taking k GPUs lowers the sum of the fullest nodes by at most k)."""
        want = -(-need // plan.node_size)
        if self._room is not None:
            room, free, single = self._room
            have = sum(room[:want])
            if have < need:
                return False  # (the counts only shrink in a pass)
            if have - (free - plan.free_total) - (single - self.free_single) >= need:
                return True
        occ = self.occ
        width = len(occ.node_gpus)
        alive = np.zeros(len(occ.solo_of) + 1, dtype=bool)  # by a host's first GPU (the last slot: no host)
        alive[occ.first_gpu(np.flatnonzero(self.alive))] = True
        per = np.bincount(occ.gpu_node[alive[occ.solo_of]], minlength=width + 1)[:width]
        row = occ.node_row
        for name, c in plan.free_map().items():
            per[row[name]] += c
        room = sorted(per.tolist(), reverse=True)
        self._room = (room, plan.free_total, self.free_single)
        return sum(room[:want]) >= need

    def host_type(self, i: int) -> str:
        return self.occ.type_names[self.code[i]]

    def claim(self, i: int) -> None:
        if self.alive[i]:
            self.alive[i] = False
            self.free_single -= int(self.occ.host_gpus[i])
            self.claims += 1


class _Kinds:
    """Algorithm 2's inputs for every kind of new job B seen so far, stacked so that a pass judges all its jobs
    with one set of array operations. Per B's (model, per-GPU batch): xi_A and xi_B at each of its sub-batches
    next to each host group of the occupancy (`occ.groups`), NaN where the pair does not fit in memory or is
    infeasible, filled in as groups appear (they only grow). Per kind (model, GPUs, per-GPU batch): B's solo step
    time at each sub-batch on each GPU type, NaN without a profile. Rows are sub-batches, largest first; rows
    past a kind's last sub-batch are NaN, so they only ever yield +inf."""

    def __init__(self, occ: Occupancy, node_size: int) -> None:
        self.occ, self.node_size, self.types = occ, node_size, list(occ.type_names)
        self.rows = 1
        self.xi_ids: dict[tuple, int] = {}  # (model, per-GPU batch) -> index into xa, xb
        self.filled: list[int] = []  # per xi id: groups filled in so far
        self.xa = np.full((0, 1, 8), np.nan)  # (xi id, sub-batch, group), groups with spare room
        self.xb = self.xa.copy()
        self.ids: dict[tuple, int] = {}  # kind -> kind id
        self.kid_of: dict[str, int] = {}  # job id -> kind id (the policy's: a job's kind never changes)
        self.nsubs: list[int] = []  # per kind id: how many sub-batches
        self.subs: list[list[int]] = []  # per kind id: its sub-batches
        self.xi_of: list[int] = []  # per kind id: its xi id
        self.models: list[str] = []  # per kind id: B's model
        self.t_alone: list[dict[str, float]] = []  # per kind id: B's step time at its full batch, per profiled type
        self.tb = np.full((0, 1, len(self.types)), np.nan)  # (kind id, sub-batch, GPU type)
        self.profiled = np.zeros((0, len(self.types)), dtype=bool)

    def fits(self, occ: Occupancy, node_size: int) -> bool:
        return occ is self.occ and node_size == self.node_size and occ.type_names == self.types

    def _pad_rows(self, rows: int) -> None:
        if rows > self.rows:
            def pad(a):
                return np.concatenate([a, np.full((a.shape[0], rows - self.rows, a.shape[2]), np.nan)], axis=1)
            self.xa, self.xb, self.tb, self.rows = pad(self.xa), pad(self.xb), pad(self.tb), rows

    def kind(self, policy: Castor, job: Job, per_gpu: int) -> int:
        key = (job.spec.model, job.spec.gpus, per_gpu)
        kid = self.ids.get(key)
        if kid is not None:
            return kid
        subs = sub_batches(per_gpu)
        self._pad_rows(len(subs))
        xkey = (job.spec.model, per_gpu)
        xid = self.xi_ids.get(xkey)
        if xid is None:
            xid = self.xi_ids[xkey] = len(self.filled)
            self.filled.append(0)
            blank = np.full((1,) + self.xa.shape[1:], np.nan)
            self.xa, self.xb = np.concatenate([self.xa, blank]), np.concatenate([self.xb, blank])
        tb = np.full((1, self.rows, len(self.types)), np.nan)
        profiled = np.zeros((1, len(self.types)), dtype=bool)
        t_alone = {}
        for c, t in enumerate(self.types):
            steps = policy._steps(job, per_gpu, self.node_size, t)  # noqa: SLF001
            if steps is not None:
                tb[0, : len(subs), c] = [steps[b] for b in subs]
                profiled[0, c] = True
                t_alone[t] = steps[per_gpu]
        kid = self.ids[key] = len(self.subs)
        self.subs.append(subs)
        self.nsubs.append(len(subs))
        self.xi_of.append(xid)
        self.models.append(job.spec.model)
        self.t_alone.append(t_alone)
        self.tb = np.concatenate([self.tb, tb])
        self.profiled = np.concatenate([self.profiled, profiled])
        return kid

    def fill(self, policy: Castor, kids) -> None:
        """Bring the xi of these kinds up to the occupancy's groups."""
        groups = self.occ.groups
        if len(groups) > self.xa.shape[2]:
            more = max(len(groups), 2 * self.xa.shape[2]) - self.xa.shape[2]
            blank = np.full(self.xa.shape[:2] + (more,), np.nan)
            self.xa, self.xb = np.concatenate([self.xa, blank], axis=2), np.concatenate([self.xb, blank], axis=2)
        inter = policy.interference
        for kid in kids:
            xid = self.xi_of[kid]
            have = self.filled[xid]
            if have == len(groups):
                continue
            model_b = self.models[kid]
            for r, b in enumerate(self.subs[kid]):
                for gi in range(have, len(groups)):
                    ma, mia, gt, gmem = groups[gi]
                    if pair_fits(ma, mia, model_b, b, gmem):
                        x = inter.xi(ma, mia, model_b, b, gt)
                        if x is not None:
                            self.xa[xid, r, gi], self.xb[xid, r, gi] = x
            self.filled[xid] = len(groups)


class _Forecast:
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


class _Judged:
    """A block of queued jobs' sharing arithmetic in a pass (`Castor._judge`), one row per job (a job's judgement
    is the block and its row): the arrays whose last axis is the host columns `cols` (those alive when judged),
    the pair's best mean JCT and the wait alternative's per host (every column), and what `_share` decides on
    while no host was taken."""

    __slots__ = ("kinds", "kind", "i_b", "start_b", "cols", "xa", "xb", "sums", "best", "wait", "claims", "pays",
                 "any_p", "low", "count")

    def __init__(self, kinds, kind, i_b, start_b, cols, xa, xb, sums, best, wait, claims, pays, any_p, low,
                 count) -> None:
        self.kinds, self.kind, self.i_b, self.start_b, self.cols = kinds, kind, i_b, start_b, cols
        self.xa, self.xb, self.sums, self.best, self.wait = xa, xb, sums, best, wait
        self.claims, self.pays, self.any_p, self.low, self.count = claims, pays, any_p, low, count


@dataclass
class Castor(SharingScheduler):
    """SJF-BSBF: share only where Algorithm 2 / Theorem 1 say the pair's mean JCT beats waiting.

    On an arrival only the newcomer is considered for sharing (nothing was freed, and every other queued
    job was already judged against the same hosts at the last pass); on a release, every queued job that
    does not fit on free GPUs is, in queue order. Algorithm 2 runs vectorised over all hosts at once
    (`sharing.best_sub_batch` is the scalar reference; tests check they agree). On a cluster of mixed GPUs
    each host is judged on its own GPU type and memory, and a job's GPUs are all of one type.
    """

    name: str = "castor"
    _kt: _Kinds | None = field(default=None, repr=False)

    def _steps(self, job: Job, per_gpu: int, node_size: int, gpu_type: str) -> dict[int, float] | None:
        """B's solo step time on `gpu_type` at each sub-batch b (with per_gpu / b accumulation steps), None
        when B has no profile there; kept per job kind."""
        key = (job.spec.model, job.spec.gpus, per_gpu, node_size, gpu_type)
        hit = self._kinds.get(key, self._kinds)
        if hit is self._kinds:
            try:
                hit = {b: self._step(job, gpu_type, node_size, b, per_gpu // b) for b in sub_batches(per_gpu)}
            except (UnknownProfile, ValueError):
                hit = None
            self._kinds[key] = hit
        return hit

    def _share(self, view, ps, job):
        if ps.table is None:
            ps.table = _HostTable(self._occupancy(view, ps.state), ps.now)
        tab = ps.table
        plan = ps.plan
        need = job.spec.gpus
        if plan.free_total + tab.free_single < need:
            return None
        out = ps.judged.get(job.job_id, ps)
        if out is ps:
            self._judge(view, ps, job)
            out = ps.judged[job.job_id]
        if out is None or isinstance(out, Wait):
            return out
        blk, j = out
        best, wait = blk.best[j], blk.wait[j]
        foreign = self._foreign_hosts(view, ps, job)
        if blk.claims == tab.claims and foreign is None:
            pays, low, count = blk.pays[j] if blk.any_p[j] else None, blk.low[j], blk.count[j]
        else:  # hosts taken since the judgement are out; every other column's numbers stand (they are per column)
            feasible = np.isfinite(best) & tab.alive
            if foreign is not None and feasible.any():  # other users' hosts are out too
                mine = feasible & ~foreign
                if not mine.any():
                    return self.foreign_wait(job, tab.occ.host(int(np.argmax(feasible))).job)
                feasible = mine
            if not feasible.any():
                return None
            pays = feasible & (best < wait)
            if not pays.any():
                pays, low, count = None, int(np.argmin(np.where(feasible, best, np.inf))), int(feasible.sum())
        if pays is None:
            return Wait(job.job_id, f"{self.name}: waiting beats sharing (pair mean JCT {wait[low]:.0f}s waiting "
                                    f"{blk.start_b[j]:.0f}s vs {best[low]:.0f}s shared, best of {count} partners)")
        idx = np.flatnonzero(pays)
        if not tab.gathers(plan, need):
            if len(ps.state.gpu_types) > 1:  # (`_place` counts the partners of the best one's GPU type)
                code = tab.code
                idx = idx[code[idx] == code[idx[np.argmin(best[idx])]]]
            return self._no_fit(job, len(idx))
        per_gpu = max(1, job.spec.batch_size // need)
        order = idx[np.lexsort((idx, best[idx]))]  # columns, best pair first (ties: lowest host first)
        ta, ia, node_size, i_b = tab.ta, tab.ia, plan.node_size, blk.i_b[j]
        kt, kind = blk.kinds, blk.kind[j]
        subs, t_alone = kt.subs[kind], kt.t_alone[kind]

        def choice(c: int) -> BatchChoice:
            k = int(np.searchsorted(blk.cols, c))  # the column among those judged
            r = int(np.argmin(blk.sums[j, :, k]))  # the first (largest) sub-batch among equals (Algorithm 2's "<")
            b = subs[r]
            t = tab.host_type(c)
            xa, xb = float(blk.xa[j, r, k]), float(blk.xb[j, r, k])
            t_b = self._step(job, t, node_size, b, per_gpu // b)
            o = theorem1(float(ta[c]), float(ia[c]), xa, t_b, i_b, xb, t_alone[t])
            return BatchChoice(True, b, per_gpu // b, xa, xb, o)

        return self._place(view, ps, job, order, choice, per_gpu, t_alone)

    def _spent(self, ps: SharingPass, need: int) -> bool:
        tab = ps.table  # free GPUs and those of hosts still alive: what a job can start on, or share (`_share`)
        return tab is not None and ps.plan.free_total + tab.free_single < need

    def _kind_table(self, ps: SharingPass) -> _Kinds:
        occ, node_size = ps.table.occ, ps.plan.node_size
        kt = self._kt
        if kt is None or not kt.fits(occ, node_size):
            kt = self._kt = _Kinds(occ, node_size)
        return kt

    def _judge(self, view, ps: SharingPass, job: Job) -> None:
        """Algorithm 1's arithmetic for `job` and, on a release pass, for the queued jobs the walk may search
        next (`SharingPass.lookahead`), all at once: the same operations element by element as one job at a
        time, so the same numbers. Each outcome: None (no host can take it), a Wait (no profile to judge), or a
        (`_Judged` block, row) that `_share` decides on with the hosts still free when the job's turn comes (a
        host taken in between only drops its own column)."""
        tab = ps.table
        jobs, aheads = [job], [ps.ahead]
        if ps.lookahead:
            a = ps.ahead + job.spec.gpus
            room = ps.plan.free_total + tab.free_single  # only shrinks in a pass: a job needing more gets no search
            for j in ps.peek(ps.lookahead):
                need = j.spec.gpus
                if need <= ps.total:
                    if need <= room and j.job_id not in ps.judged:
                        jobs.append(j)
                        aheads.append(a)
                    a += need
        now, judged = ps.now, ps.judged
        if ps.forecast is None:
            ps.forecast = _Forecast(self._occupancy(view, ps.state), now)
        forecast = ps.forecast
        kt = self._kind_table(ps)
        present = np.zeros(len(kt.types), dtype=bool)
        present[tab.code] = True  # GPU types among the hosts
        usable = (kt.profiled & present).any(axis=1).tolist()  # per kind id seen so far: profiled on some host's type
        kids, rows, i_bs, needs, kept, kept_ahead = [], [], [], [], [], []
        kid_of, nsubs = kt.kid_of, kt.nsubs
        for n, j in enumerate(jobs):
            spec = j.spec
            kid = kid_of.get(spec.job_id)
            if kid is None:
                kid = kid_of[spec.job_id] = kt.kind(self, j, max(1, spec.batch_size // spec.gpus))
            if not (usable[kid] if kid < len(usable) else (kt.profiled[kid] & present).any()):
                judged[j.job_id] = Wait(j.job_id, f"{self.name}: no profile to judge sharing; waiting for free GPUs")
                continue
            kids.append(kid)
            rows.append(nsubs[kid])
            i_bs.append(max(0.0, spec.iterations - j.iterations_at(now)))  # (`_remaining_iters`)
            needs.append(spec.gpus)
            kept.append(j)
            kept_ahead.append(aheads[n])
        if not kids:
            return
        # Waiting: A runs alone; B starts when enough GPUs are forecast free for it (`_Forecast`; Theorem 1's
        # kappa = t_A i_A assumes that is when A ends), then runs alone at its full batch.
        start_b = forecast.waits(np.array(needs), np.array(kept_ahead)).tolist()
        kt.fill(self, set(kids))
        k = np.array(kids)
        xid = np.array(kt.xi_of)[k]
        code = tab.code
        # Only the hosts still alive (not done, not taken) get the arithmetic, `cols` of all the columns: any other
        # column's best is +inf whatever its numbers (about half the hosts of a busy pass have no work left).
        cols = np.flatnonzero(tab.alive)
        gidx, code_c, ta, ia = tab.occ.host_group[cols], code[cols], tab.ta[cols], tab.ia[cols]
        i_b = np.array(i_bs)[:, None]
        n, claims = len(kids), tab.claims
        step = max(1, _CHUNK // (max(rows) * max(1, len(cols))))  # jobs per block of arrays that stays in cache
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            r = max(rows[lo:hi])
            kc = k[lo:hi]
            xa = np.take(kt.xa[xid[lo:hi], :r], gidx, axis=2)  # (jobs, sub-batches, alive hosts)
            xb = np.take(kt.xb[xid[lo:hi], :r], gidx, axis=2)
            masked = np.isnan(xa)
            if len(kt.types) == 1:  # (every job here is profiled on the one type)
                t_b, t_b_alone = kt.tb[kc, :r, :], kt.tb[kc, :1, 0]
            else:
                off = ~kt.profiled[kc][:, code_c]  # hosts of a type B has no profile on cannot take it
                if off.any():
                    masked |= off[:, None, :]
                t_b, t_b_alone = kt.tb[kc, :r][:, :, code_c], kt.tb[kc, 0][:, code]
            ib = i_b[lo:hi]
            best = np.full((hi - lo, len(code)), np.inf)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                sums = self._pair_sums(ta, ia, xa, xb, t_b, ib[:, :, None], masked)
                best[:, cols] = (sums[:, 0, :] if r == 1 else sums.min(axis=1)) / 2
                wait = (tab.end_a + np.array(start_b[lo:hi])[:, None] + t_b_alone * ib) / 2
                feasible = np.isfinite(best)
                pays = feasible & (best < wait)
            any_f, any_p = feasible.any(axis=1).tolist(), pays.any(axis=1).tolist()
            low = np.where(feasible, best, np.inf).argmin(axis=1).tolist()
            count = feasible.sum(axis=1).tolist()
            blk = _Judged(kt, kids[lo:hi], i_bs[lo:hi], start_b[lo:hi], cols, xa, xb, sums, best, wait, claims, pays,
                          any_p, low, count)
            for c, f in enumerate(any_f):
                judged[kept[lo + c].job_id] = (blk, c) if f else None

    @staticmethod
    def _pair_sums(ta, ia, xa, xb, t_b, i_b, masked) -> np.ndarray:
        """Twice the pair's mean JCT (Theorem 1 at kappa = 0: B starts now) per (job, sub-batch, host), +inf where
        the pair cannot share; eq. 16-17 where B finishes first, eq. 20-21 where A does. `ta`, `ia`: the hosts'.
        (Called with numpy's divide, invalid and overflow warnings off.)"""
        ha, hb = ta * xa, t_b * xb  # shared step times (eq. 14-15)
        ta2 = ha * ia  # A's end when it finishes first
        q = ta2 / hb  # B's iterations by then
        tb1 = hb * i_b  # B's end when it finishes first
        first_b = ta2 >= tb1
        x = tb1 / ha
        np.subtract(ia, x, out=x)
        np.multiply(ta, x, out=x)
        np.add(tb1, x, out=x)  # A's end when B finishes first
        np.add(x, tb1, out=x)
        y = i_b - q
        np.multiply(t_b, y, out=y)
        np.add(ta2, y, out=y)  # B's end when A finishes first
        np.add(ta2, y, out=y)
        np.copyto(y, x, where=first_b)
        np.copyto(y, np.inf, where=masked)
        return y

    def _no_fit(self, job: Job, partners: int) -> Wait:
        return Wait(job.job_id, f"{self.name}: sharing pays with {partners} job(s) but their GPUs cannot hold it "
                                "compactly")

    def _place(self, view, ps, job, order: np.ndarray, choice, per_gpu, t_alone):
        # Add candidates' GPUs (best pair JCT first) until some compact set of nodes, with its free GPUs, holds
        # the job. All of a job's GPUs are of one type: the best candidate's. `order`: host columns.
        state, plan, need = ps.state, ps.plan, job.spec.gpus
        tab = ps.table
        occ, code = tab.occ, tab.code
        nodes = state.nodes
        first = int(order[0])
        gpu_type = tab.host_type(first)
        pool = plan.free_map()
        if len(state.gpu_types) > 1:
            order = order[code[order] == code[first]]
            pool = {n: c for n, c in pool.items() if nodes[n].gpu_type == gpu_type}
        tried = _holding_prefix(occ, pool, order, need, plan.node_size)
        if tried is None:
            return self._no_fit(job, len(order))
        # The one-by-one search up to where it stops, for the nodes it picks (ties go by the pool's order).
        spot = _Spot(pool, need, plan.node_size)
        shared_by_node: dict[str, list[tuple[int, Host, int]]] = {}
        for i in order[:tried].tolist():
            h = occ.host(i)
            for node, gs in h.nodes.items():
                lst = shared_by_node.setdefault(node, [])
                for g in gs:
                    lst.append((g, h, i))
                spot.add(node, len(gs))
        chosen_nodes = spot.nodes()
        if chosen_nodes is None:
            raise AssertionError(f"{job.job_id}: the first {tried} partner(s) were to hold it")
        gpus: list[int] = []
        partners: dict[str, tuple[Job, int, BatchChoice]] = {}
        free_needed: list[tuple[str, int]] = []
        left = need
        for node in chosen_nodes:  # shared GPUs first (Castor keeps free GPUs for others), then free ones
            take = min(left, pool[node])
            left -= take
            shared = shared_by_node.get(node, [])[:take]
            for g, h, i in shared:
                gpus.append(g)
                if h.job.job_id not in partners:
                    partners[h.job.job_id] = (h.job, i, choice(i))
            if take > len(shared):
                free_needed.append((node, take - len(shared)))
        if len(gpus) + sum(n for _, n in free_needed) != need or not partners:
            return None
        # One micro-batch for all of the job's GPUs: the smallest partner's choice, or smaller, that fits
        # in memory and is feasible next to every partner.
        mem = nodes[chosen_nodes[0]].memory_mb or state.gpus[gpus[0]].memory_mb
        top = min(c.sub_batch for _, _, c in partners.values())
        micro = next(
            (b for b in sub_batches(per_gpu) if b <= top and all(
                pair_fits(p.spec.model, self.micro_batch(p), job.spec.model, b, mem)
                and self.interference.xi(p.spec.model, self.micro_batch(p), job.spec.model, b, gpu_type) is not None
                for p, _, _ in partners.values())),
            None,
        )  # fmt: skip
        if micro is None:
            return Wait(job.job_id, f"{self.name}: no micro-batch fits next to all of {','.join(sorted(partners))}")
        for node, n in free_needed:
            gpus += self._pick_free(state, plan, node, n)
        ps.claimed.update(gpus)
        for _, i, _ in partners.values():
            tab.claim(i)
        acc = per_gpu // micro
        worst = max(partners.values(), key=lambda p: p[2].outcome.t_b)[2]
        self._record(view, ps, job, [p for p, _, _ in partners.values()], t_alone[gpu_type], worst.outcome.t_b)
        o = worst.outcome
        return Start(
            job.job_id, tuple(gpus),
            f"{self.name}: share with {','.join(sorted(partners))}, micro-batch {micro} x {acc}; pair mean JCT "
            f"{o.shared_mean:.0f}s shared vs waiting (xi {worst.xi_a:.2f}/{worst.xi_b:.2f})",
            ExecConfig(micro, acc),
        )  # fmt: skip
