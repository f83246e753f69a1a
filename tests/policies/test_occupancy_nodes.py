"""The live nodes' arrays of the sharing policies' occupancy (`Occupancy._index_nodes`) are re-indexed from the
last index after a node joins, is lost or comes back (rows copied, a new node's row read): random sequences of
joins, losses, returns, drains, submits and ends, checked after every event against a fresh build, with nodes of two
sizes (a change of the largest live node's size takes the full path)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from meshsched import events as ev
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import load_perf_model
from meshsched.policies.castor import Castor
from meshsched.policies.occupancy import Occupancy
from meshsched.policies.registry import stack_of
from meshsched.state import ClusterState, JobSpec, JobState, NodeSpec
from tests.support.occupancy import snapshot

PERF = load_perf_model()


class FixedXi:
    def xi(self, *_):
        return (1.1, 1.1)


def _nodes(occ) -> tuple:
    """(A drain reorders a node's GPUs, which the arrays follow at the next index; no reader depends on the order
    of a row's slots: `free_times` sorts each row.)"""
    return occ.node_size, np.sort(occ.node_gpus, axis=1).tolist(), occ.node_row, occ.gpu_node.tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_node_arrays_after_random_joins_losses_and_returns_match_a_fresh_build(monkeypatch, seed):
    rng = random.Random(seed)
    reindexed: list[int] = []
    real = Occupancy._reindex_nodes
    monkeypatch.setattr(Occupancy, "_reindex_nodes", lambda self, *a: reindexed.append(1) or real(self, *a))
    eng = Engine(stack_of(Castor(perf=PERF, interference=FixedXi())), ProfileEstimator(PERF), ClusterState())
    sizes: dict[str, int] = {}
    for i in range(6):
        sizes[f"n{i}"] = rng.choice((4, 8))
        eng.handle(ev.NodeJoined(f"j-n{i}", NodeSpec(f"n{i}", sizes[f"n{i}"], "v100", 16384)), 0.0)
    castor = eng.policy.placement
    now = 1.0
    for k in range(1, 91):
        now += 1.0
        st = eng.state
        live = [n for n, node in st.nodes.items() if node.alive]
        lost = [n for n, node in st.nodes.items() if not node.alive]
        running = [j.job_id for j in st.jobs.values() if j.state is JobState.RUNNING]
        loading = [j.job_id for j in st.jobs.values() if j.state is JobState.LOADING]
        r = rng.random()
        if r < 0.12 and len(live) > 1:
            e = ev.NodeLost(f"l{k}", rng.choice(live))
        elif r < 0.24 and lost:
            name = rng.choice(lost)
            e = ev.NodeJoined(f"b{k}", NodeSpec(name, sizes[name], "v100", 16384))
        elif r < 0.32:
            name = f"m{k}"
            sizes[name] = rng.choice((4, 8))
            e = ev.NodeJoined(f"n{k}", NodeSpec(name, sizes[name], "v100", 16384))
        elif r < 0.38:  # a drain or resume reorders the node's GPUs (`ClusterState.set_drained`)
            name = rng.choice(live)
            e = ev.DrainChanged(f"d{k}", name, (rng.randrange(sizes[name]),), rng.random() < 0.6)
        elif r < 0.45 and loading:
            e = ev.JobStarted(f"st{k}", rng.choice(loading))
        elif r < 0.6 and running:
            e = ev.JobFinished(f"f{k}", rng.choice(running))
        else:
            g = rng.choice((1, 1, 2, 4, 8))
            e = ev.JobSubmitted(f"s{k}", JobSpec(f"job{k}", g, "resnet18", 64 * g, rng.randint(1_000, 90_000),
                                                 submit_time=now))
        eng.handle(e, now)
        occ = castor._occupancy(eng.view(), eng.state)
        fresh = Occupancy(eng.state, eng.view().holding(), castor._solo_step, occ._group_of)
        assert _nodes(occ) == _nodes(fresh), (k, e)
        assert snapshot(occ, now + 0.5) == snapshot(fresh, now + 0.5), (k, e)
        assert (occ.node_gpus[occ.node_gpus >= 0] < len(eng.state.gpus)).all() and occ.node_gpus.dtype == np.int64
    assert len(reindexed) >= 5  # node changes took the incremental path
