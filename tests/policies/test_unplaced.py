"""A pass rules out, after failing N GPUs, only the counts of N or more on as many nodes (`placement.Unplaced`):
8 GPUs do not fit where two nodes have 6 free each, but 12 do, on two nodes, as few as 12 GPUs can take."""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import installed_handle
from meshsched.policies.placement import Unplaced
from meshsched.policies.registry import make_policy
from meshsched.state import ClusterState, JobSpec, JobState, NodeSpec
from tests.support.fakes import LinearPerf


def six_and_six_free(policy: str) -> Engine:
    """Two 8-GPU nodes with 6 GPUs free on each (a 2-GPU job left on each), an 8-GPU job queued ahead of a
    12-GPU one (shorter, and earlier)."""
    eng = Engine(make_policy(policy, installed_handle()), ProfileEstimator(LinearPerf()), ClusterState())
    for n in ("n0", "n1"):
        eng.handle(ev.NodeJoined(f"join-{n}", NodeSpec(n, 8, "fake", 16384)), 0.0)
    # a and b take 6 GPUs of each node, c and d the 2 left; c and d are short (never an SRTF victim of j8)
    jobs = (("a", 6, 100_000), ("b", 6, 100_000), ("c", 2, 10), ("d", 2, 10), ("j8", 8, 1_000), ("j12", 12, 5_000))
    for t, (jid, gpus, iterations) in enumerate(jobs, 1):
        eng.handle(ev.JobSubmitted(f"s-{jid}", JobSpec(jid, gpus, "m", 100 * gpus, iterations, submit_time=t)), t)
    assert [eng.state.jobs[j].state for j in ("j8", "j12")] == [JobState.PENDING] * 2
    for t, jid in enumerate("abcd", 10):
        eng.handle(ev.JobStarted(f"st-{jid}", jid), t)
    for t, jid in enumerate("ab", 20):
        eng.handle(ev.JobFinished(f"f-{jid}", jid), t)
    return eng


@pytest.mark.parametrize("policy", ["sjf", "las", "srtf"])
def test_a_job_on_more_nodes_starts_behind_a_smaller_one_that_fits_no_node(policy):
    eng = six_and_six_free(policy)
    jobs = eng.state.jobs
    assert jobs["j8"].state is JobState.PENDING  # no node has 8 free
    assert jobs["j12"].state is JobState.LOADING, jobs["j12"].reason  # 6 + 6, two nodes: as few as 12 GPUs need
    assert sorted(eng.state.gpus[g].node for g in jobs["j12"].gpus) == ["n0"] * 6 + ["n1"] * 6


def test_unplaced_rules_out_what_the_fewest_nodes_cannot_hold():
    u = Unplaced(8, [3, 5, 8, 12, 13, 16, 40], total=32)
    u.failed(5)  # no node has 5 free: two hold 8 at most, four 16
    assert not u.blocks(3) and u.blocks(5) and u.blocks(8)
    assert u.blocks(9) and u.blocks(12) and u.blocks(16) and not u.every
    u = Unplaced(8, [3, 8, 12, 13, 16, 40], total=32)
    u.failed(7)  # each node 6 at most: 12 may fit on two, 13 and 16 not
    assert u.blocks(8) and not u.blocks(12) and u.blocks(13) and u.blocks(16) and not u.blocks(3) and not u.every
    assert not u.blocks(17)  # three nodes of 6
    u.failed(12)  # two nodes hold 11 at most, so three 16.5
    assert u.blocks(17) and u.blocks(16) and not u.blocks(11)
    u.failed(3)
    assert u.every  # 40 GPUs never run on 32: passed by


def test_unplaced_never_rules_out_a_count_that_fits():
    """Against the placement itself: on random free maps, whatever `blocks` rules out after some failures is a
    count `fewest_nodes` cannot place."""
    import random

    from meshsched.policies.placement import fewest_nodes

    rng = random.Random(12)
    for _ in range(3000):
        free = {f"n{i}": rng.randint(0, 8) for i in range(rng.randint(1, 6))}
        u = Unplaced(8, range(1, 49), total=48)
        for need in rng.sample(range(1, 49), 6):
            if fewest_nodes(free, need, -(-need // 8)) is None:
                u.failed(need)
        for need in range(1, 49):
            if u.blocks(need):
                assert fewest_nodes(free, need, -(-need // 8)) is None, (free, need)
        # what a walk reads instead of asking per job: the queued counts `blocks` rules out, kept at each failure
        assert u.ruled_out == {n for n in range(1, 49) if u.blocks(n)}
        assert u.every == (len(u.ruled_out) == 48)
