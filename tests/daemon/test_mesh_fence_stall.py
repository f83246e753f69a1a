"""A meshd whose event loop is held busy past the fencing limit (`ttl - retry_timeout`), while etcd lists its member
entry all along, does not fence itself: before it fences it reads the members once more (daemon/mesh.py
`_fence_watch`). Seen in benchmarks/mesh_scale.py (8 meshd on a loaded 2-core machine): a leader SIGKILLed and
restarted, busy replaying and applying entries, fenced 2.2 s after its last read and stopped three jobs it had
just adopted (no job ran twice; the three were stopped and started again for nothing). In-process, over
LocalCoordinator whose reads take a moment, as etcd's do."""

from __future__ import annotations

import asyncio
import time

import pytest
from meshsched.daemon.config import ConfigError, CoordinatorConfig
from meshsched.daemon.coordinator import LocalCoordinator
from meshsched.daemon.mesh import LinkContext, MeshLink

from meshsched import events as ev

STALL = 0.9  # seconds one applied entry holds the loop: past the 0.6 s limit (and several probe rounds)


class SlowReads(LocalCoordinator):
    async def members(self):
        await asyncio.sleep(0.01)  # a read over the network: the loop runs other tasks meanwhile
        return await super().members()


class StallingReplica:
    """Applies entries; the one named "stall" holds the loop (blocking, as applying entries is); records fences."""

    def __init__(self, outbox_path) -> None:
        self.outbox_path = outbox_path
        self.applied: list[str] = []
        self.fences: list[float] = []

    def apply_entry(self, entry, index: int, act: bool) -> None:
        if entry.event.stimulus_id == "stall":
            time.sleep(STALL)
        self.applied.append(entry.event.stimulus_id)

    def synced(self) -> None:
        pass

    def fence(self, budget: float) -> list[str]:
        self.fences.append(budget)
        return []

    def unfence(self) -> None:
        pass

    def leadership_changed(self, leader) -> None:
        pass


def test_a_loop_held_busy_past_the_limit_does_not_fence_a_node_etcd_sees(tmp_path):
    config = CoordinatorConfig(ttl=1, loop_wait=0.2, retry_timeout=0.4)  # fencing limit: 1 - 0.4 = 0.6 s
    replica = StallingReplica(tmp_path / "mesh-outbox.jsonl")
    link = MeshLink(LinkContext("n1", "n1", (), 0, dict, {}), replica, SlowReads("n1"), config,
                    node_grace=3.0)

    async def until(pred, what: str) -> None:
        deadline = time.monotonic() + 20
        while not pred():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.01)

    async def run() -> None:
        link.start()
        try:
            await until(lambda: link.synced and link.term is not None, "the link to lead")
            link.propose(ev.HoldRequested("stall", "n1.1"))
            link.propose(ev.HoldRequested("after", "n1.2"))
            await until(lambda: "after" in replica.applied, "both entries to be applied")
            await asyncio.sleep(0.5)  # a few more fence rounds
        finally:
            await link.close()

    asyncio.run(run())
    assert replica.applied == ["stall", "after"]
    assert replica.fences == [], f"fenced although etcd listed the node all along: budgets {replica.fences}"
    assert link.fences == 0


class LosesSight(LocalCoordinator):
    """etcd stops listing this node once `blind` is set (its member entry gone, as a partition or an outage looks)."""

    blind = False

    async def members(self):
        return [] if self.blind else await super().members()


@pytest.mark.parametrize("fence", [True, False])
def test_fence_false_keeps_the_ranks_of_a_node_etcd_cannot_see(tmp_path, fence):
    config = CoordinatorConfig(ttl=1, loop_wait=0.2, retry_timeout=0.4, fence=fence)
    replica = StallingReplica(tmp_path / "mesh-outbox.jsonl")
    coord = LosesSight("n1")
    link = MeshLink(LinkContext("n1", "n1", (), 0, dict, {}), replica, coord, config, node_grace=3.0)

    async def run() -> None:
        link.start()
        try:
            deadline = time.monotonic() + 20
            while not (link.synced and link.term is not None):
                assert time.monotonic() < deadline, "timed out waiting for the link to lead"
                await asyncio.sleep(0.01)
            coord.blind = True
            deadline = time.monotonic() + 3.0  # five times the 0.6 s limit
            while time.monotonic() < deadline and not replica.fences:
                await asyncio.sleep(0.05)
        finally:
            await link.close()

    asyncio.run(run())
    assert bool(replica.fences) is fence
    assert (link.fences > 0) is fence


def test_fence_key_parses_as_a_switch():
    assert CoordinatorConfig.from_mapping({"fence": "false"}, "env").fence is False
    assert CoordinatorConfig.from_mapping({"fence": True}, "toml").fence is True
    with pytest.raises(ConfigError, match="coordinator.fence has a bad value 'maybe'"):
        CoordinatorConfig.from_mapping({"fence": "maybe"}, "env")
