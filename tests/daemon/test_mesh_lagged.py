"""A running node whose log was compacted past its position (it stalled across two snapshots, shorter than
node_grace) restarts itself in place, loads the newest snapshot and reconciles its runs with it. Before, it logged
"restart meshd to load the newest snapshot", applied the entries after the gap to a state they did not follow, and
the jobs placed on it in the skipped entries stayed LOADING for good (CI, 2026-11-29: the joining-node snapshot
test timed out when a meshd stalled past its 3 s lease under load)."""

from __future__ import annotations

import signal
import sys

import pytest

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
        assert "restarting meshd to load the newest snapshot" in log, log
        assert "loaded the snapshot at log entry" in log, log
        assert stalled.proc.pid == pid and stalled.proc.poll() is None  # the same process, started again in place
        m.wait_up(stalled)
