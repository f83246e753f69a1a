"""`mesh drain` on a 3-node mesh over a real etcd (issue 23, point 4): the drain goes through the leader's log,
the drained node's running job finishes, queued jobs start only on the other nodes, and the drain survives a
kill -9 of the leader (which is the drained node's meshd here) and its restart; a resume places there again."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.mesh import local_mesh
from tests.support.daemon import poll


@pytest.fixture
def three():
    with local_mesh(3, gpus=2, ttl=3, node_grace=4.0) as m:
        poll(lambda: all(sum(n["alive"] for n in m.nodes_view(node)) == 3 for node in m.members),
             what="three nodes joined, as every node sees it")
        yield m


def _submit(client, go: Path) -> str:
    argv = ["/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.1; done"]
    return client.call("POST", "/v1/jobs", {"command": argv, "gpus": 2, "cwd": "/tmp", "env": {}})["job_id"]


def _jobs(client) -> dict[str, dict]:
    return {j["job_id"]: j for j in client.call("GET", "/v1/jobs?all=1")}


def _drained(client) -> dict[str, str]:
    return {d["node"]: d["state"] for d in client.call("GET", "/v1/drains")}


@pytest.mark.slow
def test_drain_on_a_mesh_survives_the_leaders_death(three, tmp_path):
    m = three
    target = poll(m.leader, what="a leader")
    other = next(n for n in m.members if n is not target)
    client = m.client(other)
    go, go2 = tmp_path / "go", tmp_path / "go2"
    first = [_submit(client, go) for _ in range(3)]  # one per node
    poll(lambda: all(_jobs(client)[j]["state"] == "RUNNING" for j in first), timeout=60, what="three jobs running")
    on_target = next(j for j in first if _jobs(client)[j]["node"] == target.name)
    client.call("POST", "/v1/drain", {"node": target.name, "reason": "maintenance"})
    poll(lambda: all(_drained(m.client(n)).get(target.name) == "DRAINING" for n in m.members), timeout=30,
         what="every node applied the drain")
    queued = [_submit(client, go2) for _ in range(2)]
    go.touch()
    poll(lambda: all(_jobs(client)[j]["state"] == "COMPLETED" for j in first), timeout=60,
         what="the running jobs (the drained node's too) finish")
    assert _jobs(client)[on_target]["state"] == "COMPLETED"
    poll(lambda: all(_jobs(client)[j]["state"] == "RUNNING" for j in queued), timeout=60, what="queued jobs start")
    assert target.name not in {_jobs(client)[j]["node"] for j in queued}

    m.kill(target)  # kill -9 of the leader, the drained node's meshd
    poll(lambda: (ld := m.leader()) is not None and ld is not target, timeout=30, what="a new leader")
    assert _drained(client) == {target.name: "DRAINED"}
    m.launch(target)
    m.wait_up(target)
    poll(lambda: _drained(m.client(target)) == {target.name: "DRAINED"}, timeout=30, what="the restart replayed it")
    late = _submit(client, go2)
    client.call("POST", "/v1/resume", {"node": target.name})
    poll(lambda: _jobs(client)[late]["state"] == "RUNNING", timeout=60, what="the resume places a job there")
    assert _jobs(client)[late]["node"] == target.name and _drained(client) == {}
    go2.touch()
    poll(lambda: all(_jobs(client)[j]["state"] == "COMPLETED" for j in [*queued, late]), timeout=60,
         what="every job ends")
