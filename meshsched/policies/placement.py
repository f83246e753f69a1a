"""Where a job goes: exclusive GPUs on the fewest nodes, best-fit so large holes stay whole."""

from __future__ import annotations

from meshsched.state import ClusterState


def fewest_nodes(free: dict[str, int], want: int) -> list[tuple[str, int]] | None:
    """Choose (node, count) pairs covering `want` GPUs on as few nodes as possible.

    If one node can hold the job, the fullest such node is used (best fit); otherwise the
    emptiest nodes are taken whole and the remainder goes to the best-fitting node.
    Returns None when the free GPUs do not add up to `want`.
    """
    if want <= 0 or sum(free.values()) < want:
        return None
    left = dict(free)
    chosen: list[tuple[str, int]] = []
    remaining = want
    while remaining:
        best = None
        best_free = 1 << 30
        for name, n in left.items():
            if remaining <= n < best_free:
                best, best_free = name, n
        if best is not None:
            chosen.append((best, remaining))
            return chosen
        name = max(left, key=lambda k: (left[k], k))
        chosen.append((name, left[name]))
        remaining -= left.pop(name)
    return chosen


class Planner:
    """Scratch allocation of free GPUs during one scheduling pass; the state is not touched."""

    __slots__ = ("_state", "_free", "_taken")

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._free = {n: c for n, c in state.free_by_node.items() if c > 0}
        self._taken: set[int] = set()

    @property
    def free_total(self) -> int:
        return sum(self._free.values())

    def take(self, want: int) -> tuple[int, ...] | None:
        """Reserve `want` free GPUs on the fewest nodes; None if there are not enough."""
        plan = fewest_nodes(self._free, want)
        if plan is None:
            return None
        state = self._state
        picked: list[int] = []
        for node, count in plan:
            got = 0
            for g in state.nodes[node].gpus:
                if not state.gpus[g].jobs and g not in self._taken:
                    picked.append(g)
                    got += 1
                    if got == count:
                        break
            left = self._free[node] - count
            if left:
                self._free[node] = left
            else:
                del self._free[node]
        self._taken.update(picked)
        return tuple(picked)
