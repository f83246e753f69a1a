"""The arrays Castor's sharing search judges with (castor.py): the single-job hosts of a pass (`HostTable`),
Algorithm 2's inputs stacked per kind of new job (`Kinds`), a block of judged jobs (`Judged`), and where adding
partners one by one first holds a job (`holding_prefix`, `Spot`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from meshsched.perf.interference import Interference
from meshsched.perf.memory import pair_fits
from meshsched.policies.occupancy import Occupancy
from meshsched.policies.placement import Planner
from meshsched.policies.sharing import sub_batches
from meshsched.policies.sharing_scheduler import compact_nodes
from meshsched.state import Job

# B's solo step time on a GPU type at each sub-batch (Castor.solo_steps): (job, per-GPU batch, node size, type)
StepsFn = Callable[[Job, int, int, str], "dict[int, float] | None"]


def holding_prefix(occ: Occupancy, free: dict[str, int], order: np.ndarray, need: int, node_size: int) -> int | None:
    """How many of the candidate hosts (columns, in `order`) `_place` adds one by one, each host's single-job GPUs
    joining `free` (GPUs per node), before `Spot` finds nodes that hold `need` GPUs compactly (at least one: it
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


class Spot:
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


class HostTable:
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
        self.taken: list[int] = []  # their columns, in the order taken
        self._single: np.ndarray | None = None  # `gathers`: per live node (and a last slot: none), alive hosts' GPUs
        self._room: tuple[list[int], int, int] | None = None  # `gathers`: per-node counts, most first, and
        # the free and single GPUs when counted

    def gathers(self, plan: Planner, need: int) -> bool:
        """False when no node (no ceil(need / node size) whole nodes) holds `need` GPUs even counting every free
        GPU and every GPU of a host still alive: no set of partners can then hold the job. True: it may. The
        per-node counts are kept, and recounted only when the GPUs taken since could have made the difference
        (taking k GPUs lowers the sum of the fullest nodes by at most k); the alive hosts' share of them follows
        `claim`, so a recount only adds the free GPUs."""
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
        if self._single is None:
            alive = np.zeros(len(occ.solo_of) + 1, dtype=bool)  # by a host's first GPU (the last slot: no host)
            alive[occ.first_gpu(np.flatnonzero(self.alive))] = True
            self._single = np.bincount(occ.gpu_node[alive[occ.solo_of]], minlength=width + 1)
        per = self._single[:width].copy()
        row = occ.node_row
        for name, c in plan.free_map().items():
            per[row[name]] += c
        room = np.sort(per)[::-1].tolist()
        self._room = (room, plan.free_total, self.free_single)
        return sum(room[:want]) >= need

    def host_type(self, i: int) -> str:
        return self.occ.type_names[self.code[i]]

    def claim(self, i: int) -> None:
        if self.alive[i]:
            self.alive[i] = False
            occ = self.occ
            self.free_single -= int(occ.host_gpus[i])
            self.claims += 1
            self.taken.append(i)
            if self._single is not None:  # its GPUs leave their nodes' counts (a lost node's: the last slot)
                np.subtract.at(self._single, occ.gpu_node[list(occ.host(i).gpus)], 1)


class Kinds:
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

    def kind(self, solo_steps: StepsFn, job: Job, per_gpu: int) -> int:
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
            steps = solo_steps(job, per_gpu, self.node_size, t)
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

    def fill(self, inter: Interference, kids) -> None:
        """Bring the xi of these kinds up to the occupancy's groups."""
        groups = self.occ.groups
        if len(groups) > self.xa.shape[2]:
            more = max(len(groups), 2 * self.xa.shape[2]) - self.xa.shape[2]
            blank = np.full(self.xa.shape[:2] + (more,), np.nan)
            self.xa, self.xb = np.concatenate([self.xa, blank], axis=2), np.concatenate([self.xb, blank], axis=2)
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


class Judged:
    """A block of queued jobs' sharing arithmetic in a pass (`Castor._judge`), jobs of one kind, one row per job (a
    job's judgement is the block and its row): arrays whose last axis is the host columns `cols` (those alive when
    judged that the kind may take; any other column is +inf, never pays): xi per (sub-batch, column), the kind's;
    per job the pair sums, twice the pair's best mean JCT and twice the wait alternative's, where sharing pays;
    and what `_share` decides on while no host was taken (`Castor._standing` after some were)."""

    __slots__ = ("kinds", "kind", "i_b", "start_b", "cols", "xa", "xb", "sums", "best", "wait", "claims", "pays",
                 "any_p", "low", "count")

    def __init__(self, kinds, kind, i_b, start_b, cols, xa, xb, sums, best, wait, claims, pays, any_p, low,
                 count) -> None:
        self.kinds, self.kind, self.i_b, self.start_b, self.cols = kinds, kind, i_b, start_b, cols
        self.xa, self.xb, self.sums, self.best, self.wait = xa, xb, sums, best, wait
        self.claims, self.pays, self.any_p, self.low, self.count = claims, pays, any_p, low, count
