"""The mesh across network namespaces (tests/support/netns.py): 3 meshd + etcd, each with its own address; the
leader's namespace is cut off (its link taken down, its meshd left running), a new leader takes over, every job
ends COMPLETED, and the old leader comes back as a follower once its link is up again."""

from __future__ import annotations

import sys
import types

import pytest

from benchmarks.failover import JOB_SCRIPT, Bench
from tests.support.daemon import poll
from tests.support.netns import NetnsUnavailable, netns_mesh

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


def _view(mesh, node) -> list[dict]:
    try:
        return mesh.nodes_view(node)
    except Exception:  # noqa: BLE001 - a node busy rejoining answers on the next poll
        return []


def _own(mesh, node) -> dict:
    view = _view(mesh, node)
    return view[0]["mesh"] if view else {}


@pytest.mark.slow
def test_a_partitioned_leader_is_replaced_its_jobs_finish_and_it_rejoins_as_a_follower(tmp_path):
    try:
        ctx = netns_mesh(3, gpus=2, ttl=3, node_grace=4.0)
        m = ctx.__enter__()
    except NetnsUnavailable as e:
        pytest.skip(f"no network namespaces here: {e}")
    try:
        poll(lambda: all(sum(n["alive"] for n in _view(m, node)) == 3 for node in m.members), timeout=30,
             what="three nodes joined, as every node sees it")
        leader = poll(m.leader, what="a leader")
        old_term = _own(m, leader)["term"]
        other = next(n for n in m.members if n is not leader)
        client = m.client(other)
        ledger = tmp_path / "ledger"
        ledger.mkdir()
        (tmp_path / "job.py").write_text(JOB_SCRIPT)
        argv = [sys.executable, str(tmp_path / "job.py"), str(ledger), "6"]
        jobs = [client.call("POST", "/v1/jobs", {"command": argv, "gpus": 1, "cwd": str(tmp_path), "env": {}})
                ["job_id"] for _ in range(6)]  # six GPUs: two of the jobs run on the leader's
        poll(lambda: sum(1 for _ in ledger.iterdir()) == 6, what="the six jobs' ranks started")

        m.fabric.link_down(m.index(leader))  # the leader's meshd and its ranks run on, cut off from etcd
        survivors = [n for n in m.members if n is not leader]
        new = poll(lambda: next((n for n in survivors if (_own(m, n).get("term") or 0) > old_term), None),
                   timeout=20, what="a new leader on the connected side")
        poll(lambda: _own(m, leader).get("term") is None, timeout=10, what="the cut-off leader stepping down")
        poll(lambda: any(v["name"] == leader.name and not v["alive"] for v in _view(m, new)), timeout=20,
             what="the cut-off node declared lost after node_grace")

        m.fabric.link_up(m.index(leader))
        states = poll(lambda: (s := {j["job_id"]: j["state"] for j in m.client(new).call("GET", "/v1/jobs")})
                      and all(s.get(j) in TERMINAL for j in jobs) and s, timeout=40, what="every job ended")
        assert {j: states[j] for j in jobs} == {j: "COMPLETED" for j in jobs}  # nothing lost
        # back: a follower of the new leader that has applied the same log
        poll(lambda: (o := _own(m, leader)).get("leader") == new.name and o.get("term") is None
             and o.get("log_position") == _own(m, new).get("log_position"), timeout=20,
             what="the old leader following the new one")
        assert _view(m, leader)[0]["leader"] is False and sum(v["leader"] for v in _view(m, new)) == 1
        # Without fencing, a lost node's copies may still run while the job starts elsewhere: shown, not asserted
        print(f"jobs live on two nodes at once: {Bench.twice(types.SimpleNamespace(ledger=ledger))}")
        try:
            poll(lambda: all(sum(n["alive"] for n in _view(m, node)) == 3 for node in m.members), timeout=8,
                 what="the old leader alive again in every node's view")
        except AssertionError:
            # seen on main 973c723: the node's NodeLost stays in force until its meshd restarts (mesh_node.py
            # proposes NodeJoined only at start); passes as soon as a node that is back re-announces itself
            pytest.xfail("a node declared lost and reconnected is not alive again until its meshd restarts")
    finally:
        ctx.__exit__(None, None, None)
