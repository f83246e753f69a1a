"""A replay pauses Python's cyclic collector (meshsched.sim.loop: its full collections re-read every job kept) and
hands it back as it found it; so no pass may leave a reference cycle behind (Castor's pass scratch named its cycle,
and every pass left one for the collector)."""

from __future__ import annotations

import gc

import pytest

from meshsched.policies.registry import make_policy
from meshsched.loaders.profiles import installed_handle
from meshsched.sim import loop as loop_mod
from meshsched.sim.loop import simulate
from tests.support.sim import perf_model, philly, v100


def _garbage_after(policy: str, jobs: int) -> int:
    """Objects in reference cycles a replay of `jobs` jobs leaves unreachable (the collector held off meanwhile; the
    replay's result, engine and world included, is still held)."""
    stack = make_policy(policy, installed_handle())
    gc.collect()
    gc.disable()
    try:
        result = simulate(philly(jobs).jobs, stack, perf_model(), v100(2))
        garbage = gc.collect()
        assert result.engine.state.jobs
        return garbage
    finally:
        gc.enable()


@pytest.mark.parametrize("policy", ["castor", "srtf", "sjf-ffs"])
def test_passes_leave_no_reference_cycles(policy):
    # what a replay leaves does not grow with the passes it ran (the first one may leave the objects of a model it
    # loaded: that one is not counted)
    _garbage_after(policy, 20)
    assert _garbage_after(policy, 400) == _garbage_after(policy, 100)


def test_the_collector_is_left_as_it_was():
    stack = make_policy("sjf")
    assert gc.isenabled()
    simulate(philly(50).jobs, stack, perf_model(), v100(1))
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(philly(50).jobs, make_policy("sjf"), perf_model(), v100(1))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_replay_freezes_what_was_there_and_thaws_only_that(monkeypatch):
    # what the process held before the replay sits out its collections (gc.freeze) and is back after it; a caller's
    # own frozen objects (a pre-fork server's) stay frozen: the replay then freezes nothing
    monkeypatch.setattr(loop_mod, "_YOUNG_EVERY", 64)
    during: list[int] = []
    stack = make_policy("sjf")
    simulate(philly(100).jobs, stack, perf_model(), v100(1), after_event=lambda e: during.append(gc.get_freeze_count()))
    assert min(during) > 0 and gc.get_freeze_count() == 0
    gc.freeze()
    try:
        held = gc.get_freeze_count()
        simulate(philly(100).jobs, make_policy("sjf"), perf_model(), v100(1))
        assert gc.get_freeze_count() == held
    finally:
        gc.unfreeze()


def test_a_long_replay_pays_for_its_collection_before_it_returns(monkeypatch):
    # (the interval made short: a replay "long" for it) the young generations are collected on the way and the whole
    # heap once at the end, inside `simulate`, so nothing the replay left is due at the caller's next allocation
    monkeypatch.setattr(loop_mod, "_YOUNG_EVERY", 64)
    runs: list[int] = []

    def seen(phase, info):
        if phase == "start":
            runs.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        result = simulate(philly(200).jobs, make_policy("sjf"), perf_model(), v100(1))
        at_return = list(runs)
    finally:
        gc.callbacks.remove(seen)
    assert result.events >= 4 * 64
    assert 1 in at_return and at_return[-1] == 2
    assert gc.get_count()[2] == 0  # (what a full collection leaves: the next one is a full count away)
