"""A node declared lost twice (two leaders in turn) while its meshd runs proposes one rejoin, and a second
NodeJoined for a node that is in already is skipped: before, both NodeLost entries proposed a rejoin and the
second NodeJoined raised "node n15 already joined" in every node's log follower, which died on all 32 nodes of
the scale run (benchmarks/mesh_scale.py, 2026-11-27)."""

from __future__ import annotations

from types import SimpleNamespace

from meshsched import events as ev
from meshsched.daemon.eventlog import Entry
from meshsched.daemon.mesh_node import MeshReplica
from meshsched.state import NodeSpec
from tests.support.workload import engine


class _Journal:
    def __init__(self) -> None:
        self.applied: list[int] = []

    def batch(self):
        from contextlib import nullcontext

        return nullcontext()

    def set_applied(self, index: int) -> None:
        self.applied.append(index)


def test_two_lost_entries_one_rejoin_and_a_second_join_is_skipped():
    eng = engine("fifo")
    proposed: list[ev.Event] = []
    spec = NodeSpec("n15", 8, "A100", 40000)
    loop = SimpleNamespace(handle=lambda e, now, act, index: eng.handle(e, now),
                           input=lambda e, *a: proposed.append(e), sid=lambda p: f"{p}-{len(proposed)}")
    journal = _Journal()
    ctx = SimpleNamespace(engine=eng, loop=loop, records={}, journal=journal,
                          config=SimpleNamespace(node_name="n15", mesh_address=""), node_spec=lambda address: spec)
    replica = MeshReplica(ctx)
    replica._live = True  # the log is replayed: this meshd is up
    index = 0

    def apply(event: ev.Event) -> None:
        nonlocal index
        index += 1
        replica.apply_entry(Entry(event, "leader", time=float(index)), index, act=False)

    apply(ev.NodeJoined("join-1", spec))
    apply(ev.NodeLost("lost-n15-100", "n15"))  # declared lost by one leader
    apply(ev.NodeLost("lost-n15-130", "n15"))  # and again by the next one
    assert [type(e) for e in proposed] == [ev.NodeJoined]
    apply(proposed[0])
    assert eng.state.nodes["n15"].alive
    apply(ev.NodeJoined("rejoin-again", spec))  # a second join in the log (older code proposed one) is skipped
    assert eng.state.nodes["n15"].alive and journal.applied == [index]
