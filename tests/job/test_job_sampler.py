"""meshsched.job's elastic sampler: rebalancing mid-epoch neither repeats nor skips a sample."""

from __future__ import annotations

import pytest

from meshsched.job import ElasticSampler, even_split


def consume(sampler: ElasticSampler, steps: int, rebalance: dict[int, list[int]] | None = None) -> list[int]:
    seen: list[int] = []
    for step in range(steps):
        if rebalance and step in rebalance:
            sampler.set_local_batches(rebalance[step])
        for rank in range(sampler.world_size):
            seen.extend(sampler.indices(rank))
        sampler.advance()
    return seen


def test_an_epoch_is_the_same_set_with_and_without_mid_epoch_rebalancing():
    n, g = 120, 12  # 10 steps per epoch
    plain = consume(ElasticSampler(n, g, world_size=3, seed=7), 10)
    moved = consume(ElasticSampler(n, g, world_size=3, seed=7), 10, {3: [2, 9, 1], 6: [6, 1, 5], 8: [1, 1, 10]})
    assert sorted(plain) == sorted(moved) == list(range(n))  # each sample exactly once in the epoch
    assert plain == moved  # the global order is the same; only who computes which sample changes


def test_epochs_straddle_steps_and_reshuffle():
    s = ElasticSampler(10, 4, world_size=2, seed=1)
    seen = consume(s, 5, {2: [1, 3]})  # 20 positions: exactly two epochs
    assert sorted(seen[:10]) == sorted(seen[10:]) == list(range(10))
    assert seen[:10] != seen[10:]
    assert s.epoch == 2 and s.position == 20


def test_state_round_trip_and_validation():
    s = ElasticSampler(50, 8, world_size=2, seed=3)
    consume(s, 3, {1: [3, 5]})
    t = ElasticSampler(50, 8, world_size=2, seed=3)
    t.load_state_dict(s.state_dict())
    assert t.position == 24 and t.indices(1) == s.indices(1)
    with pytest.raises(ValueError):
        s.set_local_batches([4, 5])  # changes the global batch
    with pytest.raises(ValueError):
        s.set_local_batches([0, 8])
    with pytest.raises(ValueError):
        ElasticSampler(50, 8, world_size=2, seed=4).load_state_dict(s.state_dict())
    assert even_split(10, 3) == [4, 3, 3]
