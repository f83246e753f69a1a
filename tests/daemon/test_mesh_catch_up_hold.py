"""A node behind the log's head (catching up after a partition, or at start) holds the launches its entries give it
until it has applied the head, then starts only the jobs the engine still places here. Found by the 32-node scale
run (2026-11-27): n2, cut off from etcd for 32 s and declared lost, caught up with the log once back and launched
job n27.28 from a placement made while it was missing (an entry before its NodeLost); the job had restarted on n16
2 s earlier, so for 0.63 s it was live on two nodes."""

from __future__ import annotations

import asyncio
from contextlib import nullcontext
from types import SimpleNamespace

from meshsched.daemon.config import CoordinatorConfig
from meshsched.daemon.coordinator import LocalCoordinator
from meshsched.daemon.eventlog import Entry, log_key
from meshsched.daemon.mesh import LinkContext, MeshLink
from meshsched.daemon.mesh_node import MeshReplica

from meshsched import events as ev
from meshsched.actions import (
    Kill,
    Launch,
    Preempt,
    Reconfigure,
    ScheduleTimer,
    SignalJob,
)
from meshsched.state import JobSpec, JobState, NodeSpec
from tests.support.workload import MODELS, engine

ME, OTHER = "n2", "n16"


class _Journal:
    def batch(self):
        return nullcontext()

    def set_applied(self, index: int) -> None:
        pass


def _replica():
    """A MeshReplica of node ME over a real engine; `started` lists the jobs whose ranks it launched here."""
    eng = engine("fifo")
    started: list[str] = []
    running: set[str] = set()

    def launch(action: Launch) -> None:
        if any(eng.state.gpus[g].node == ME for g in action.gpus) and action.job_id not in running:
            started.append(action.job_id)
            running.add(action.job_id)

    handlers = {Launch: launch, Preempt: lambda a: None, Kill: lambda a: running.discard(a.job_id),
                Reconfigure: lambda a: None, SignalJob: lambda a: None, ScheduleTimer: lambda a: None}

    def handle(event, now, act, index):
        for action in eng.handle(event, now):
            if act:
                handlers[type(action)](action)

    loop = SimpleNamespace(handle=handle, input=lambda *a, **k: None, sid=lambda p: p)
    ctx = SimpleNamespace(engine=eng, loop=loop, records={"j": object()}, journal=_Journal(),
                          launcher=SimpleNamespace(running=lambda job_id: job_id in running),
                          config=SimpleNamespace(node_name=ME, mesh_address=""), node_spec=None)
    replica = MeshReplica(ctx)
    replica.gate(handlers)
    return replica, eng, started


def _entries(lost: bool) -> list[ev.Event]:
    """J placed on ME (the only node then); with `lost`: ME declared lost, J requeued and started on OTHER."""
    out: list[ev.Event] = [ev.NodeJoined("join-me", NodeSpec(ME, 1, "A100", 40000)),
                           ev.JobSubmitted("submit", JobSpec("j", 1, MODELS[0], 32, 1000))]
    if lost:
        out += [ev.NodeJoined("join-other", NodeSpec(OTHER, 1, "A100", 40000)), ev.NodeLost("lost-me", ME),
                ev.JobStarted("started", "j")]
    return out


def _apply(replica: MeshReplica, events: list[ev.Event], behind: bool) -> None:
    for index, event in enumerate(events, 1):
        replica.holding = behind and index < len(events)  # as daemon.mesh sets it: before the head, launches wait
        replica.apply_entry(Entry(event, "leader", time=float(index)), index, act=True)
    replica.holding = False
    replica.release_held()


def test_behind_the_head_a_launch_the_log_later_moved_elsewhere_never_starts():
    replica, eng, started = _replica()
    _apply(replica, _entries(lost=True), behind=True)
    job = eng.state.jobs["j"]
    assert job.state is JobState.RUNNING and eng.state.gpus[job.gpus[0]].node == OTHER
    assert started == []  # before: ["j"] (launched here from the placement before the NodeLost)


