"""The mesh's outbox survives a SIGKILL of meshd (daemon/mesh.py: `mesh-outbox.jsonl` in the state dir): what a node
acknowledged (a hold, release, requeue, any proposal) is written before `propose` returns, proposed again under the
same key by the next meshd, and applied once even where the log already holds it. In-process, over
LocalCoordinator (the end-to-end kill -9 case is in test_mesh_fencing.py)."""

from __future__ import annotations

import asyncio
import json
import time

from meshsched.daemon.config import CoordinatorConfig
from meshsched.daemon.coordinator import LocalCoordinator
from meshsched.daemon.eventlog import Entry, log_key
from meshsched.daemon.mesh import LinkContext, MeshLink

from meshsched import events as ev


class Replica:
    """What MeshLink needs of a node's replica: the entries it applies, in order; where its outbox lives."""

    def __init__(self, outbox_path) -> None:
        self.applied: list[tuple[int, ev.Event]] = []
        self.outbox_path = outbox_path  # meshd's: mesh-outbox.jsonl in its state dir

    def apply_entry(self, entry, index: int, act: bool) -> None:
        self.applied.append((index, entry.event))

    def synced(self) -> None:
        pass

    def leadership_changed(self, leader) -> None:
        pass


def _link(path, coord=None, replica=None) -> MeshLink:
    ctx = LinkContext("n1", "n1", (), 0, dict, {})
    return MeshLink(ctx, replica or Replica(path), coord or LocalCoordinator("n1"), CoordinatorConfig(), node_grace=60.0)


async def _until(pred, timeout: float = 10.0, msg=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out {msg()}"
        await asyncio.sleep(0.01)


def test_a_proposal_in_a_killed_meshds_outbox_reaches_the_log_once(tmp_path):
    path = tmp_path / "mesh-outbox.jsonl"
    dead = _link(path)  # never started: no leader, nothing leaves the outbox
    dead.propose(ev.HoldRequested("hold-1", "n1.7"))
    dead.propose(ev.ReleaseRequested("release-2", "n1.8"))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [Entry.from_json(item["value"]).event.stimulus_id for item in lines] == ["hold-1", "release-2"]
    key = lines[0]["key"]
    # the crash came after the hold was put and the leader appended it, before its line was marked done: the
    # log already holds it, and the next meshd proposes it again under the same key
    held = Entry(ev.HoldRequested("hold-1", "n1.7"), "n1", proposal=key.removeprefix("proposals/")).to_json()
    store = LocalCoordinator("n1", initial={log_key(1): held})
    replica = Replica(path)
    again = _link(path, store, replica)  # `dead` is dropped without close(): as after kill -9
    assert again.view()["outbox"] == 2

    async def run() -> None:
        again.start()
        try:
            await _until(lambda: again.view()["outbox"] == 0 and again.position >= 3, msg=lambda: (again.view(), store._records))
            await asyncio.sleep(0.1)
        finally:
            await again.close()

    asyncio.run(run())
    events = [e for _, e in replica.applied]
    assert [type(e).__name__ for e in events] == ["HoldRequested", "ReleaseRequested"], events
    assert not path.read_text()  # all handed over: the next meshd proposes nothing again
    assert _link(path).view()["outbox"] == 0


def test_a_line_cut_short_by_a_crash_is_skipped(tmp_path):
    path = tmp_path / "mesh-outbox.jsonl"
    first = _link(path)
    first.propose(ev.RequeueRequested("requeue-1", "n1.3"))
    with path.open("a") as f:
        f.write('{"key":"proposals/n1/0001","val')  # never acknowledged: the write did not finish
    assert _link(path).view()["outbox"] == 1
