"""Placement helpers: how a GPU count maps onto nodes (tuple of GPUs used on each node)."""

from __future__ import annotations


def ideal_placement(gpus: int, gpus_per_node: int) -> tuple[int, ...]:
    """Fewest nodes for `gpus` GPUs: full nodes first, e.g. (8, 8) for 16 on 8-GPU nodes, (8, 4) for 12."""
    if gpus < 1 or gpus_per_node < 1:
        raise ValueError(f"need gpus >= 1 and gpus_per_node >= 1, got {gpus}, {gpus_per_node}")
    full, rest = divmod(gpus, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


def even_placement(gpus: int, nodes: int) -> tuple[int, ...]:
    """`gpus` spread as evenly as possible over `nodes` nodes, larger shares first (e.g. 10 on 6 -> 2,2,2,2,1,1)."""
    if nodes < 1 or gpus < nodes:
        raise ValueError(f"cannot spread {gpus} GPUs over {nodes} nodes")
    base, extra = divmod(gpus, nodes)
    return (base + 1,) * extra + (base,) * (nodes - extra)
