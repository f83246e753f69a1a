"""Who holds which GPU, as arrays, for the sharing policies: single-job hosts, remaining work, GPU free times.

Built from the state and kept while `ClusterState.version` stays the same (the engine bumps it on every
event that can move a job or change what is known of its progress, and assign/release bump it); between
two builds a pass only re-evaluates remaining work at its own `now`, vectorised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from meshsched.state import ClusterState, Job, JobState


@dataclass
class Host:
    """A job holding GPUs of which `gpus` hold only it: where a new job may share."""

    job: Job
    index: int  # row in Occupancy's job arrays
    gpus: tuple[int, ...]
    nodes: dict[str, list[int]]


class Occupancy:
    """Arrays over the jobs holding GPUs (LOADING, RUNNING, PAUSING) and over the GPUs of live nodes."""

    def current(self, state: ClusterState) -> bool:
        """Still describes `state` (the same object, unchanged since the build)."""
        return state is self.state and state.version == self.version

    def __init__(
        self,
        state: ClusterState,
        holding: Iterable[Job],
        solo_step: Callable[[Job], float],
        group_of: Callable[[Job], tuple],
    ) -> None:
        self.state, self.version = state, state.version
        jobs = [j for j in holding if j.gpus]
        self.jobs = jobs
        self.left = np.array([j.spec.iterations - j.done_iterations for j in jobs], dtype=float)
        self.since = np.array([j.progress_time for j in jobs], dtype=float)
        running = [j.state is JobState.RUNNING and j.step_time > 0 for j in jobs]
        self.rate = np.array([1.0 / j.step_time if r else 0.0 for j, r in zip(jobs, running)], dtype=float)
        self.solo = np.array([solo_step(j) for j in jobs], dtype=float)
        self.pausing = np.array([j.state is JobState.PAUSING for j in jobs], dtype=bool)
        pos = {j.job_id: i for i, j in enumerate(jobs)}
        gpus = state.gpus
        # holders[g] = (first job row, second job row); -1 = none (indexes a trailing 0 in `free_times`)
        self.holders = np.full((len(gpus), 2), -1, dtype=np.int64)
        solo_gpus: dict[int, list[int]] = {}
        for g in gpus:
            js = g.jobs
            if js:
                i = pos.get(js[0], -1)
                self.holders[g.index, 0] = i
                if len(js) == 2:
                    self.holders[g.index, 1] = pos.get(js[1], -1)
                elif i >= 0:
                    solo_gpus.setdefault(i, []).append(g.index)
        live = [n for n in state.nodes.values() if n.alive]
        width = max((n.size for n in live), default=1)
        self.node_size = width
        self.node_gpus = np.full((len(live), width), -1, dtype=np.int64)  # GPU index per (live node, slot)
        for r, n in enumerate(live):
            self.node_gpus[r, : n.size] = n.gpus
        hosts = []
        for i, gs in solo_gpus.items():
            if self.pausing[i]:
                continue
            nodes: dict[str, list[int]] = {}
            for g in gs:
                nodes.setdefault(gpus[g].node, []).append(g)
            hosts.append(Host(jobs[i], i, tuple(gs), nodes))
        hosts.sort(key=lambda h: h.gpus[0])
        self.hosts = hosts
        self.host_rows = np.array([h.index for h in hosts], dtype=np.int64)
        self.host_gpus = np.array([len(h.gpus) for h in hosts], dtype=np.int64)
        groups: dict[tuple, int] = {}
        self.host_group = np.array([groups.setdefault(group_of(h.job), len(groups)) for h in hosts], dtype=np.int64)
        self.groups = list(groups)
        self.xi_cache: dict[tuple, tuple] = {}  # for the policy: per-group answers that depend on hosts only

    def remaining_iters(self, now: float) -> np.ndarray:
        """Iterations left per job row at `now` (extrapolated while RUNNING, as `Job.iterations_at`)."""
        return np.maximum(0.0, self.left - np.maximum(0.0, now - self.since) * self.rate)

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
