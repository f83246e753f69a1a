"""The sharing policies' occupancy arrays (`occupancy.Occupancy`) kept without a full rebuild after a change the
state's log cannot name, a node joining or lost included.

`ClusterState.changed_since` answers None after a change not tied to one job: every event without a job id (a
timer tick, a fitted model, forgotten jobs, a drain) bumps the version so, and so does a node joining or lost
(the log names it: `changes_since`). `Occupancy` then rebuilds every array from every holder, which on a large
mesh (10,240 GPUs, ~3,800 holders) takes 40-150 ms of one decision. `FollowingOccupancy` keeps what it read of
each holder (the job, its GPUs, state, progress, step time, settings and spec) and, after an unnamed change,
re-reads only the holders whose reading moved, and the ones that stopped holding, as if the log had named them
(`Occupancy.apply`); the arrays end the same as a rebuild's (rows aside). When the live nodes changed, the per-GPU
arrays grow by a new node's GPUs (holding nothing) and the live nodes' arrays are re-read first; when the log
names the node change and every job besides (`ClusterState.changes_since`), only those jobs are re-read. It
rebuilds only when a new GPU type came or when more than half the holders moved (`Occupancy.rebuild_pays`).
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter, is_

import numpy as np

from meshsched.policies.occupancy import Occupancy
from meshsched.state import Job

# what the arrays read of a holder, besides the job object itself: any difference means its row is re-read
reading = attrgetter("gpus", "state", "done_iterations", "progress_time", "step_time", "ideal_step_time", "exec",
                     "spec")


class FollowingOccupancy(Occupancy):
    """`Occupancy` that answers an unnamed change by comparing each holder's reading (see the module)."""

    def _build(self, holding: Iterable[Job]) -> None:
        self._read: dict[str, tuple] = {}  # job id: (the job, its reading)
        self._seen: list[Job] = list(holding)  # the holders as last read, in their order
        super()._build(self._seen)
        self._nodes_seen = self._nodes_now()

    def _nodes_now(self) -> tuple:
        state = self.state
        return len(state.gpus), tuple(n.alive for n in state.nodes.values())

    def _set_row(self, job: Job, row: int | None) -> None:
        super()._set_row(job, row)
        self._read[job.job_id] = (job, reading(job))

    def _drop_row(self, job_id: str, row: int) -> None:
        super()._drop_row(job_id, row)
        self._read.pop(job_id, None)

    def refresh(self, holding: Iterable[Job]) -> None:
        state = self.state
        if state.version == self.version:
            return
        got = state.changes_since(self.version)
        if got is None or got[1]:  # the log cannot tell, or a node joined or was lost
            nodes = self._nodes_now()
            if nodes != self._nodes_seen and not self._renode(nodes):
                self._build(holding)
                return
        if got is None:  # compare every holder's reading
            changed = self._moved(holding)
        else:  # the log names every job that moved (a node's jobs were released, so named, before it was lost)
            changed = got[0]
        if self.rebuild_pays(len(changed)):
            self._build(holding)
            return
        self.apply(changed)
        self._seen = list(holding)

    def _renode(self, nodes: tuple) -> bool:
        """Follow a node that joined or was lost without a rebuild: the per-GPU arrays grow by the new GPUs
        (holding nothing yet), the live nodes' rows are re-read; the jobs the change moved are found by their
        readings. False (rebuild) when a new GPU type came (the type codes would move)."""
        state = self.state
        gpus = state.gpus
        grow = len(gpus) - len(self.holders)
        if not {g.gpu_type for g in gpus[len(gpus) - grow:]} <= set(self.type_names):  # (GPUs are never removed)
            return False
        if grow:
            self.holders = np.concatenate([self.holders, np.full((grow, 2), -1, dtype=np.int64)])
            self.solo_of = np.concatenate([self.solo_of, np.full(grow, -1, dtype=np.int64)])
            self._host_at = np.concatenate([self._host_at, np.full(grow, -1, dtype=np.int64)])
            self._host_n = np.concatenate([self._host_n, np.zeros(grow, dtype=np.int64)])
        self._index_nodes(reuse=True)
        self._hosts_dirty = True
        self._nodes_seen = nodes
        return True

    def _moved(self, holding: Iterable[Job]) -> set[str]:
        """The holders whose reading moved (new ones included), and the jobs that stopped holding."""
        read = self._read
        now, seen = list(holding), self._seen
        if len(now) == len(seen) and all(map(is_, now, seen)):  # the same job objects hold GPUs: only their
            return {jid for jid, (job, r) in read.items() if reading(job) != r}  # readings may have moved
        out, n = set(), 0
        for j in holding:
            n += 1
            jid = j.spec.job_id  # (`Job.job_id`, without the property's call)
            r = read.get(jid)
            if r is None or r[0] is not j or r[1] != reading(j):
                out.add(jid)
        if n - sum(1 for jid in out if jid not in read) != len(read):  # some row's job holds no GPU now
            ids = {j.spec.job_id for j in holding}
            out.update(jid for jid in read if jid not in ids)
        return out
