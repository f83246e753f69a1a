"""The GPU-sharing baselines Castor is compared with: SJF-FFS and a Lucid-like packer.

Both run the common sharing pass of `castor.SharingScheduler` (SJF on free GPUs first) and differ in what
happens when free GPUs are short:

* sjf-ffs: shares first-fit (lowest node, lowest GPU index) with any single-job GPU whose pair fits in
  memory, whenever free GPUs are short, at the full batch.
* lucid: shares only with a running job of the same GPU count, taking exactly its GPUs, and only when the
  two jobs' profiled utilisation (`utilisation`) adds up to at most LUCID_UTIL_THRESHOLD and memory fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshsched.perf.errors import UnknownProfile
from meshsched.perf.memory import pair_fits
from meshsched.policies.base import Start
from meshsched.policies.sharing_scheduler import SharingPass, SharingScheduler, compact_nodes
from meshsched.policies.occupancy import Host
from meshsched.state import Job

LUCID_UTIL_THRESHOLD = 1.0


@dataclass
class SjfFfs(SharingScheduler):
    """SJF with first-fit sharing whenever free GPUs are short (full batch; memory must fit)."""

    name: str = "sjf-ffs"

    def _usable(self, view, ps: SharingPass, job: Job, per_gpu: int, gpu_type: str) -> dict[str, list[tuple[int, Job]]]:
        """Single-job GPUs of `gpu_type` not yet claimed in this pass whose job `job` could share (memory fits, the
        pair is feasible, not another user's under `one_user`), by node, in host order; kept per pass until a GPU
        is claimed. Hosts left out only for their user are kept under ("foreign", key)."""
        model_b = job.spec.model
        key = (model_b, per_gpu, gpu_type, job.spec.user if self.one_user else None, job.job_id if job.avoid else None)
        memo = ps.usable
        hit = memo.get(key)
        if hit is not None and hit[0] == len(ps.claimed):
            return hit[1]
        hosts = memo.get(("hosts", key))
        if hosts is None:
            gpus_of = ps.state.gpus
            ok_of: dict[tuple, bool] = {}
            hosts, foreign = [], []
            for h in self._hosts(view, ps):
                a = h.job
                g0 = gpus_of[h.gpus[0]]
                if g0.gpu_type != gpu_type:
                    continue
                micro = self.micro_batch(a)
                pair = (a.spec.model, micro, g0.memory_mb)
                ok = ok_of.get(pair)
                if ok is None:
                    ok = ok_of[pair] = pair_fits(a.spec.model, micro, model_b, per_gpu, g0.memory_mb) and (
                        self.interference.xi(a.spec.model, micro, model_b, per_gpu, gpu_type) is not None
                    )
                if ok:
                    (foreign if self.foreign(job, a) else hosts).append(h)
            memo[("hosts", key)] = hosts
            memo[("foreign", key)] = foreign
        claimed = ps.claimed
        usable: dict[str, list[tuple[int, Job]]] = {}
        for h in hosts:
            a = h.job
            for node, gs in h.nodes.items():
                usable.setdefault(node, []).extend((g, a) for g in gs if g not in claimed)
        memo[key] = (len(claimed), usable)
        return usable

    def _share(self, view, ps, job):
        state, plan = ps.state, ps.plan
        need = job.spec.gpus
        node_size = plan.node_size
        per_gpu = max(1, job.spec.batch_size // need)
        free_all = plan.free_map()
        mixed = len(state.gpu_types) > 1
        for gpu_type in state.gpu_types:  # one type per job; a single-type cluster has one round
            free = {n: c for n, c in free_all.items() if state.nodes[n].gpu_type == gpu_type} if mixed else free_all
            usable = self._usable(view, ps, job, per_gpu, gpu_type)
            pool = {n: free.get(n, 0) + len(usable.get(n, [])) for n in sorted(set(free) | set(usable))}
            nodes = compact_nodes(pool, need, node_size)
            if nodes is not None:
                break
        else:
            return self._only_foreign(ps, job, per_gpu)
        gpus: list[int] = []
        partners: dict[str, Job] = {}
        left = need
        for node in nodes:
            take = min(left, pool[node])
            left -= take
            items = sorted(usable.get(node, []), key=lambda x: x[0])
            n_free = min(free.get(node, 0), take)
            if n_free:
                gpus += plan.withhold_gpus(node, n_free)
            for g, a in items[: take - n_free]:
                gpus.append(g)
                partners[a.job_id] = a
        if len(gpus) != need:
            return None
        ps.claimed.update(gpus)
        if not partners:
            return Start(job.job_id, tuple(gpus), f"{self.name}: {need} GPU(s) free")
        try:
            t_b = self._step(job, gpu_type, node_size, per_gpu, 1)
            self._record(view, ps, job, list(partners.values()), t_b, float("nan"))
        except (UnknownProfile, ValueError):
            pass
        return Start(job.job_id, tuple(gpus), f"{self.name}: first-fit sharing with {','.join(sorted(partners))}")

    def _only_foreign(self, ps: SharingPass, job: Job, per_gpu: int):
        """No placement: the pending reason names another user's job it would have shared with, if one was left out
        for its user (None otherwise)."""
        if not self.one_user and not job.avoid:
            return None
        user = job.spec.user if self.one_user else None
        for gpu_type in ps.state.gpu_types:
            foreign = ps.usable.get(("foreign", (job.spec.model, per_gpu, gpu_type, user,
                                                 job.job_id if job.avoid else None)))
            if foreign:
                return self.foreign_wait(job, foreign[0].job)
        return None


def utilisation(perf, model: str, gpu_type: str, per_gpu_batch: int) -> float:
    """Lucid-like profiled utilisation proxy: the share of a solo step spent in batch-proportional compute,
    beta*b / (alpha + beta*b) from the fitted profile (the fixed per-step part alpha is launch/framework time
    that leaves the GPU idle). No profile measures SM activity, so this is an assumption."""
    p = perf.profile(model, gpu_type).params
    work = p.beta_comp * per_gpu_batch
    return work / (p.alpha_comp + work)


@lru_cache(maxsize=1 << 12)
def _util(perf, model: str, gpu_type: str, per_gpu_batch: int) -> float:
    return utilisation(perf, model, gpu_type, per_gpu_batch)


@dataclass
class Lucid(SharingScheduler):
    """Lucid-like packing: same GPU count, exactly the partner's GPUs, combined utilisation <= threshold."""

    name: str = "lucid"
    threshold: float = LUCID_UTIL_THRESHOLD

    def _sized(self, view, ps) -> dict[int, list[tuple[float, int, Host]]]:
        """Hosts whose every GPU holds only them, by GPU count, lowest utilisation first (built when the hosts
        changed), each judged on its own GPU type."""
        if ps.by_size is None:
            hosts = self._hosts(view, ps)
            at = (self._occ, self._occ.host_version)
            if self._shapes_at == at:
                ps.by_size = self._shapes
                return ps.by_size
            gpus = ps.state.gpus
            by: dict[int, list[tuple[float, int, Host]]] = {}
            for h in hosts:
                a = h.job
                if len(h.gpus) != a.spec.gpus:
                    continue
                try:
                    u = _util(self.perf, a.spec.model, gpus[h.gpus[0]].gpu_type, self.micro_batch(a))
                except UnknownProfile:
                    continue
                by.setdefault(a.spec.gpus, []).append((u, h.gpus[0], h))
            for lst in by.values():
                lst.sort(key=lambda x: (x[0], x[1]))
            ps.by_size = self._shapes = by
            self._shapes_at = at
        return ps.by_size

    def _share(self, view, ps, job):
        need = job.spec.gpus
        gpus = ps.state.gpus
        per_gpu = max(1, job.spec.batch_size // need)
        model_b = job.spec.model
        u_b: dict[str, float | None] = {}
        best = other = None
        for u_a, _, h in self._sized(view, ps).get(need, ()):
            g0 = gpus[h.gpus[0]]
            gpu_type = g0.gpu_type
            if gpu_type not in u_b:
                try:
                    u_b[gpu_type] = _util(self.perf, model_b, gpu_type, per_gpu)
                except UnknownProfile:
                    u_b[gpu_type] = None
            if u_b[gpu_type] is None:
                continue
            u = u_b[gpu_type] + u_a
            if u > self.threshold:
                if len(ps.state.gpu_types) == 1:
                    break  # sorted: every later host is busier
                continue
            if ps.claimed.intersection(h.gpus):
                continue
            a = h.job
            micro_a = self.micro_batch(a)
            if not pair_fits(a.spec.model, micro_a, model_b, per_gpu, g0.memory_mb):
                continue
            if self.interference.xi(a.spec.model, micro_a, model_b, per_gpu, gpu_type) is None:
                continue
            if self.foreign(job, a):
                other = other or a
                continue
            best = (u, h, gpu_type)
            break
        if best is None:
            return None if other is None else self.foreign_wait(job, other)
        u, h, gpu_type = best
        ps.claimed.update(h.gpus)
        try:
            t_b = self._step(job, gpu_type, ps.plan.node_size, per_gpu, 1)
            self._record(view, ps, job, [h.job], t_b, float("nan"))
        except (UnknownProfile, ValueError):
            pass
        return Start(job.job_id, h.gpus, f"{self.name}: packed with {h.job.job_id} (utilisation {u:.2f})")
