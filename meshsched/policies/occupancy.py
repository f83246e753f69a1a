"""Who holds which GPU, as arrays, for the sharing policies: single-job hosts, remaining work, GPU free times.

Built once from the state, then kept up to date: when `ClusterState.version` moved, only the jobs the state's
change log names (`ClusterState.changed_since`) are re-read (`apply`), with the GPUs they hold or held and the
jobs sharing those GPUs (a job whose GPUs and state did not move: its row alone); a change the log cannot name
(a node joined or was lost, or the log was outrun), or one naming more than half the holders, rebuilds
everything (`castor_occupancy.FollowingOccupancy` follows the former without a rebuild). Between two changes
a pass only re-evaluates remaining work at its own `now`, vectorised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain
from operator import is_

import numpy as np

from meshsched.state import ClusterState, Job, JobState

_REBUILD_ABOVE = 256  # changed jobs past which a full rebuild is cheaper than updating one by one


@dataclass
class Host:
    """A job holding GPUs of which `gpus` hold only it: where a new job may share."""

    job: Job
    index: int  # row in Occupancy's job arrays
    gpus: tuple[int, ...]
    nodes: dict[str, list[int]]


class Occupancy:
    """Arrays over the jobs holding GPUs (LOADING, RUNNING, PAUSING) and over the GPUs of live nodes.

    Rows of the job arrays belong to one job while it holds GPUs (freed rows are zero and referenced by no
    GPU). `hosts` (sorted by first GPU) and the arrays over them (`host_rows`, `host_gpus`, `host_group`,
    `host_code`) are re-indexed when some host changed; `host_version` counts those re-indexings. `groups` (indexed
    by `host_group`) only grows, so per-group answers a policy caches stay valid.
    """

    def __init__(
        self,
        state: ClusterState,
        holding: Iterable[Job],
        solo_step: Callable[[Job], float],
        group_of: Callable[[Job], tuple],
    ) -> None:
        self.state = state
        self._solo_step = solo_step
        self._group_of = group_of
        self._group_ids: dict[tuple, int] = {}
        self.groups: list[tuple] = []
        self.host_version = 0
        self._build(holding)

    def current(self, state: ClusterState) -> bool:
        """Still describes `state` (the same object, unchanged since the last build or refresh)."""
        return state is self.state and state.version == self.version

    # -- keeping up with the state -----------------------------------------------------------------------
    def refresh(self, holding: Iterable[Job]) -> None:
        """Catch up with the state: re-read the jobs changed since the last refresh (or rebuild)."""
        state = self.state
        if state.version == self.version:
            return
        changed = state.changed_since(self.version)
        if changed is None or self.rebuild_pays(len(changed)):
            self._build(holding)
            return
        self.apply(changed)

    def rebuild_pays(self, moved: int) -> bool:
        """A full rebuild is cheaper than re-reading `moved` jobs one by one (about half the holders: a job
        re-read costs about twice its share of a rebuild)."""
        return moved > max(_REBUILD_ABOVE, len(self._row) // 2)

    def apply(self, changed: Iterable[str]) -> None:
        """Re-read these jobs (and the GPUs they hold or held, and the jobs sharing those) and take the state's
        version: the arrays end as a rebuild's would (rows aside)."""
        state = self.state
        jobs, gpus = state.jobs, state.gpus
        touched_gpus: set[int] = set()
        again: set[str] = set()
        for jid in changed:
            row = self._row.get(jid)
            job = jobs.get(jid)
            if row is not None and job is self.jobs[row] and job.gpus == self._held[row] and job.state.holds_gpus \
                    and (job.state is JobState.PAUSING) == self.pausing[row]:
                self._set_row(job, row)  # only its progress or settings moved: no GPU or host changes by it
                continue
            again.add(jid)
            if row is not None:
                touched_gpus.update(self._held[row])
            if job is not None and job.gpus and job.state.holds_gpus:
                touched_gpus.update(job.gpus)
                self._set_row(job, row)
            elif row is not None:
                self._drop_row(jid, row)
        holders = self.holders
        pos = self._row
        for g in touched_gpus:
            js = gpus[g].jobs
            holders[g, 0] = pos.get(js[0], -1) if js else -1
            holders[g, 1] = pos.get(js[1], -1) if len(js) == 2 else -1
            again.update(js)
        for jid in again:
            self._set_host(jid)
        solo_of, hosts = self.solo_of, self._hosts
        for jid in again:  # a host's first GPU may have moved: re-mark all GPUs of the jobs involved
            job = jobs.get(jid)
            if job is not None:
                touched_gpus.update(job.gpus)
        for g in touched_gpus:
            js = gpus[g].jobs
            h = hosts.get(js[0]) if len(js) == 1 else None
            solo_of[g] = h.gpus[0] if h is not None else -1
        self.version = state.version

    def _build(self, holding: Iterable[Job]) -> None:
        state = self.state
        self.version = state.version
        self._iters_at: tuple | None = None
        jobs = [j for j in holding if j.gpus]
        n = max(16, 2 * len(jobs))
        self.jobs: list[Job | None] = [None] * n
        self._held: list[tuple[int, ...]] = [()] * n
        self.left = np.zeros(n)
        self.since = np.zeros(n)
        self.rate = np.zeros(n)
        self.solo = np.zeros(n)
        self.pausing = np.zeros(n, dtype=bool)
        self.gid = np.zeros(n, dtype=np.int64)  # index into `groups`
        self.tcode = np.zeros(n, dtype=np.int64)  # index into `type_names`: the GPU type of the job's GPUs
        self.type_names = sorted({g.gpu_type for g in state.gpus})
        self._code = {t: i for i, t in enumerate(self.type_names)}
        self._row: dict[str, int] = {}
        self._free_rows = list(range(n - 1, -1, -1))
        gpus = state.gpus
        self._hosts: dict[str, Host] = {}
        # hosts by their first GPU: the row (-1: none) and the number of GPUs only it holds
        self._host_at = np.full(len(gpus), -1, dtype=np.int64)
        self._host_n = np.zeros(len(gpus), dtype=np.int64)
        self._host_obj: dict[int, Host] = {}
        for j in jobs:
            self._set_row(j, None)
        pos = self._row
        # holders[g] = (first job row, second job row); -1 = none (indexes a trailing 0 in `free_times`)
        self.holders = np.full((len(gpus), 2), -1, dtype=np.int64)
        for g in gpus:
            js = g.jobs
            if js:
                self.holders[g.index, 0] = pos.get(js[0], -1)
                if len(js) == 2:
                    self.holders[g.index, 1] = pos.get(js[1], -1)
        self._index_nodes()
        for j in jobs:
            self._set_host(j.job_id)
        self._hosts_dirty = True
        # per GPU: the first GPU of the host holding it alone (-1: none), so a policy can count hosts' GPUs per
        # node with one bincount (with `gpu_node`)
        self.solo_of = np.full(len(gpus), -1, dtype=np.int64)
        for h in self._hosts.values():
            self.solo_of[list(h.gpus)] = h.gpus[0]

    def _index_nodes(self, reuse: bool = False) -> None:
        """The live nodes' arrays: `node_gpus`, `node_row`, `node_size` and, per GPU, its live node's row in
        `node_gpus` (`gpu_node`; a lost node's: one past the last). With `reuse` (a node joined or was lost), from
        the last index's arrays (`_reindex_nodes`) when the nodes known then are still first, in order, the node
        size is unchanged and no GPU was drained or resumed since (`set_drained` reorders a node's GPUs)."""
        state = self.state
        objs = list(state.nodes.values())
        alive = np.fromiter((n.alive for n in objs), dtype=bool, count=len(objs))
        pos = np.flatnonzero(alive)  # the live nodes' places in `state.nodes`
        prev = getattr(self, "_node_objs", None)
        if reuse and prev is not None and len(pos) and self._drained is state.drained and len(objs) >= len(prev) \
                and all(map(is_, objs, prev)):
            if len(objs) > len(prev):
                more = objs[len(prev):]
                self._node_sizes = np.append(self._node_sizes, [len(n.gpus) for n in more]).astype(np.int64)
                self._node_names = np.append(self._node_names, np.array([n.name for n in more], dtype=object))
            if int(self._node_sizes[pos].max()) == self.node_size:
                self._reindex_nodes(objs, pos)
                return
        live = [objs[p] for p in pos.tolist()]
        self._node_objs, self._live_pos, self._drained = objs, pos, state.drained
        self._node_sizes = np.fromiter(map(len, (n.gpus for n in objs)), dtype=np.int64, count=len(objs))
        self._node_names = np.array([n.name for n in objs] + [None], dtype=object)[:-1]  # (1-d even for tuples)
        sizes = self._node_sizes[pos]
        width = int(sizes.max()) if len(live) else 1
        self.node_size = width
        self.node_gpus = np.full((len(live), width), -1, dtype=np.int64)  # GPU index per (live node, slot)
        rows = np.repeat(np.arange(len(live)), sizes)
        slots = np.arange(len(rows)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        flat = np.fromiter(chain.from_iterable(n.gpus for n in live), dtype=np.int64, count=len(rows))
        self.node_gpus[rows, slots] = flat
        self.node_row = {node.name: r for r, node in enumerate(live)}
        self.gpu_node = np.full(len(state.gpus), len(live), dtype=np.int64)
        self.gpu_node[flat] = rows

    def _reindex_nodes(self, objs: list, pos: np.ndarray) -> None:
        """`_index_nodes` from the last one's arrays: the rows of nodes live then and now are copied, a node
        live only now has its row read (a node never changes its GPUs: `ClusterState.add_node`); the same
        arrays as a fresh index."""
        row_of = np.full(len(objs), -1, dtype=np.int64)
        row_of[self._live_pos] = np.arange(len(self._live_pos))
        take = row_of[pos]
        width = self.node_size
        mat = self.node_gpus[take] if len(self.node_gpus) else np.full((len(pos), width), -1, dtype=np.int64)
        for r in np.flatnonzero(take < 0).tolist():
            gs = objs[int(pos[r])].gpus
            mat[r] = -1
            mat[r, : len(gs)] = gs
        self.node_gpus = mat
        self.node_row = dict(zip(self._node_names[pos].tolist(), range(len(pos))))
        held = mat >= 0
        self.gpu_node = np.full(len(self.state.gpus), len(pos), dtype=np.int64)
        self.gpu_node[mat[held]] = np.nonzero(held)[0]
        self._node_objs, self._live_pos = objs, pos

    def _set_row(self, job: Job, row: int | None) -> None:
        if row is None:
            if not self._free_rows:
                self._grow()
            row = self._free_rows.pop()
            self._row[job.job_id] = row
        self.jobs[row] = job
        self._held[row] = job.gpus
        running = job.state is JobState.RUNNING and job.step_time > 0
        self.left[row] = job.spec.iterations - job.done_iterations
        self.since[row] = job.progress_time
        self.rate[row] = 1.0 / job.step_time if running else 0.0
        self.solo[row] = self._solo_step(job)
        self.pausing[row] = job.state is JobState.PAUSING
        key = self._group_of(job)
        gid = self._group_ids.get(key)
        if gid is None:
            gid = self._group_ids[key] = len(self.groups)
            self.groups.append(key)
        self.gid[row] = gid
        self.tcode[row] = self._code[self.state.gpus[job.gpus[0]].gpu_type]
        if job.job_id in self._hosts:
            self._hosts_dirty = True  # a host's step time, progress or group may have moved

    def _drop_row(self, job_id: str, row: int) -> None:
        del self._row[job_id]
        self.jobs[row] = None
        self._held[row] = ()
        self.left[row] = self.since[row] = self.rate[row] = self.solo[row] = 0.0
        self.pausing[row] = False
        self._free_rows.append(row)

    def _grow(self) -> None:
        n = len(self.jobs)
        self.jobs += [None] * n
        self._held += [()] * n
        self.left, self.since, self.rate, self.solo = (np.concatenate([a, np.zeros(n)])
                                                        for a in (self.left, self.since, self.rate, self.solo))
        self.pausing = np.concatenate([self.pausing, np.zeros(n, dtype=bool)])
        self.gid = np.concatenate([self.gid, np.zeros(n, dtype=np.int64)])
        self.tcode = np.concatenate([self.tcode, np.zeros(n, dtype=np.int64)])
        self._free_rows += list(range(2 * n - 1, n - 1, -1))

    def _set_host(self, job_id: str) -> None:
        """Re-derive whether (and on which GPUs) the job is a host; mark the host arrays stale if that moved."""
        row = self._row.get(job_id)
        old = self._hosts.get(job_id)
        new = None
        if row is not None and not self.pausing[row]:
            gpus = self.state.gpus
            job = self.jobs[row]
            solo = tuple(sorted(g for g in job.gpus if len(gpus[g].jobs) == 1))
            if solo:
                if old is not None and old.gpus == solo and old.index == row and old.job is job:
                    new = old
                else:
                    nodes: dict[str, list[int]] = {}
                    for g in solo:
                        nodes.setdefault(gpus[g].node, []).append(g)
                    new = Host(job, row, solo, nodes)
        if new is old:
            return
        if old is not None and self._host_obj.get(old.gpus[0]) is old:  # (another host may have its slot now)
            g0 = old.gpus[0]
            self._host_at[g0] = -1
            self._host_n[g0] = 0
            del self._host_obj[g0]
        if new is None:
            del self._hosts[job_id]
        else:
            self._hosts[job_id] = new
            g0 = new.gpus[0]
            self._host_at[g0] = row
            self._host_n[g0] = len(new.gpus)
            self._host_obj[g0] = new
        self._hosts_dirty = True

    # -- host arrays -------------------------------------------------------------------------------------
    def _index_hosts(self) -> None:
        first = np.flatnonzero(self._host_at >= 0)  # hosts in order of their first GPU
        self._first = first
        self._host_rows = self._host_at[first]
        self._host_gpus = self._host_n[first]
        self._host_group = self.gid[self._host_rows]
        self._host_code = self.tcode[self._host_rows]
        self._host_list = None
        self._hosts_dirty = False
        self.host_version += 1

    def _fresh(self) -> None:
        if self._hosts_dirty:
            self._index_hosts()

    @property
    def hosts(self) -> list[Host]:
        """The hosts in order of their first GPU (column order of the host arrays)."""
        self._fresh()
        if self._host_list is None:
            obj = self._host_obj
            self._host_list = [obj[g] for g in self._first.tolist()]
        return self._host_list

    def first_gpu(self, hosts: list[int]) -> np.ndarray:
        """The first GPU of each of these hosts (indices into `hosts`): their keys in `solo_of`."""
        self._fresh()
        return self._first[np.asarray(hosts, dtype=np.int64)]

    def host(self, i: int) -> Host:
        """`hosts[i]` without building the list."""
        self._fresh()
        return self._host_obj[int(self._first[i])]

    @property
    def host_rows(self) -> np.ndarray:
        self._fresh()
        return self._host_rows

    @property
    def host_gpus(self) -> np.ndarray:
        self._fresh()
        return self._host_gpus

    @property
    def host_group(self) -> np.ndarray:
        self._fresh()
        return self._host_group

    @property
    def host_code(self) -> np.ndarray:
        """Each host's GPU type, as an index into `type_names`."""
        self._fresh()
        return self._host_code

    def row(self, job_id: str) -> int | None:
        """The job's row in the job arrays (None: it holds no GPU)."""
        return self._row.get(job_id)

    # -- what a pass reads -------------------------------------------------------------------------------
    def remaining_iters(self, now: float) -> np.ndarray:
        """Iterations left per job row at `now` (extrapolated while RUNNING, as `Job.iterations_at`); kept until
        `now` or the arrays move (a pass asks twice), so the caller must not write to it."""
        if self._iters_at != (now, self.version):
            self._iters = np.maximum(0.0, self.left - np.maximum(0.0, now - self.since) * self.rate)
            self._iters_at = (now, self.version)
        return self._iters

    def free_times(self, now: float) -> np.ndarray:
        """Seconds from `now` until each live node's GPUs hold no job, shape (live nodes, node size), each row
        sorted; a GPU comes free when the last of its jobs ends (remaining iterations x solo step time; a job
        saving a checkpoint ends now). Slots past a smaller node's GPUs are +inf."""
        r = self.remaining_iters(now) * self.solo
        r[self.pausing] = 0.0
        r = np.append(r, 0.0)  # row -1: no job
        per_gpu = np.maximum(r[self.holders[:, 0]], r[self.holders[:, 1]])
        per_gpu = np.append(per_gpu, np.inf)  # GPU -1: a slot the node does not have
        return np.sort(per_gpu[self.node_gpus], axis=1)
