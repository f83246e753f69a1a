"""The per-event path's shortcuts (issue 26, point 9) decide what the plain computations decide: the placement's
best fit by the fullest node, the greedy arrival check by the largest free count, the free map kept as a filter.
Randomised over free maps with ties and over clusters with GPUs held, each compared with a reference written out."""

from __future__ import annotations

import random

from meshsched.greedy import none_can_start
from meshsched.policies.placement import Planner
from meshsched.state import ClusterState, NodeSpec


def _best_fit(free: dict[str, int], want: int) -> list[tuple[str, int]] | None:
    """The reference: the first node, in the map's order, of the fewest free GPUs that still holds `want`."""
    best, best_free = None, None
    for name, n in free.items():
        if n >= want and (best_free is None or n < best_free):
            best, best_free = name, n
    return None if best is None else [(best, want)]


def _cluster(rng: random.Random, nodes: int, per: int) -> ClusterState:
    state = ClusterState()
    for i in range(nodes):
        state.add_node(NodeSpec(f"n{i:02d}", per, "fake", 16384))
    held = [i for i in range(len(state.gpus)) if rng.random() < 0.6]
    for k, g in enumerate(held):
        state.assign(f"j{k}", (g,))
    return state


def test_best_fit_by_the_fullest_node_matches_the_walk() -> None:
    rng = random.Random(26)
    for _ in range(400):
        state = _cluster(rng, rng.randint(1, 12), 8)
        plan = Planner(state)
        free = {f"x{i}": rng.randint(1, 8) for i in range(rng.randint(0, 10))}  # ties on purpose
        for want in range(1, 9):
            assert plan.compact(free, want) == _best_fit(free, want), (free, want)


def test_none_can_start_matches_a_placement_try() -> None:
    """Exact for a job one node can hold; for a larger one never "cannot" where it can."""
    rng = random.Random(9)
    for _ in range(200):
        state = _cluster(rng, rng.randint(1, 10), rng.choice((4, 8)))
        for need in range(1, 2 * state.largest_node + 3):
            plan = Planner(state)
            fits = need <= plan.free_total and plan.take(need) is not None
            if need <= state.largest_node:
                assert none_can_start(state, (need,)) == (not fits), need
            else:  # several nodes: bounds only (the pass then finds whether as few nodes as it needs hold it)
                assert not (none_can_start(state, (need,)) and fits), need


def test_free_summary_lists_the_nodes_with_a_free_gpu_in_join_order() -> None:
    rng = random.Random(3)
    for _ in range(100):
        state = _cluster(rng, rng.randint(1, 10), 4)
        free, total = state.free_summary()
        want = {n: c for n, c in state.free_by_node.items() if c > 0}
        assert list(free.items()) == list(want.items())
        assert total == sum(want.values())
