"""Castor's SJF-BSBF (castor.txt Algorithm 1), a `SharingScheduler` (sharing_scheduler.py) whose `_share`
decides when free GPUs are short:

* for each running job A whose GPUs hold only A, Algorithm 2 (`sharing.best_sub_batch`) picks the
  new job's micro-batch (gradient accumulation keeps its global batch; memory must fit next to A) and
  Theorem 1's pair arithmetic says whether starting now beats waiting. Where the paper's wait alternative
  starts the new job when A ends (kappa = t_A i_A), ours starts it when GPUs are forecast free for it
  anywhere (`Forecast`: holders' remaining time per node, and the GPU demand queued ahead), which on a
  large cluster is usually much sooner; eq. 24's sharing benefit defines the wait the same way. The jobs
  for which sharing pays are sorted by the pair's predicted mean JCT and their GPUs taken until the job
  fits (free GPUs on the same nodes fill the rest); if no such set exists, the job waits: waiting is
  better (its pending reason says why).

Speed: the holders' arrays (`occupancy.Occupancy`) follow the state's change log instead of being rebuilt;
xi per (new job's model and batch, sub-batch, host group) and step times per kind of new job are kept in
stacked tables (`Kinds`); a release pass judges the queued jobs it may search next all at once, grouped by
kind: a kind's xi, masks and the part of the pair arithmetic that does not depend on the job are computed once
(what depends on xi only, once for the kinds of one xi), over the columns the kind can use, and its jobs get the
rest in blocks whose arrays stay in the CPU cache (the same element-wise arithmetic, so the same numbers; a host
taken in between only drops its column, `_standing`), with the share-or-wait flags of every job computed
together; the partner search adds the best candidates one by one for the first `_ONE_BY_ONE` (sorting only those
when there are many) and otherwise finds where that first holds the job with one count over all prefixes
(`holding_prefix`); an arrival pass skips to the newcomer once nothing before it can start. The arithmetic
runs over the hosts still alive only (any other column is +inf); a pass stops once the free GPUs and the alive
hosts' GPUs are fewer than the smallest queued job asks for; a per-node bound on what partners could gather
(`HostTable.gathers`) answers most "cannot hold it compactly" cases before the exact search. Decisions are
those of the one-job-at-a-time search.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from meshsched.perf.errors import UnknownProfile
from meshsched.perf.memory import pair_fits
from meshsched.policies.base import Start, Wait
from meshsched.policies.castor_preempt import preemption, sharing_cost
from meshsched.policies.castor_tables import HostTable, Judged, Kinds, Spot, holding_prefix
from meshsched.policies.occupancy import Host
from meshsched.policies.sharing import BatchChoice, pair_times, sub_batches, theorem1
from meshsched.policies.sharing_scheduler import Forecast, SharingPass, SharingScheduler
from meshsched.state import ExecConfig, Job

_ONE_BY_ONE = 16  # partner candidates `_place` adds one by one before it asks `holding_prefix` where to stop
_CHUNK = 1 << 16  # array elements per block of jobs judged together (a block's temporaries stay in the CPU cache)


def _best_first(idx: np.ndarray, vals: np.ndarray, m: int) -> np.ndarray:
    """The first `m` of `idx` sorted by `vals` (finite; ties in `idx`'s order): those of a stable sort of all of
    them, from the values up to the m-th smallest only when there are many."""
    if len(vals) <= 4 * m:
        return idx[np.argsort(vals, kind="stable")[:m]]
    near = np.flatnonzero(vals <= np.partition(vals, m - 1)[m - 1])  # the m smallest and any tied with the last
    return idx[near[np.argsort(vals[near], kind="stable")[:m]]]


class KindCols(NamedTuple):
    """One kind of job B's share of a pass's arithmetic (`Castor._kind_arrays`): the host columns it may take at
    some sub-batch and, per column, A's type code, solo step time, remaining iterations and end alone; per
    (sub-batch, column) xi, the pairs that cannot share (None: none), B's solo step time (or one column for all),
    A's and B's shared step times and A's end when it finishes first."""

    cols: np.ndarray
    code: np.ndarray
    ta: np.ndarray
    ia: np.ndarray
    end_a: np.ndarray
    xa: np.ndarray
    xb: np.ndarray
    masked: np.ndarray | None  # (flat indices into (sub-batch, column))
    t_b: np.ndarray
    ha: np.ndarray
    hb: np.ndarray
    ta2: np.ndarray


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
    _kt: Kinds | None = field(default=None, repr=False)
    _kinds: dict = field(default_factory=dict, repr=False)  # per job kind and GPU type, step times (`solo_steps`)
    # The queue order of a preemption layer under it that evicts longer jobs for a shorter one (srtf, lazer; set by
    # the registry): then a share must beat waiting counted over all of its partners, and for a job the layer would
    # evict for (`try_start`), preempting too (`_rather_preempt`)
    preemption_order: object | None = None

    def solo_steps(self, job: Job, per_gpu: int, node_size: int, gpu_type: str) -> dict[int, float] | None:
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
            ps.table = HostTable(self._occupancy(view, ps.state), ps.now)
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
        best, wait = blk.best[j], blk.wait[j]  # (twice the pair's and the wait alternative's, over `blk.cols`)
        foreign = self._foreign_hosts(view, ps, job)
        if foreign is None:
            got = self._standing(tab, blk, j)
            if got is None:
                return None
            pays, low, count = got
        else:  # other users' hosts are out too
            feasible = np.isfinite(best) & tab.alive[blk.cols]
            if feasible.any():
                mine = feasible & ~foreign[blk.cols]
                if not mine.any():
                    return self.foreign_wait(job, tab.occ.host(int(blk.cols[np.argmax(feasible)])).job)
                feasible = mine
            if not feasible.any():
                return None
            pays = feasible & (best < wait)
            if not pays.any():
                pays, low, count = None, int(np.argmin(np.where(feasible, best, np.inf))), int(feasible.sum())
        if pays is None:
            return Wait(job.job_id, f"{self.name}: waiting beats sharing (pair mean JCT {wait[low] / 2:.0f}s waiting "
                                    f"{blk.start_b[j]:.0f}s vs {best[low] / 2:.0f}s shared, best of {count} partners)")
        at = np.flatnonzero(pays)  # among the block's columns
        idx, twice = blk.cols[at], best[at]
        if not tab.gathers(plan, need):
            if len(ps.state.gpu_types) > 1:  # (`_place` counts the partners of the best one's GPU type)
                code = tab.code
                idx = idx[code[idx] == code[idx[np.argmin(twice)]]]
            return self._no_fit(job, len(idx))
        per_gpu = max(1, job.spec.batch_size // need)
        ta, ia, node_size, i_b = tab.ta, tab.ia, plan.node_size, blk.i_b[j]
        kt, kind = blk.kinds, blk.kind[j]
        subs, t_alone = kt.subs[kind], kt.t_alone[kind]

        def choice(c: int) -> BatchChoice:
            k = int(np.searchsorted(blk.cols, c))  # the column among those judged
            r = int(np.argmin(blk.sums[j, :, k]))  # the first (largest) sub-batch among equals (Algorithm 2's "<")
            b = subs[r]
            t = tab.host_type(c)
            xa, xb = float(blk.xa[r, k]), float(blk.xb[r, k])
            t_b = self._step(job, t, node_size, b, per_gpu // b)
            o = theorem1(float(ta[c]), float(ia[c]), xa, t_b, i_b, xb, t_alone[t])
            return BatchChoice(True, b, per_gpu // b, xa, xb, o)

        return self._place(view, ps, job, idx, twice, choice, per_gpu, t_alone)

    @staticmethod
    def _standing(tab: HostTable, blk: Judged, j: int):
        """Row `j`'s judgement with the hosts taken since it was made left out (every other column's numbers stand:
        they are per column): (pays or None, the lowest column, how many are feasible), the last two for when none
        pays, in the block's columns; None when no column is left. The same answer as recomputing over the hosts
        still alive, from the few columns taken since."""
        pays, low, count = blk.pays[j] if blk.any_p[j] else None, blk.low[j], blk.count[j]
        if blk.claims == tab.claims:
            return pays, low, count
        cols, best = blk.cols, blk.best[j]
        taken = np.array(tab.taken[blk.claims:])
        at = np.minimum(np.searchsorted(cols, taken), len(cols) - 1)
        at = at[(cols[at] == taken) & np.isfinite(best[at])]  # the feasible columns taken since
        if not len(at):
            return pays, low, count
        if count == len(at):
            return None
        if pays is not None and pays[at].any():
            pays = pays.copy()
            pays[at] = False
            if not pays.any():
                pays = None
        if pays is None and low in at.tolist():
            feasible = np.isfinite(best)
            feasible[at] = False
            low = int(np.argmin(np.where(feasible, best, np.inf)))
        return pays, low, count - len(at)

    def _spent(self, ps: SharingPass, need: int) -> bool:
        tab = ps.table  # free GPUs and those of hosts still alive: what a job can start on, or share (`_share`)
        return tab is not None and ps.plan.free_total + tab.free_single < need

    def _kind_table(self, ps: SharingPass) -> Kinds:
        occ, node_size = ps.table.occ, ps.plan.node_size
        kt = self._kt
        if kt is None or not kt.fits(occ, node_size):
            kt = self._kt = Kinds(occ, node_size)
        return kt

    def _judge(self, view, ps: SharingPass, job: Job) -> None:
        """Algorithm 1's arithmetic for `job` and, on a release pass, for the queued jobs the walk may search
        next (`SharingPass.lookahead`), all at once: the same operations element by element as one job at a
        time, so the same numbers. Each outcome: None (no host can take it), a Wait (no profile to judge), or a
        (`Judged` block, row) that `_share` decides on with the hosts still free when the job's turn comes (a
        host taken in between only drops its own column)."""
        tab = ps.table
        jobs, aheads = self._to_judge(ps, job)
        now, judged = ps.now, ps.judged
        if ps.forecast is None:
            ps.forecast = Forecast(self._occupancy(view, ps.state), now)
        forecast = ps.forecast
        kt = self._kind_table(ps)
        present = np.zeros(len(kt.types), dtype=bool)
        present[tab.code] = True  # GPU types among the hosts
        usable = (kt.profiled & present).any(axis=1).tolist()  # per kind id seen so far: profiled on some host's type
        kids, i_bs, needs, kept, kept_ahead = [], [], [], [], []
        kid_of = kt.kid_of
        for n, j in enumerate(jobs):
            spec = j.spec
            kid = kid_of.get(spec.job_id)
            if kid is None:
                kid = kid_of[spec.job_id] = kt.kind(self.solo_steps, j, max(1, spec.batch_size // spec.gpus))
            if not (usable[kid] if kid < len(usable) else (kt.profiled[kid] & present).any()):
                judged[j.job_id] = Wait(j.job_id, f"{self.name}: no profile to judge sharing; waiting for free GPUs")
                continue
            kids.append(kid)
            i_bs.append(max(0.0, spec.iterations - j.iterations_at(now)))  # (`_remaining_iters`)
            needs.append(spec.gpus)
            kept.append(j)
            kept_ahead.append(aheads[n])
        if not kids:
            return
        # Waiting: A runs alone; B starts when enough GPUs are forecast free for it (`Forecast`; Theorem 1's
        # kappa = t_A i_A assumes that is when A ends), then runs alone at its full batch.
        start_b = forecast.waits(np.array(needs), np.array(kept_ahead)).tolist()
        kt.fill(self.interference, set(kids))
        # Only the hosts still alive (not done, not taken) get the arithmetic, `cols` of all the columns: any other
        # column's best is +inf whatever its numbers (about half the hosts of a busy pass have no work left).
        cols = np.flatnonzero(tab.alive)
        hosts = (cols, tab.occ.host_group[cols], tab.code[cols], tab.ta[cols], tab.ia[cols], tab.end_a[cols])
        by_kind: dict[int, list[int]] = {}
        for n, kid in enumerate(kids):
            by_kind.setdefault(kid, []).append(n)
        memo: dict = {}
        for kid, ns in by_kind.items():  # a kind's arrays (xi, step times, hosts it may take) are shared by its jobs
            shared = self._kind_arrays(kt, kid, hosts, memo)
            if not len(shared.cols):  # no host it may take
                judged.update((kept[n].job_id, None) for n in ns)
                continue
            step = max(1, _CHUNK // max(1, shared.xa.size))  # jobs per block of arrays that stays in cache
            for lo in range(0, len(ns), step):
                part = ns[lo:lo + step]
                blk, any_f = self._judge_block(tab, kt, kid, shared, [i_bs[n] for n in part],
                                               [start_b[n] for n in part])
                for c, f in enumerate(any_f):
                    judged[kept[part[c]].job_id] = (blk, c) if f else None

    @staticmethod
    def _to_judge(ps: SharingPass, job: Job) -> tuple[list[Job], list[int]]:
        """`job` and, on a release pass, the next queued jobs a sharing search may reach (`SharingPass.lookahead`)
        not judged yet, with the GPU demand queued ahead of each."""
        jobs, aheads = [job], [ps.ahead]
        if ps.lookahead:
            a = ps.ahead + job.spec.gpus
            room = ps.plan.free_total + ps.table.free_single  # only shrinks in a pass: a job needing more gets no search
            for j in ps.peek(ps.lookahead):
                need = j.spec.gpus
                if need <= ps.total:
                    if need <= room and j.job_id not in ps.judged:
                        jobs.append(j)
                        aheads.append(a)
                    a += need
        return jobs, aheads

    @staticmethod
    def _kind_arrays(kt: Kinds, kid: int, hosts, memo: dict | None = None) -> KindCols:
        """What one kind of job B shares in a pass's arithmetic over the hosts alive (`hosts`: their columns, groups,
        type codes, step times, remaining iterations and ends alone): the columns it may take at some sub-batch,
        and there the inputs of `_pair_sums` that do not depend on the job (the same operations). `memo` keeps, for
        the pass, what the kinds of one xi (B's model and per-GPU batch, so the same sub-batches) share."""
        r = kt.nsubs[kid]
        xid = kt.xi_of[kid]
        got = memo.get(xid) if memo is not None else None
        if got is None:
            got = Castor._xi_cols(kt, xid, r, hosts)
            if memo is not None:
                memo[xid] = got
        cols, code_c, ta, ia, end_a, xa, xb, masked, ha, ta2 = got
        if len(kt.types) == 1:  # (every job here is profiled on the one type)
            t_b = kt.tb[kid, :r, :]
        else:
            off = ~kt.profiled[kid][code_c]  # hosts of a type B has no profile on cannot take it
            t_b = kt.tb[kid, :r][:, code_c]
            if off.any():
                masked = masked | off[None, :]
                keep = ~masked.all(axis=0)  # (as in `_xi_cols`)
                if not keep.all():
                    cols, code_c, ta, ia, end_a = (a[keep] for a in (cols, code_c, ta, ia, end_a))
                    per_sub = (xa, xb, masked, ha, ta2, t_b)
                    xa, xb, masked, ha, ta2, t_b = (np.compress(keep, a, axis=1) for a in per_sub)
        with np.errstate(over="ignore", invalid="ignore"):
            hb = t_b * xb  # B's shared step time (eq. 15)
        at = np.flatnonzero(masked)
        return KindCols(cols, code_c, ta, ia, end_a, xa, xb, at if len(at) else None, t_b, ha, hb, ta2)

    @staticmethod
    def _xi_cols(kt: Kinds, xid: int, r: int, hosts) -> tuple:
        """`_kind_arrays`' part that depends on B's xi only: the columns where some sub-batch fits next to A, and
        there the columns' arrays, xi (sub-batch, column), the pairs that do not fit (NaN xi), A's shared step time
        and A's end when it finishes first."""
        cols, gidx, code_c, ta, ia, end_a = hosts
        xa = np.take(kt.xa[xid, :r], gidx, axis=1)  # (sub-batches, alive hosts)
        xb = np.take(kt.xb[xid, :r], gidx, axis=1)
        masked = np.isnan(xa)
        keep = ~masked.all(axis=0)  # columns no sub-batch can use: +inf whatever the numbers, left out
        if not keep.all():
            # (`compress` answers C-contiguous arrays, as `_pair_sums` needs: it writes through `ravel`)
            cols, code_c, ta, ia, end_a = (a[keep] for a in (cols, code_c, ta, ia, end_a))
            xa, xb, masked = (np.compress(keep, a, axis=1) for a in (xa, xb, masked))
        with np.errstate(over="ignore", invalid="ignore"):
            ha = ta * xa  # A's shared step time (eq. 14)
            ta2 = ha * ia  # A's end when it finishes first
        return cols, code_c, ta, ia, end_a, xa, xb, masked, ha, ta2

    def _judge_block(self, tab: HostTable, kt: Kinds, kid: int, k: KindCols, i_bs: list[float], start_b: list[float]
                     ) -> tuple[Judged, list[bool]]:
        """One block of jobs of one kind: their arithmetic over the kind's columns (`_kind_arrays`). The block keeps
        twice the pair's best mean JCT and twice the wait alternative's (halving changes neither order nor ties)."""
        n = len(i_bs)
        ib = np.array(i_bs)[:, None]
        t_b_alone = kt.tb[kid, 0, 0] if len(kt.types) == 1 else kt.tb[kid, 0][k.code][None, :]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            sums = self._pair_sums(k.ta, k.ia, k.ha, k.hb, k.ta2, k.t_b, ib[:, :, None], k.masked)
            best = sums[:, 0, :] if sums.shape[1] == 1 else sums.min(axis=1)
            wait = k.end_a + np.array(start_b)[:, None] + t_b_alone * ib
            feasible = np.isfinite(best)
            pays = feasible & (best < wait)
        any_f, any_p = feasible.any(axis=1).tolist(), pays.any(axis=1).tolist()
        count = feasible.sum(axis=1).tolist()
        low = (best if min(count) == len(k.cols) else np.where(feasible, best, np.inf)).argmin(axis=1).tolist()
        blk = Judged(kt, [kid] * n, i_bs, start_b, k.cols, k.xa, k.xb, sums, best, wait, tab.claims, pays, any_p, low,
                     count)
        return blk, any_f

    @staticmethod
    def _pair_sums(ta, ia, ha, hb, ta2, t_b, i_b, masked=None) -> np.ndarray:
        """Twice the pair's mean JCT (Theorem 1 at kappa = 0: B starts now) per (job, sub-batch, host), +inf where
        the pair cannot share (`masked`: flat indices into (sub-batch, host); None: none); eq. 16-17 where B
        finishes first, eq. 20-21 where A does. `ta`, `ia`: the hosts'; `ha`, `hb` the shared step times, `ta2` A's
        end when it finishes first (`_kind_arrays`). (Called with numpy's divide, invalid and overflow warnings
        off.)"""
        tb1 = hb * i_b  # B's end when it finishes first
        x = np.divide(tb1, ha, order="C")  # (C order: `flat` is a view, written through)
        flat = x.reshape(-1)
        np.subtract(ia, x, out=x)
        np.multiply(ta, x, out=x)
        np.add(tb1, x, out=x)  # A's end when B finishes first
        np.add(x, tb1, out=x)
        # B's end when A finishes first, only where it does (usually a few %): the same operations per element
        k = np.flatnonzero(~(ta2 >= tb1))
        if len(k):
            rc, cols = ta2.size, ta2.shape[-1]
            at = k % rc  # (sub-batch, host) of each element; `ta2`, `hb` are (sub-batches, hosts), `t_b` the
            tb = t_b.ravel()[at // cols if t_b.shape[-1] == 1 else at]  # same or one column; `i_b` (jobs, 1, 1)
            a2 = ta2.ravel()[at]
            y = i_b.ravel()[k // rc] - a2 / hb.ravel()[at]  # B's iterations left when A ends
            np.multiply(tb, y, out=y)
            np.add(a2, y, out=y)
            np.add(a2, y, out=y)
            flat[k] = y
        if masked is not None:  # (a few indices: much cheaper than a broadcast mask)
            flat[(np.arange(len(x))[:, None] * ta2.size + masked).ravel()] = np.inf
        return x

    @staticmethod
    def _add_until_held(occ, pool: dict[str, int], idx: np.ndarray, twice: np.ndarray, need: int, node_size: int):
        """The one-by-one search of `_place` over the candidate hosts `idx` (columns, ascending) best pair first
        (`twice`; ties: lowest column first), for the nodes it picks (ties go by the pool's order): the first few
        candidates one by one (most searches stop there), then up to where `holding_prefix` says it stops. The
        `Spot` (over `pool`, which it adds to), the candidates' GPUs per node and how many were added; None when
        all of them together cannot hold the job."""
        spot = Spot(pool, need, node_size)
        start = dict(pool)
        shared_by_node: dict[str, list[tuple[int, Host, int]]] = {}

        def add(i: int) -> None:
            h = occ.host(i)
            for node, gs in h.nodes.items():
                lst = shared_by_node.setdefault(node, [])
                for g in gs:
                    lst.append((g, h, i))
                spot.add(node, len(gs))

        for k, i in enumerate(_best_first(idx, twice, _ONE_BY_ONE).tolist(), 1):
            add(i)
            if spot.nodes() is not None:
                return spot, shared_by_node, k
        if len(idx) <= _ONE_BY_ONE:
            return None
        order = idx[np.argsort(twice, kind="stable")]
        tried = holding_prefix(occ, start, order, need, node_size)
        if tried is None:
            return None
        for i in order[_ONE_BY_ONE:tried].tolist():
            add(i)
        return spot, shared_by_node, tried

    def _no_fit(self, job: Job, partners: int) -> Wait:
        return Wait(job.job_id, f"{self.name}: sharing pays with {partners} job(s) but their GPUs cannot hold it "
                                "compactly")

    def _rather_preempt(self, view, ps: SharingPass, job: Job, partners, micro: int, gpu_type: str, t_b_alone: float
                        ) -> Wait | None:
        """Under a preemption layer that evicts longer jobs (`preemption_order`): a Wait when sharing with all of
        `partners` ((Job, column, choice)) at `micro` adds more to the sum of JCTs than waiting for free GPUs, or
        (a job the layer may evict for: `ps.preempting`) than starting alone now by preempting longer jobs
        (castor_preempt: Theorem 1 over every partner at once, and "after A" is then "now, after the victims
        pause"); else None. In a release pass of such a layer (`ps.rather_preempt`) a job declined because
        preempting beats sharing is named there, for the layer to preempt for it as on an arrival."""
        now, tab = ps.now, ps.table
        i_b = self._remaining_iters(job, now)
        per_gpu = max(1, job.spec.batch_size // job.spec.gpus)
        t_b = self._step(job, gpu_type, ps.plan.node_size, micro, per_gpu // micro)
        shared = []
        for p, i, _ in partners:
            x = self.interference.xi(p.spec.model, self.micro_batch(p), job.spec.model, micro, gpu_type)
            if x is None:
                return None
            ta, ia = float(tab.ta[i]), float(tab.ia[i])
            shared.append((ta, ia, x[0], pair_times(ta, ia, x[0], t_b, i_b, x[1], 0.0)[1]))
        d, cost = sharing_cost(shared)
        solo = t_b_alone * i_b
        wait = self.wait_start(view, ps, job) + solo
        if cost >= wait:
            return Wait(job.job_id, f"{self.name}: waiting beats sharing with {len(shared)} job(s) (JCT added "
                                    f"{wait:.0f}s waiting vs {cost:.0f}s shared)")
        pre = preemption(view, ps.cycle, job, self.preemption_order, self.perf, now, solo) if ps.preempting else None
        if pre is None or cost <= pre.cost:
            return None
        if ps.rather_preempt is not None:  # a release pass: the layer preempts for it after the pass (lazer)
            ps.rather_preempt.add(job.job_id)
        return Wait(job.job_id, f"{self.name}: preempting {','.join(v.job_id for v in pre.victims)} beats sharing "
                                f"(done in {pre.jct:.0f}s alone vs {d:.0f}s shared; JCT added {pre.cost:.0f}s vs {cost:.0f}s)")

    def _place(self, view, ps, job, idx: np.ndarray, twice: np.ndarray, choice, per_gpu, t_alone):
        # Add candidates' GPUs (best pair JCT first) until some compact set of nodes, with its free GPUs, holds
        # the job. All of a job's GPUs are of one type: the best candidate's. `idx`: host columns (ascending),
        # `twice` their pairs' mean JCT, twice.
        state, plan, need = ps.state, ps.plan, job.spec.gpus
        tab = ps.table
        occ, code = tab.occ, tab.code
        nodes = state.nodes
        first = int(idx[np.argmin(twice)])  # the best pair (ties: the lowest column)
        gpu_type = tab.host_type(first)
        pool = plan.free_map()
        if len(state.gpu_types) > 1:
            same = code[idx] == code[first]
            idx, twice = idx[same], twice[same]
            pool = {n: c for n, c in pool.items() if nodes[n].gpu_type == gpu_type}
        found = self._add_until_held(occ, pool, idx, twice, need, plan.node_size)
        if found is None:
            return self._no_fit(job, len(idx))
        spot, shared_by_node, tried = found
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
        if self.preemption_order is not None:
            rather = self._rather_preempt(view, ps, job, partners.values(), micro, gpu_type, t_alone[gpu_type])
            if rather is not None:
                return rather
        for node, n in free_needed:
            gpus += plan.withhold_gpus(node, n)
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
