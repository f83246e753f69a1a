"""One executor contract: the simulated world and meshd carry out exactly the same actions, and refuse others."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from meshsched.actions import Action
from meshsched.executor import ACTION_TYPES, UnknownAction, check_handlers
from meshsched.loaders.profiles import load_perf_model
from meshsched.sim.world import SimWorld
from meshsched.state import NodeSpec


@dataclass(frozen=True, slots=True)
class Teleport(Action):
    """An action nobody handles."""


def _daemon(tmp_path):
    from meshsched.daemon.config import DaemonConfig
    from meshsched.daemon.node import NodeDaemon

    return NodeDaemon(DaemonConfig(state_dir=tmp_path / "s", runtime_dir=tmp_path / "r", fake_gpus=2))


def test_simulator_and_daemon_handle_the_same_actions(tmp_path):
    world = SimWorld(load_perf_model(), [NodeSpec("n0", 2, "v100", 16384)])
    assert set(world._handlers) == ACTION_TYPES
    assert set(_daemon(tmp_path)._handlers) == ACTION_TYPES


def test_an_unknown_action_raises_instead_of_being_dropped(tmp_path):
    world = SimWorld(load_perf_model(), [NodeSpec("n0", 2, "v100", 16384)])
    with pytest.raises(UnknownAction, match="Teleport"):
        world.execute([Teleport("1")], 0.0)
    d = _daemon(tmp_path)
    with pytest.raises(UnknownAction, match="Teleport"):
        from meshsched.executor import dispatch

        dispatch("meshd", d._handlers, Teleport("1"))


def test_an_executor_missing_a_handler_is_refused():
    with pytest.raises(UnknownAction, match="missing: .*Reconfigure"):
        check_handlers("x", {t: print for t in ACTION_TYPES if t.__name__ != "Reconfigure"})
