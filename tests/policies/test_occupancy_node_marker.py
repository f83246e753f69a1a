"""After a node joins or is lost, Castor's occupancy (`FollowingOccupancy`) follows the jobs the state's log names
and the node marker (`ClusterState.changes_since`) without re-reading every holder (`_moved`), and its arrays
match a fresh build: random joins, losses, returns, drains, submits, starts and ends, checked after every event.
The engine's own anonymous touch for a node event is left out here, as the engine is to do (the node's change is
the state's marker; the jobs on a lost node are released, so named)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from meshsched import events as ev
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import load_perf_model
from meshsched.policies.castor import Castor
from meshsched.policies.castor_occupancy import FollowingOccupancy
from meshsched.policies.occupancy import Occupancy
from meshsched.policies.registry import stack_of
from meshsched.state import ClusterState, JobSpec, JobState, NodeSpec
from tests.support.occupancy import snapshot

PERF = load_perf_model()
NODE_EVENTS = (ev.NodeJoined, ev.NodeLost)


class FixedXi:
    def xi(self, *_):
        return (1.1, 1.1)


def _event(rng, eng, sizes, k, now):
    st = eng.state
    live = [n for n, node in st.nodes.items() if node.alive]
    lost = [n for n, node in st.nodes.items() if not node.alive]
    running = [j.job_id for j in st.jobs.values() if j.state is JobState.RUNNING]
    loading = [j.job_id for j in st.jobs.values() if j.state is JobState.LOADING]
    r = rng.random()
    if r < 0.14 and len(live) > 1:
        return ev.NodeLost(f"l{k}", rng.choice(live))
    if r < 0.26 and lost:
        name = rng.choice(lost)
        return ev.NodeJoined(f"b{k}", NodeSpec(name, sizes[name], "v100", 16384))
    if r < 0.33:
        name = f"m{k}"
        sizes[name] = 8
        return ev.NodeJoined(f"n{k}", NodeSpec(name, 8, "v100", 16384))
    if r < 0.37:  # an unnamed change (`set_drained` touches with no job id): the reading comparison
        name = rng.choice(live)
        return ev.DrainChanged(f"d{k}", name, (rng.randrange(sizes[name]),), rng.random() < 0.6)
    if r < 0.45 and loading:
        return ev.JobStarted(f"st{k}", rng.choice(loading))
    if r < 0.58 and running:
        return ev.JobFinished(f"f{k}", rng.choice(running))
    g = rng.choice((1, 1, 2, 4, 8))
    return ev.JobSubmitted(f"s{k}", JobSpec(f"job{k}", g, "resnet18", 64 * g, rng.randint(1_000, 90_000),
                                            submit_time=now))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_node_changes_named_by_the_log_skip_the_holders_reread_and_match_a_fresh_build(monkeypatch, seed):
    rng = random.Random(seed)
    calls = {"moved": 0, "build": 0}
    in_node_event = [False]
    real_touch, real_moved, real_build = ClusterState.touch, FollowingOccupancy._moved, FollowingOccupancy._build

    def touch(self, job_id=None):
        if job_id is None and in_node_event[0]:
            return  # the engine's touch for an event without a job id, left out for node events
        real_touch(self, job_id)

    monkeypatch.setattr(ClusterState, "touch", touch)
    monkeypatch.setattr(FollowingOccupancy, "_moved", lambda self, h: calls.__setitem__("moved", calls["moved"] + 1)
                        or real_moved(self, h))
    monkeypatch.setattr(FollowingOccupancy, "_build", lambda self, h: calls.__setitem__("build", calls["build"] + 1)
                        or real_build(self, h))
    eng = Engine(stack_of(Castor(perf=PERF, interference=FixedXi())), ProfileEstimator(PERF), ClusterState())
    sizes: dict[str, int] = {}
    for i in range(6):
        sizes[f"n{i}"] = 8
        eng.handle(ev.NodeJoined(f"j-n{i}", NodeSpec(f"n{i}", 8, "v100", 16384)), 0.0)
    castor = eng.policy.placement
    now, node_events = 1.0, 0
    occ = castor._occupancy(eng.view(), eng.state)
    assert isinstance(occ, FollowingOccupancy)
    for k in range(1, 121):
        now += 1.0
        e = _event(rng, eng, sizes, k, now)
        in_node_event[0] = isinstance(e, NODE_EVENTS)
        moved, built, version = calls["moved"], calls["build"], eng.state.version
        eng.handle(e, now)  # (the engine's pass refreshes the arrays on a release)
        in_node_event[0] = False
        occ = castor._occupancy(eng.view(), eng.state)
        if isinstance(e, NODE_EVENTS) and eng.state.version != version:
            node_events += 1
            assert calls["moved"] == moved, (k, e)  # named: no re-read of every holder
            assert calls["build"] == built, (k, e)
        fresh = Occupancy(eng.state, eng.view().holding(), castor._solo_step, occ._group_of)
        assert occ.node_row == fresh.node_row and occ.gpu_node.tolist() == fresh.gpu_node.tolist(), (k, e)
        assert np.array_equal(np.sort(occ.node_gpus, axis=1), np.sort(fresh.node_gpus, axis=1)), (k, e)
        assert snapshot(occ, now + 0.5) == snapshot(fresh, now + 0.5), (k, e)
    assert node_events >= 10 and calls["moved"] >= 1  # both paths taken
