"""`ClusterState`'s free-GPU map (state.py): the nodes with a free GPU and how many, counted again only after
`free_by_node` moved, and moved along with it by `assign` / `release` where the nodes keep their order."""

from __future__ import annotations

import operator

_COUNT = operator.itemgetter(1)  # (node, free count) -> the count: truthy where a GPU is free


class FreeMap:
    """The map's methods; the class using it has `free_by_node`, `_free_version` and `_free_memo`."""

    __slots__ = ()

    def free_nodes(self) -> dict[str, int]:
        """`free_by_node` without the nodes that have no free GPU, in its order; shared until free GPUs change:
        read it, copy it to change it."""
        return self.free_summary()[0]

    def free_summary(self) -> tuple[dict[str, int], int]:
        """(`free_nodes()`, the free GPUs in all), counted again only after `free_by_node` moved (ClusterState
        bumps `_free_version` wherever it changes it; whoever replaces the dict starts afresh)."""
        memo, fbn = self._free_memo, self.free_by_node
        if memo is not None and memo[0] == self._free_version and memo[1] is fbn:
            return memo[2]
        out = dict(filter(_COUNT, fbn.items()))  # the nodes with a free GPU (counts are never negative)
        got = out, sum(out.values())
        self._free_memo = (self._free_version, fbn, got)
        return got

    def _free_copy(self) -> dict[str, int] | None:
        """A copy of `free_summary`'s map while it is current (None: it is not), for assign / release to move
        along with `free_by_node` where the nodes keep their order (a copy: a map handed out never changes)."""
        memo = self._free_memo
        if memo is not None and memo[0] == self._free_version and memo[1] is self.free_by_node:
            return dict(memo[2][0])
        return None
