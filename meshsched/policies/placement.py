"""Where a job goes: exclusive GPUs on the fewest nodes that can hold it, best-fit so large holes stay whole.

A job never spreads over more nodes than its size requires (ceil(gpus / largest node)): spread
placements are several times slower (Gavel's unconsolidated measurements), so the job waits instead,
as Philly's locality-constrained scheduler did. On a cluster of mixed GPU types a job's GPUs are all of one
type (a job spread over a V100 and a K80 runs at the K80's pace and mixes kernels built for each).
"""

from __future__ import annotations

from operator import itemgetter

from meshsched.state import ClusterState


def fewest_nodes(free: dict[str, int], want: int, most: int | None = None) -> list[tuple[str, int]] | None:
    """Choose (node, count) pairs covering `want` GPUs on as few nodes as possible.

    If one node can hold the job, the fullest such node is used (best fit); otherwise the
    emptiest nodes are taken whole and the remainder goes to the best-fitting node.
    Returns None when the free GPUs do not add up to `want`, or when the plan would need more than `most` nodes.
    """
    if want <= 0 or sum(free.values()) < want:
        return None
    best, best_free = None, 1 << 30
    for name, n in free.items():
        if want <= n < best_free:
            best, best_free = name, n
    if best is not None:
        return [(best, want)]
    # No node holds it all: the emptiest nodes whole (most free first, ties by the larger name), while even the
    # emptiest node left cannot hold the rest; one sort instead of a max() per node taken.
    ranked = sorted(free.items(), key=_count_then_name, reverse=True)
    chosen: list[tuple[str, int]] = []
    remaining = want
    for name, n in ranked:
        if n >= remaining:
            break
        chosen.append((name, n))
        remaining -= n
        if most is not None and len(chosen) >= most:
            return None  # the rest needs one more node at least
    taken = {name for name, _ in chosen}
    best, best_free = None, 1 << 30
    for name, n in free.items():
        if remaining <= n < best_free and name not in taken:
            best, best_free = name, n
    chosen.append((best, remaining))
    return chosen


_count_then_name = itemgetter(1, 0)
_count = itemgetter(1)


