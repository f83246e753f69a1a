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

Successive passes read much the same few jobs (four in five of the jobs read on Philly were read by the pass
before), so what a pass handed out is kept apart, keyed again at the next pass's `now` and sorted (the front, as
many jobs as either of the last two passes read; the rest goes back on the heap), and a pass reads the front's jobs
in runs, as far as the heap's largest bound, instead of one heap pop each.

The order is exactly `worst_first`'s: (remaining, submit time) descending, and jobs with equal keys in the order
`view.holding()` lists them (the stable sort's order).
"""

from __future__ import annotations

from bisect import bisect_left
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
        self._live: dict[str, int] = {}  # job id -> uid of its current entry (in the heap or the front)
        # What the last pass handed out, keyed again at this pass's `now` and sorted (the worst jobs: the likeliest
        # read again), merged with the heap as they are read; `_fi`: the first not handed out yet
        self._front: list = []
        self._fi = 0
        self._last: _Ranked | None = None  # the last pass's list: what it handed out, and how much of it was read
        self._read_before = 0  # how many jobs the pass before the last read
        self._uid = count()

    def ranked(self, view, now: float) -> _Ranked:
        """The holding jobs but PAUSING ones as (priority, job), worst first, produced as they are read."""
        self._sync(view, now)
        self._last = _Ranked(self, view, now)
        return self._last

    # ------------------------------------------------------------------ following the state

    def _sync(self, view, now: float) -> None:
        state = view.cluster_state()
        changed = None
        if state is self._state and now >= self._now:
            changed = state.changed_since(self._version)
        last = self._last
        out = [] if last is None else last.entries
        if changed is None or len(self._heap) + len(out) + len(self._front) > 4 * len(self._live) + 64:
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
            # The front: what the last pass handed out and the front it did not reach, keyed at `now` and sorted, as
            # many as either of the last two passes read (passes on arrivals read a few, on releases dozens); the
            # rest goes back on the heap; entries since superseded or stopped are dropped.
            read = last.read if last is not None else 0
            want = max(read, self._read_before)
            self._read_before = read
            front = []
            for e in out + self._front[self._fi:]:
                j = e[4]
                spec = j.spec
                if live.get(spec.job_id) != e[2]:
                    continue
                if e[3] == now:
                    front.append(e)
                    continue
                done = j.done_iterations  # (`_neg_key`, inline: this runs for every entry a pass handed out)
                if j.state is _RUNNING and j.step_time > 0:
                    done = min(done + (now - j.progress_time) / j.step_time, spec.iterations)
                front.append((-((spec.iterations - done) * j.ideal_step_time), e[1], e[2], now, j))
            front.sort()  # (uids differ: jobs are never compared)
            for i in range(want, len(front)):
                heappush(heap, front[i])
            del front[want:]
            self._front, self._fi = front, 0
        self._last = None
        self._state, self._version, self._now = state, state.version, now

    def _rebuild(self, view, now: float) -> None:
        heap, live, uid = [], {}, self._uid
        for j in view.holding():
            if j.state is not JobState.PAUSING:
                r, s = _neg_key(j, now)
                u = live[j.job_id] = next(uid)
                heap.append((r, s, u, now, j))
        heapify(heap)
        self._heap, self._live, self._front, self._fi = heap, live, [], 0

    # ------------------------------------------------------------------ producing the order

    def _pop_exact(self, now: float):
        """Take the entry with the largest exact key at `now` from the front or the heap (None when no job is
        left). A heap entry's stored key only rises to its exact one, so a front entry below it comes first."""
        heap, live, uid, front, fi = self._heap, self._live, self._uid, self._front, self._fi
        f = front[fi] if fi < len(front) else None
        while heap:
            e = heap[0]
            j = e[4]
            jid = j.spec.job_id
            if live.get(jid) != e[2]:
                heappop(heap)  # superseded by a newer entry, or the job stopped holding
                continue
            if f is not None and (f[0] < e[0] or (f[0] == e[0] and f[1] < e[1])):
                break
            if e[3] == now:
                if f is not None and f < e:
                    break
                return heappop(heap)
            r, s = _neg_key(j, now)
            u = live[jid] = next(uid)
            heapreplace(heap, (r, s, u, now, j))
        if f is not None:
            self._fi = fi + 1
        return f

    def _next_group(self, view, now: float) -> list:
        """The next entries in worst-first order: one job, or every job sharing its exact key (holding order)."""
        first = self._pop_exact(now)
        if first is None:
            return []
        group = [first]
        heap, front, r, s = self._heap, self._front, first[0], first[1]
        while True:  # the next keys are `first`'s or larger (the heap's stored ones too): ties only where equal
            fi = self._fi
            if fi < len(front) and front[fi][0] == r and front[fi][1] == s:
                group.append(front[fi])
                self._fi = fi + 1
            elif heap and heap[0][0] == r and heap[0][1] == s:
                e = self._pop_exact(now)  # the largest exact key left: equal to `first`'s or below it
                if e is None:
                    break
                if e[0] == r and e[1] == s:
                    group.append(e)
                elif self._fi != fi:
                    self._fi = fi  # (a front entry: it stays)
                    break
                else:
                    heappush(heap, e)
                    break
            else:
                break
        if len(group) > 1:
            pos = {j.job_id: i for i, j in enumerate(view.holding())}
            group.sort(key=lambda e: pos[e[4].job_id])
        return group

    def _next_run(self, view, now: float) -> list:
        """The next entries in worst-first order: the front's, as they stand, up to the heap's first stored key or
        the first tie among them; else `_next_group`'s."""
        front, fi = self._front, self._fi
        if fi < len(front):
            heap, live = self._heap, self._live
            while heap and live.get(heap[0][4].spec.job_id) != heap[0][2]:
                heappop(heap)  # superseded by a newer entry, or the job stopped holding
            end = bisect_left(front, (heap[0][0], heap[0][1]), fi) if heap else len(front)
            for i in range(fi, end - 1):  # (equal keys go in holding order: `_next_group`)
                if front[i][0] == front[i + 1][0] and front[i][1] == front[i + 1][1]:
                    end = i
                    break
            if end > fi:
                self._fi = end
                return front[fi:end]
        return self._next_group(view, now)


class _Ranked:
    """One pass's worst-first list, extended as it is read; it may be read again from the start. Valid until the
    next `RemainingRank.ranked` call (the engine changes nothing during a pass)."""

    __slots__ = ("_rank", "_view", "_now", "_items", "entries", "read", "_done")

    def __init__(self, rank: RemainingRank, view, now: float) -> None:
        self._rank, self._view, self._now = rank, view, now
        self._items: list[tuple[tuple, Job]] = []
        self.entries: list = []  # the rank's entries behind `_items`, in the same order
        self.read = 0  # how many items were read (what the next pass's front is sized by)
        self._done = False

    def __iter__(self) -> Iterator[tuple[tuple, Job]]:
        items = self._items
        i = 0
        while True:
            n = len(items)
            while i < n:
                if i == self.read:
                    self.read = i + 1
                yield items[i]
                i += 1
            if self._done:
                return
            run = self._rank._next_run(self._view, self._now)
            if not run:
                self._done = True
                return
            items.extend([((-e[0], -e[1]), e[4]) for e in run])
            self.entries.extend(run)
