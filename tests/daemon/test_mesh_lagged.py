"""A running node whose log was compacted past its position (it stalled across two snapshots, shorter than
node_grace) restarts itself in place, loads the newest snapshot and reconciles its runs with it. Before, it logged
"restart meshd to load the newest snapshot", applied the entries after the gap to a state they did not follow, and
the jobs placed on it in the skipped entries stayed LOADING for good (CI, 2026-11-29: the joining-node snapshot
test timed out when a meshd stalled past its 3 s lease under load)."""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest
from meshsched.daemon.config import CoordinatorConfig
from meshsched.daemon.coordinator import LocalCoordinator
from meshsched.daemon.eventlog import Entry, log_key
from meshsched.daemon.mesh import LinkContext, MeshLink

from tests.daemon.test_mesh_catch_up_hold import ME, _entries, _replica
from tests.daemon.test_mesh_snapshot import _etcd, _keys
from tests.support.daemon import poll
from tests.support.mesh import local_mesh


async def _member_names(coord) -> set[str]:
    return {member.name for member in await coord.members()}


@pytest.mark.slow
def test_a_node_stalled_past_two_snapshots_restarts_itself_and_its_jobs_complete(monkeypatch):
    monkeypatch.setenv("MESHD_COORDINATOR_SNAPSHOT_ENTRIES", "12")
    with local_mesh(2, prefix="meshlag", gpus=2, ttl=3, node_grace=120.0) as m:
        poll(lambda: sum(n["alive"] for n in m.nodes_view(m.members[0])) == 2, what="two nodes joined")
        lead = poll(m.leader, what="a leader")
        stalled = next(n for n in m.members if n is not lead)
        pid = stalled.proc.pid
        client = m.client(lead)
        stalled.proc.send_signal(signal.SIGSTOP)  # its watch, its lease and its launches all stop
        try:
            jobs = [client.call("POST", "/v1/jobs", {"command": [sys.executable, "-c", "pass"], "gpus": 1,
                                                     "cwd": "/tmp", "env": {}})["job_id"] for _ in range(10)]
            # the leader's own GPUs run the rest: two snapshots, and the log up to the older one deleted
            poll(lambda: len(_etcd(m.etcd.url, _keys)[1]) >= 2, timeout=60, what="two snapshots while it stalls")
            poll(lambda: stalled.name not in _etcd(m.etcd.url, _member_names), timeout=30,
                 what="its lease lapsed (resumed, it fences itself and lists the log again)")
        finally:
            stalled.proc.send_signal(signal.SIGCONT)

        def states() -> dict[str, str]:
            return {j["job_id"]: j["state"] for j in client.call("GET", "/v1/jobs?all=1")}

        try:
            poll(lambda: all(states().get(j) == "COMPLETED" for j in jobs), timeout=90, what="every job completes")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {states()}; the stalled node's log:\n{m.log(stalled)[-3000:]}") from None
        log = m.log(stalled)
        if "compacted while this node lagged" in log:  # (most runs: its watch was compacted past while it stalled;
            # in a few etcd had streamed every entry to it before the compaction, and it applied them on resuming)
            assert "restarting meshd to load the newest snapshot" in log, log
            assert "loaded the snapshot at log entry" in log, log
        assert stalled.proc.pid == pid and stalled.proc.poll() is None  # the same process, started again in place
        m.wait_up(stalled)


def _compacted_link(position: int, synced: bool):
    """A MeshLink of node ME at `position` over a log compacted up to entry 12 (entries 13-14 left)."""
    replica, eng, started = _replica()
    entries = {log_key(i): Entry(e, "leader", time=float(i), proposal=f"leader/{i:03d}").to_json()
               for i, e in zip((13, 14), _entries(lost=False))}
    restarts: list[str] = []
    link = MeshLink(LinkContext(ME, ME, (), 0, dict, {}, restart=restarts.append), replica,
                    LocalCoordinator(ME, initial=entries), CoordinatorConfig(), node_grace=60.0)
    link.position, link.synced = position, synced
    return link, eng, started, restarts


@pytest.mark.parametrize("position", [0, 2])
def test_a_running_node_behind_the_compacted_log_applies_nothing_and_asks_for_a_restart(position):
    """Before: at position 2 the entries after the gap were applied; at 0 (nothing applied yet when it stalled) a
    snapshot was loaded into the live engine and the launches the skipped entries gave it were never reconciled."""
    link, eng, started, restarts = _compacted_link(position, synced=True)
    loads: list[int] = []

    async def load_snapshot() -> None:  # (into this live engine: only a fresh one after `synced` is filled so)
        loads.append(link.position)

    link._load_snapshot = load_snapshot
    asyncio.run(link._catch_up())
    assert loads == []
    assert restarts == [f"the mesh's log was compacted past this node's position {position}"]
    assert link.lagged and link.replica.holding and link.position == position
    assert eng.state.jobs == {} and started == []
    asyncio.run(link._catch_up())  # listed again (a watch's gap): one restart asked
    assert len(restarts) == 1


def test_at_start_the_entries_after_the_gap_are_applied_as_before():
    link, eng, _, restarts = _compacted_link(0, synced=False)  # (no snapshot loads: a restart finds the same)
    loads: list[int] = []

    async def load_snapshot() -> None:
        loads.append(link.position)

    link._load_snapshot = load_snapshot
    asyncio.run(link._catch_up())
    assert loads == [0]
    assert restarts == [] and not link.lagged and link.position == 14 and "j" in eng.state.jobs
