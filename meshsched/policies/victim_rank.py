"""SRTF's victims, worst first, without ranking every running job on every pass.

`ShortestRemaining.worst_first` computes every holding job's remaining time and sorts them all; a preemptive pass
then reads only the first few (`room_by_eviction` stops at the first job that is not strictly worse than the queued
one, or once room is found). `RemainingRank` keeps the holding jobs in a heap across passes, keyed by an UPPER BOUND
of (remaining time, submit time): while a job's progress fields do not change, its remaining time only falls as
`now` grows (every step of the computation is monotone, in floating point too), so a key computed at an earlier
`now` bounds it from above. A pass pops the largest bound, recomputes that job's key at `now` if it is older, and
yields it once its key is exact and still the largest (the classic lazy heap). Jobs whose fields may have changed
are the ones the state's change log names (`ClusterState.changed_since`; every start, pause, release and progress
report touches its job); those are re-read, and anything the log cannot tell rebuilds from scratch.

The order is exactly `worst_first`'s: (remaining, submit time) descending, and jobs with equal keys in the order
`view.holding()` lists them (the stable sort's order).
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush, heapreplace
from itertools import count
from typing import Iterator

from meshsched.state import Job, JobState

_RUNNING, _LOADING = JobState.RUNNING, JobState.LOADING


def _neg_key(j: Job, now: float) -> tuple[float, float]:
    """-(remaining, submit time): the same arithmetic as `ShortestRemaining.worst_first`, negated for a min-heap."""
    spec = j.spec
    done = j.done_iterations
    if j.state is _RUNNING and j.step_time > 0:
        done = min(done + (now - j.progress_time) / j.step_time, spec.iterations)
    return -((spec.iterations - done) * j.ideal_step_time), -spec.submit_time


class RemainingRank:
    """A lazy, exact `ShortestRemaining.worst_first` over a view's holding jobs, kept between passes."""

    def __init__(self) -> None:
        self._state = None  # the ClusterState followed
        self._version = -1
        self._now = float("-inf")
        self._heap: list = []  # (-remaining, -submit, uid, at, job): the key is exact at `at`, a bound later
        self._live: dict[str, int] = {}  # job id -> uid of its current heap entry
        self._out: list = []  # entries handed out in the current pass (popped; pushed back at the next sync)
        self._uid = count()

    def ranked(self, view, now: float) -> _Ranked:
        """The holding jobs but PAUSING ones as (priority, job), worst first, produced as they are read."""
        self._sync(view, now)
        return _Ranked(self, view, now)

    # ------------------------------------------------------------------ following the state

    def _sync(self, view, now: float) -> None:
        state = view.cluster_state()
        changed = None
        if state is self._state and now >= self._now:
            changed = state.changed_since(self._version)
        if changed is None or len(self._heap) + len(self._out) > 4 * len(self._live) + 64:
            self._rebuild(view, now)
        else:
            heap, live, uid = self._heap, self._live, self._uid
            jobs = state.jobs
            for jid in changed:
                j = jobs.get(jid)
                if j is not None and (j.state is _RUNNING or j.state is _LOADING):
                    r, s = _neg_key(j, now)
                    u = live[jid] = next(uid)
                    heappush(heap, (r, s, u, now, j))
                else:
                    live.pop(jid, None)
            # The entries the last pass read go back keyed at `now` (the worst jobs: the likeliest read again, and
            # read at once when their key is exact); those since superseded or stopped are dropped here.
            for e in self._out:
                j = e[4]
                if live.get(j.spec.job_id) == e[2]:
                    heappush(heap, e if e[3] == now else (*_neg_key(j, now), e[2], now, j))
        self._out = []
        self._state, self._version, self._now = state, state.version, now

    def _rebuild(self, view, now: float) -> None:
        heap, live, uid = [], {}, self._uid
        for j in view.holding():
            if j.state is not JobState.PAUSING:
                r, s = _neg_key(j, now)
                u = live[j.job_id] = next(uid)
                heap.append((r, s, u, now, j))
        heapify(heap)
        self._heap, self._live = heap, live

    # ------------------------------------------------------------------ producing the order

    def _pop_exact(self, now: float):
        """Pop the entry with the largest exact key at `now` (None when no job is left)."""
        heap, live, uid = self._heap, self._live, self._uid
        while heap:
            e = heap[0]
            j = e[4]
            jid = j.spec.job_id
            if live.get(jid) != e[2]:
                heappop(heap)  # superseded by a newer entry, or the job stopped holding
                continue
            if e[3] == now:
                return heappop(heap)
            spec = j.spec  # _neg_key, inlined (this runs for most jobs a pass reads)
            done = j.done_iterations
            if j.state is _RUNNING and j.step_time > 0:
                done = min(done + (now - j.progress_time) / j.step_time, spec.iterations)
            u = live[jid] = next(uid)
            heapreplace(heap, (-((spec.iterations - done) * j.ideal_step_time), -spec.submit_time, u, now, j))
        return None

    def _next_group(self, view, now: float) -> list:
        """The next entries in worst-first order: one job, or every job sharing its exact key (holding order)."""
        first = self._pop_exact(now)
        if first is None:
            return []
        group = [first]
        heap = self._heap
        while heap and heap[0][0] == first[0] and heap[0][1] == first[1]:
            e = self._pop_exact(now)  # the largest exact key left: equal to `first`'s or below it
            if e is None:
                break
            if e[0] == first[0] and e[1] == first[1]:
                group.append(e)
            else:
                heappush(heap, e)
                break
        if len(group) > 1:
            pos = {j.job_id: i for i, j in enumerate(view.holding())}
            group.sort(key=lambda e: pos[e[4].job_id])
        self._out.extend(group)
        return group


class _Ranked:
    """One pass's worst-first list, extended as it is read; it may be read again from the start. Valid until the
    next `RemainingRank.ranked` call (the engine changes nothing during a pass)."""

    __slots__ = ("_rank", "_view", "_now", "_items", "_done")

    def __init__(self, rank: RemainingRank, view, now: float) -> None:
        self._rank, self._view, self._now = rank, view, now
        self._items: list[tuple[tuple, Job]] = []
        self._done = False

    def __iter__(self) -> Iterator[tuple[tuple, Job]]:
        items = self._items
        i = 0
        while True:
            n = len(items)
            while i < n:
                yield items[i]
                i += 1
            if self._done:
                return
            group = self._rank._next_group(self._view, self._now)
            if not group:
                self._done = True
                return
            items.extend([((-e[0], -e[1]), e[4]) for e in group])
