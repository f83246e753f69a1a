"""Gimbal's packing rules (gimbal.txt section 5.1): at most MAX_WORKERS_PER_GPU workers per GPU, each job on the
fewest nodes that hold it, and the J_max packing sets a calibration works on (`packing_sets`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

GpuRef = tuple[str, int]  # (node, local index)
MAX_WORKERS_PER_GPU = 2

def workers_per_gpu(placements: Mapping[str, Sequence[GpuRef]]) -> dict[GpuRef, tuple[str, ...]]:
    out: dict[GpuRef, tuple[str, ...]] = {}
    for job in sorted(placements):
        for g in placements[job]:
            out[g] = (*out.get(g, ()), job)
    return out


def fewest_nodes(world_size: int, node_gpus: Mapping[str, int]) -> int:
    """The smallest number of nodes that can hold `world_size` GPUs (the optimal topology)."""
    total = 0
    for n, size in enumerate(sorted(node_gpus.values(), reverse=True), start=1):
        total += size
        if total >= world_size:
            return n
    raise ValueError(f"{world_size} GPUs do not fit in the cluster ({total} GPUs)")


def packing_sets(placements: Mapping[str, Sequence[GpuRef]]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(J_max, the jobs packed with it) for every set of two or more jobs that share GPUs; raises ValueError
    where the placements break the rules (see packing_violation)."""
    why = packing_violation(placements)
    if why is not None:
        raise ValueError(why)
    return tuple((c, members) for c, members in _stars(placements) if members)


def _neighbours(placements: Mapping[str, Sequence[GpuRef]]) -> dict[str, set[str]]:
    near: dict[str, set[str]] = {j: set() for j in placements}
    for jobs in workers_per_gpu(placements).values():
        for a in jobs:
            near[a].update(b for b in jobs if b != a)
    return near


def _components(near: Mapping[str, set[str]]) -> list[list[str]]:
    seen: set[str] = set()
    out = []
    for start in sorted(near):
        if start in seen:
            continue
        comp, todo = [], [start]
        seen.add(start)
        while todo:
            j = todo.pop()
            comp.append(j)
            for k in sorted(near[j] - seen):
                seen.add(k)
                todo.append(k)
        out.append(sorted(comp))
    return out


def _stars(placements: Mapping[str, Sequence[GpuRef]]) -> list[tuple[str, tuple[str, ...]]]:
    near = _neighbours(placements)
    out = []
    for comp in _components(near):
        size = {j: len(placements[j]) for j in comp}
        centre = max(comp, key=lambda j: (size[j], -comp.index(j)))
        out.append((centre, tuple(j for j in comp if j != centre)))
    return out


def packing_violation(placements: Mapping[str, Sequence[GpuRef]]) -> str | None:
    """Why these placements break section 5.1's rules, or None: at most two workers per GPU; every group of
    jobs sharing GPUs is a packing set whose J_max shares with all the others and the others only with it,
    each smaller than J_max; two jobs of the same world size share only as a balanced pair (same GPUs)."""
    for gpu, jobs in workers_per_gpu(placements).items():
        if len(jobs) > MAX_WORKERS_PER_GPU:
            return f"GPU {gpu} would hold {len(jobs)} workers ({', '.join(jobs)}); at most {MAX_WORKERS_PER_GPU}"
    near = _neighbours(placements)
    for centre, others in _stars(placements):
        for o in others:
            if near[o] != {centre}:
                extra = ", ".join(sorted(near[o] - {centre}))
                return f"job {o} shares GPUs with {centre} and with {extra}: a cascade (two J_max)"
            if len(placements[o]) == len(placements[centre]):
                if len(others) > 1 or set(placements[o]) != set(placements[centre]):
                    return f"jobs {centre} and {o} have the same world size: they may share only as a balanced pair"
    return None


def placement_violation(
    job: str, gpus: Sequence[GpuRef], placements: Mapping[str, Sequence[GpuRef]], node_gpus: Mapping[str, int]
) -> str | None:
    """Why `job` may not run on `gpus` next to `placements`, or None (all three rules of section 5.1)."""
    if job in placements:
        return f"job {job} is already placed"
    if not gpus or len(set(gpus)) != len(gpus):
        return f"job {job} needs distinct GPUs, got {list(gpus)}"
    for node, index in gpus:
        if not 0 <= index < node_gpus.get(node, 0):
            return f"no GPU {index} on node {node!r}"
    nodes = {n for n, _ in gpus}
    need = fewest_nodes(len(gpus), node_gpus)
    if len(nodes) != need:
        return f"job {job} spans {len(nodes)} nodes; {len(gpus)} GPUs fit on {need}"
    return packing_violation({**placements, job: tuple(gpus)})


def feasible_node_sets(
    job: str, world_size: int, placements: Mapping[str, Sequence[GpuRef]], node_gpus: Mapping[str, int]
) -> tuple[tuple[str, ...], ...]:
    """The sets of nodes (fewest possible) where `job` can be placed under the rules (exhaustive: for
    decisions on small clusters and tests, not for a trace-scale placement pass)."""
    need = fewest_nodes(world_size, node_gpus)
    used = workers_per_gpu(placements)
    out = []
    for nodes in itertools.combinations(sorted(node_gpus), need):
        room = [(n, i) for n in nodes for i in range(node_gpus[n]) if len(used.get((n, i), ())) < MAX_WORKERS_PER_GPU]
        for gpus in itertools.combinations(room, world_size):
            if {n for n, _ in gpus} == set(nodes) and placement_violation(job, gpus, placements, node_gpus) is None:
                out.append(nodes)
                break
    return tuple(out)
