"""The policy's wait queue, as the engine keeps it: queued job ids sorted by (policy key, arrival sequence), with
what `ClusterView` reads alongside (the GPUs each job asks for, in queue order; each job's key; how many queued
jobs ask for each GPU count). Only the engine changes it."""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Iterator


class WaitQueue:
    __slots__ = ("entries", "needs", "keys", "sizes", "by_need", "_seq")

    def __init__(self) -> None:
        self.entries: list[tuple[tuple, int, str]] = []  # (policy key, arrival seq, job id), sorted
        self.needs: list[int] = []  # GPUs asked for, in `entries` order (a policy sums a prefix: ClusterView)
        self.keys: dict[str, tuple[tuple, int]] = {}  # job -> its (policy key, arrival seq)
        self.sizes: Counter[int] = Counter()  # GPU count -> queued jobs asking for that many
        self.by_need: dict[int, list[tuple[tuple, int, str]]] = {}  # GPU count -> its jobs' `entries`, sorted
        self._seq = 0

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, job_id: str, key: tuple, gpus: int) -> None:
        """Queue `job_id` (asking for `gpus`) behind every job of an equal or better `key`."""
        self._seq += 1
        self.keys[job_id] = (key, self._seq)
        entry = (key, self._seq, job_id)
        i = bisect.bisect_right(self.entries, entry)
        self.entries.insert(i, entry)
        self.needs.insert(i, gpus)
        self.sizes[gpus] += 1
        same = self.by_need.get(gpus)
        if same is None:
            self.by_need[gpus] = [entry]
        else:
            same.insert(bisect.bisect_right(same, entry), entry)

    def remove(self, job_id: str, gpus: int) -> None:
        key, seq = self.keys.pop(job_id)
        i = bisect.bisect_left(self.entries, (key, seq))
        del self.entries[i]
        del self.needs[i]
        n = self.sizes[gpus] - 1
        if n:
            self.sizes[gpus] = n
            same = self.by_need[gpus]
            del same[bisect.bisect_left(same, (key, seq))]
        else:
            del self.sizes[gpus]
            del self.by_need[gpus]

    def ahead(self, job_id: str) -> Iterator[str]:
        """The jobs queued before `job_id`, best first (without copying the queue's head)."""
        pos = bisect.bisect_left(self.entries, self.keys[job_id])
        return (j for _, _, j in itertools.islice(self.entries, pos))