class Planner:
    """Scratch allocation of free GPUs during one scheduling pass; the state is not touched."""

    __slots__ = ("_state", "_free", "_own", "_taken", "_node_size", "_type", "free_total", "_top")

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        # the state's free map, shared until this pass first claims GPUs (`_claim`: most passes claim none)
        self._free, self.free_total = state.free_summary()  # free_total: free GPUs still unclaimed in this pass
        self._own = False
        self._taken: set[int] = set()
        self._node_size = max(state.largest_node, 1)
        self._type = {n.name: n.gpu_type for n in state.nodes.values()} if len(state.gpu_types) > 1 else None
        self._top = -1  # the most free GPUs on one node, once `take` needed it (-1: not known since the last claim)

    def _claim(self) -> dict[str, int]:
        """This pass's own free map, to change (copied from the state's at the first claim)."""
        self._top = -1
        if not self._own:
            self._free, self._own = dict(self._free), True
        return self._free

    def free_map(self) -> dict[str, int]:
        """Free GPUs per node still unclaimed in this pass (a copy)."""
        return dict(self._free)

    @property
    def node_size(self) -> int:
        return self._node_size

    def top(self) -> int:
        """The most free GPUs still unclaimed on one node (kept until the pass next claims GPUs)."""
        top = self._top
        if top < 0:
            top = self._top = max(self._free.values(), default=0)
        return top

    def compact(self, free: dict[str, int], want: int, top: int | None = None) -> list[tuple[str, int]] | None:
        """`fewest_nodes` over a hypothetical free map, None unless it is as compact as `take` requires (`top`: the
        map's largest count, where the caller knows it)."""
        if want <= self._node_size:  # one node: best fit
            if top is not None and top < want:
                return None
            if free:  # the first of the fullest nodes, when even that one holds `want` (always for one GPU)
                first = min(free.items(), key=_count)
                if first[1] >= want:
                    return [(first[0], want)]
            best, best_free = None, 1 << 30
            for name, n in free.items():
                if want <= n < best_free:
                    best, best_free = name, n
            return None if best is None else [(best, want)]
        most = -(-want // self._node_size)
        if most * (max(free.values(), default=0) if top is None else top) < want:
            return None  # (`most` nodes hold `want` nowhere: no plan that compact, whatever the GPU types)
        if self._type is None:
            return fewest_nodes(free, want, most)
        best = None
        for t in sorted(set(self._type.values())):  # one GPU type per job
            plan = fewest_nodes({n: c for n, c in free.items() if self._type[n] == t}, want, most)
            if plan is not None and len(plan) <= most and (best is None or len(plan) < len(best)):
                best = plan
        return best

    def withhold(self, node: str, count: int) -> int:
        """Keep up to `count` free GPUs of `node` out of this pass (reserved for a waiting job); returns how many."""
        free = self._claim()
        have = free.get(node, 0)
        got = min(have, count)
        self.free_total -= got
        if have - got:
            free[node] = have - got
        else:
            free.pop(node, None)
        return got

    def withhold_gpus(self, node: str, count: int) -> list[int]:
        """`withhold` up to `count` free GPUs of `node` and claim which ones (never handed out again this pass)."""
        got = self.withhold(node, count)
        state, taken = self._state, self._taken
        picked = [g for g in state.nodes[node].gpus if not state.gpus[g].jobs and g not in taken][:got]
        taken.update(picked)
        return picked

    def take(self, want: int) -> tuple[int, ...] | None:
        """Reserve `want` free GPUs on the fewest nodes; None if they cannot be had that compactly now."""
        top = self.top()
        if top < want <= self._node_size:
            return None  # (no node has `want` free: most of a pass's tries fail so; `compact` bounds larger jobs)
        plan = self.compact(self._free, want, top)
        if plan is None:
            return None
        state, free = self._state, self._claim()
        picked: list[int] = []
        for node, count in plan:
            got = 0
            for g in state.nodes[node].gpus:
                if not state.gpus[g].jobs and g not in self._taken:
                    picked.append(g)
                    got += 1
                    if got == count:
                        break
            left = free[node] - count
            if left:
                free[node] = left
            else:
                del free[node]
        self._taken.update(picked)
        self.free_total -= want
        return tuple(picked)


class Unplaced:
    """The GPU counts one pass could not place, for a placement whose failures are monotone (`monotone`).

    With compact placement a count of N GPUs goes on m = ceil(N / node size) nodes at fewest and fits exactly
    when the m nodes with the most free GPUs hold N; the free GPUs only shrink in a pass. So a failure at N on m
    nodes says those m nodes hold N - 1 at most, and any j >= m nodes j (N - 1) / m at most (each node past the
    m-th holds no more than their mean): a count M on j nodes is ruled out when M m > j (N - 1). On as many nodes
    that is every count of N or more; on more nodes, not always: 8 GPUs do not fit where two nodes have 6 free
    each, 12 do (and 16 do not). `blocks(n)`: whether n is ruled out; `ruled_out`: the queued counts (of the
    cluster's size at most) that are, kept at each failure (what a walk over the queue reads: no call per job);
    `every` (after `failed`): whether every queued count is."""

    __slots__ = ("_size", "_least", "_queued", "_total", "every", "ruled_out")

    def __init__(self, node_size: int, queued, total: int) -> None:
        self._size = max(node_size, 1)
        self._least: dict[int, int] = {}  # nodes spanned -> the least count that failed on that many
        self._queued = queued  # the queue's distinct GPU counts (read at each failure)
        self._total = total  # GPUs in the cluster: a larger count never runs (the walks pass it by)
        self.every = False
        self.ruled_out: set[int] = set()

    def blocks(self, need: int) -> bool:
        least = self._least
        if not least:
            return False
        j = -(-need // self._size)  # (Planner.compact's `most`)
        for m, n in least.items():  # (a loop, not any(): asked for every queued job a preemptive pass walks)
            if m <= j and need * m > j * (n - 1):
                return True
        return False

    def failed(self, need: int) -> None:
        span, size = -(-need // self._size), self._size
        if need < self._least.get(span, need + 1):
            self._least[span] = need
            # A count ruled out stays so (the least failures only fall), and one that was not is ruled out now only
            # by this failure (`blocks` with the one entry that changed).
            out, total, every, most = self.ruled_out, self._total, True, need - 1
            for n in self._queued:
                if n <= total and n not in out:
                    j = -(-n // size)
                    if span <= j and n * span > j * most:
                        out.add(n)
                    else:
                        every = False
            self.every = every
