"""What Castor's release pass keeps between its searches, checked against recomputing it from scratch:
`Castor._standing` (a judgement with the hosts taken since it was made left out, from those few columns) against
the straightforward answer over every host still alive, and `HostTable.gathers` (its per-node counts following
`claim` instead of recounting every GPU) against a recount after each host taken and free GPU withheld."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from meshsched import events as ev
from meshsched.policies.castor import Castor
from meshsched.policies.castor_tables import HostTable
from meshsched.state import JobSpec, NodeSpec
from tests.policies.test_castor_judge_exact import _cluster
from tests.policies.test_occupancy import _engine, _occ


def _recomputed(best, wait, alive):
    """`_share`'s answer over the hosts alive (the code before `_standing`): None, or (pays or None, low, count)."""
    feasible = np.isfinite(best) & alive
    if not feasible.any():
        return None
    pays = feasible & (best < wait)
    if pays.any():
        return pays, None, None
    return None, int(np.argmin(np.where(feasible, best, np.inf))), int(feasible.sum())


@pytest.mark.parametrize("seed", range(30))
def test_standing_matches_recomputing_over_the_hosts_alive(seed):
    g = np.random.default_rng(seed)
    tab, kt, hosts = _cluster(g, types=1 + seed % 2, odd=seed % 5 == 4, nan_free=seed % 3 == 0)
    tab.taken, alive = [], np.zeros(len(tab.code), dtype=bool)
    alive[hosts[0]] = True
    tab.alive = alive
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        k = Castor._kind_arrays(kt, seed % 3, hosts)
    if not len(k.cols):
        return
    n = int(g.integers(1, 5))
    start_b = [float(v) for v in g.uniform(0, 1e5, n) * (g.random(n) < 0.7)]  # often waiting is long: many pay
    blk, any_f = Castor._judge_block(Castor, tab, kt, seed % 3, k, [float(v) for v in g.uniform(0, 4e5, n)],
                                     start_b)
    for c in g.permutation(len(alive)).tolist():  # hosts taken one by one, some judged, some not (or not alive)
        if alive[c]:
            alive[c] = False
            tab.taken.append(c)
            tab.claims += 1
        for j in range(n):
            if not any_f[j]:
                continue
            got = Castor._standing(tab, blk, j)
            want = _recomputed(blk.best[j], blk.wait[j], alive[blk.cols])
            if want is None or got is None:
                assert got is want is None
            elif want[0] is not None:
                assert got[0] is not None and np.array_equal(got[0], want[0])
            else:
                assert got == want


def test_gathers_follows_the_hosts_taken_and_the_free_gpus_withheld():
    eng = _engine()
    for name in ("n2", "n3", "n4"):
        eng.handle(ev.NodeJoined(f"join-{name}", NodeSpec(name, 4, "v100", 16384)), 0.0)
    sizes = (1, 1, 2, 1, 4, 2, 1, 1, 1, 2, 1)  # 17 of the 20 GPUs
    for i, gpus in enumerate(sizes):
        eng.handle(ev.JobSubmitted(f"s{i}", JobSpec(f"j{i}", gpus, "resnet18", 64 * gpus, 10_000 * (i + 1),
                                                    submit_time=0.0)), 0.0)
        eng.handle(ev.JobStarted(f"st{i}", f"j{i}"), 1.0)
    occ = _occ(eng)
    tab = HostTable(occ, 5.0)
    free = {}
    for g in eng.state.gpus:
        if not g.jobs:
            free[g.node] = free.get(g.node, 0) + 1
    plan = SimpleNamespace(node_size=4, free_total=sum(free.values()), free_map=lambda: dict(free))

    def recount(need):  # the per-node counts from scratch (the code before: every GPU of a host still alive)
        first = np.zeros(len(occ.solo_of) + 1, dtype=bool)
        first[occ.first_gpu(np.flatnonzero(tab.alive))] = True
        per = np.bincount(occ.gpu_node[first[occ.solo_of]], minlength=len(occ.node_gpus) + 1)[:len(occ.node_gpus)]
        for name, c in free.items():
            per[occ.node_row[name]] += c
        return sum(sorted(per.tolist(), reverse=True)[:-(-need // 4)]) >= need

    g = np.random.default_rng(3)
    for step in range(12):
        for need in range(1, 21):
            assert tab.gathers(plan, need) == recount(need), (step, need)
        if step % 3 == 2 and free:  # a free GPU withheld (a start, or a sharer's free GPUs)
            node = sorted(free)[0]
            free[node] -= 1
            if not free[node]:
                del free[node]
            plan.free_total -= 1
        else:
            tab.claim(int(g.integers(0, len(tab.alive))))


@pytest.mark.parametrize("seed", range(20))
def test_best_first_is_the_head_of_a_stable_sort(seed):
    """`_place` adds its first candidates from `_best_first` (a partial sort when there are many): the same hosts
    in the same order as the head of the stable sort it replaced, ties (frequent: equal xi) in column order."""
    from meshsched.policies.castor import _best_first

    g = np.random.default_rng(seed)
    n = int(g.integers(1, 400))
    idx = np.sort(g.choice(5000, n, replace=False))
    vals = g.integers(0, 1 + n // 8 if seed % 2 else 10, n).astype(float) * 1.5  # many ties
    for m in (1, 4, 16):
        assert _best_first(idx, vals, m).tolist() == idx[np.argsort(vals, kind="stable")][:m].tolist()