def test_behind_the_head_a_launch_still_placed_here_starts_once_when_caught_up():
    replica, eng, started = _replica()
    events = _entries(lost=False) + [ev.Tick("tick", 1)]
    for index, event in enumerate(events, 1):
        replica.holding = index < len(events)
        replica.apply_entry(Entry(event, "leader", time=float(index)), index, act=True)
        assert started == []  # held while behind the head
    replica.holding = False
    replica.release_held()
    replica.release_held()
    assert started == ["j"] and eng.state.gpus[eng.state.jobs["j"].gpus[0]].node == ME


def test_at_the_head_a_launch_starts_at_once():
    replica, _, started = _replica()
    for index, event in enumerate(_entries(lost=False), 1):
        replica.apply_entry(Entry(event, "leader", time=float(index)), index, act=True)
    assert started == ["j"]  # no hold: the node is up to date


def _catch_up(lost: bool) -> list[str]:
    """MeshLink replays a listing of the log (the path after a partition or at start) into the replica."""
    replica, _, started = _replica()
    entries = {log_key(i): Entry(e, "leader", time=float(i), proposal=f"leader/{i:03d}").to_json()
               for i, e in enumerate(_entries(lost), 1)}
    link = MeshLink(LinkContext(ME, ME, (), 0, dict, {}), replica, LocalCoordinator(ME, initial=entries),
                    CoordinatorConfig(), node_grace=60.0)
    asyncio.run(link._catch_up())
    assert link.position == link.head == len(entries)
    return started


def test_mesh_link_catching_up_from_a_listing_holds_then_launches_only_what_is_still_here():
    assert _catch_up(lost=True) == []  # before: ["j"]
    assert _catch_up(lost=False) == ["j"]


def test_fenced_the_entries_the_watch_resumes_with_wait_for_the_listing_after_the_fence():
    """The scale run's path: n2 fenced, its watch resumed in etcd's history and delivered the missed entries one by
    one (each looks like the head); they wait while fenced, and the listing once etcd sees the node again gives
    the head: only what the engine still places here starts."""
    for lost, expected in ((True, []), (False, ["j"])):
        replica, _, started = _replica()
        texts = [Entry(e, "leader", time=float(i), proposal=f"leader/{i:03d}").to_json()
                 for i, e in enumerate(_entries(lost), 1)]
        link = MeshLink(LinkContext(ME, ME, (), 0, dict, {}), replica,
                        LocalCoordinator(ME, initial={log_key(i): t for i, t in enumerate(texts, 1)}),
                        CoordinatorConfig(), node_grace=60.0)
        link.fenced_at, link.head = 1.0, float("inf")  # as `_fence_watch` leaves it
        for index, text in enumerate(texts, 1):
            link._apply_text(index, text)  # what the resumed watch hands `_follow`
        assert started == []  # before: ["j"] in both cases, while fenced
        link.fenced_at = None  # etcd sees the node again: `_fence_watch` lists the log (`_relist`)
        asyncio.run(link._relist())
        assert started == expected


def test_a_launch_at_the_head_supersedes_the_held_one_of_the_same_job():
    """Held behind the head: J's first run here; then this node is declared lost and J requeued; the head entry (its
    rejoin) places J here again: the new run starts once, the old one never."""
    replica, eng, started = _replica()
    rejoin = ev.NodeJoined("rejoin", NodeSpec(ME, 1, "A100", 40000))
    events = _entries(lost=False) + [ev.NodeLost("lost-me", ME), rejoin]
    for index, event in enumerate(events, 1):
        replica.holding = index < len(events)
        replica.apply_entry(Entry(event, "leader", time=float(index)), index, act=True)
    assert [type(a).__name__ for _, a in replica.held["j"]] == ["Launch"] and replica.held["j"][0][1].restart == 1
    replica.holding = False
    replica.release_held()
    assert started == ["j"] and eng.state.jobs["j"].restarts == 2
