"""Fencing under a partition (daemon/mesh.py `_fence_watch`, daemon/mesh_node.py `fence`), and a proposal in a
killed meshd's outbox (`mesh-outbox.jsonl`), over a real etcd: one meshd is cut off from etcd by black-holing its
proxy (tests/support/partition.py), no process is killed to make the partition."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest
from meshsched.daemon.config import ConfigError, CoordinatorConfig, DaemonConfig
from meshsched.daemon.eventlog import Entry

from meshsched import events as ev
from tests.support.daemon import poll
from tests.support.partition import proxied_mesh

JOB = """\
import os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(f"{os.environ['MESH_RESTART_COUNT']} {os.getpid()} {time.time()!r}\\n")
time.sleep(120 if os.environ["MESH_RESTART_COUNT"] == "0" else 1)
"""


def test_node_grace_must_exceed_ttl(tmp_path):
    coord = CoordinatorConfig(backend="etcd", ttl=3, loop_wait=1, retry_timeout=1)
    with pytest.raises(ConfigError, match=r"node_grace must be > coordinator.ttl .* got 3 <= 3"):
        DaemonConfig(state_dir=tmp_path, runtime_dir=tmp_path, node_grace=3.0, coordinator=coord).validate()
    DaemonConfig(state_dir=tmp_path, runtime_dir=tmp_path, node_grace=3.5, coordinator=coord).validate()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _jobs(m, node) -> dict[str, dict]:
    return {j["job_id"]: j for j in m.client(node).call("GET", "/v1/jobs")}


def _log_entries(url: str, job_id: str, kind: type) -> int:
    """How many entries of the mesh's log are `kind` for `job_id` (read from etcd as a meshd would)."""
    from meshsched.daemon.etcd import EtcdCoordinator

    async def count() -> int:
        coord = EtcdCoordinator(CoordinatorConfig(backend="etcd", endpoints=(url,), ttl=3, loop_wait=1,
                                                  retry_timeout=1), "reader")
        await coord.start()
        try:
            listing = await coord.list("log/")
        finally:
            await coord.close()
        entries = [Entry.from_json(text) for text in listing.items.values()]
        return sum(isinstance(e.event, kind) and e.event.job_id == job_id for e in entries)

    return asyncio.run(count())


@pytest.mark.slow
def test_a_partitioned_node_stops_its_ranks_before_the_job_starts_elsewhere_and_its_outbox_survives(tmp_path):
    script, starts = tmp_path / "job.py", tmp_path / "starts"
    script.write_text(JOB)
    with proxied_mesh(2, gpus=1, ttl=3, node_grace=5.0) as m:
        poll(lambda: all(sum(n["alive"] for n in m.nodes_view(node)) == 2 for node in m.members), timeout=30,
             what="two nodes joined, as each sees it")
        first = m.members[0]
        job = m.client(first).call("POST", "/v1/jobs", {"command": [sys.executable, str(script), str(starts)],
                                                         "gpus": 1, "cwd": str(tmp_path), "env": {}})["job_id"]
        later = m.client(first).call("POST", "/v1/jobs", {"command": [sys.executable, "-c", "pass"], "gpus": 1,
                                                           "cwd": "/tmp", "env": {}, "begin": time.time() + 3600})
        later = later["job_id"]  # queued for an hour: `mesh hold` takes it
        poll(lambda: starts.exists() and starts.read_text().count("\n") == 1, timeout=30, what="the job started")
        run0, pid0, _ = starts.read_text().split()
        assert run0 == "0" and _alive(int(pid0))
        where = poll(lambda: _jobs(m, first)[job]["node"], what="the job's node")
        cut = next(n for n in m.members if n.name == where)
        other = next(n for n in m.members if n is not cut)

        m.proxies[cut.name].stall()  # the partition: cut's meshd and its job go on; etcd hears nothing of them
        dead_at, deadline = None, time.monotonic() + 60
        while starts.read_text().count("\n") < 2:  # until the job starts on the other node
            if dead_at is None and not _alive(int(pid0)):
                dead_at = time.time()  # observed after the fact: no earlier than the rank's real end
            assert time.monotonic() < deadline, "the job never started on the other node"
            time.sleep(0.02)
        run1, pid1, started_at = starts.read_text().splitlines()[1].split()
        assert run1 == "1" and int(pid1) != int(pid0)
        assert dead_at is not None, "the job started on the other node while its ranks on the cut-off one still ran"
        assert dead_at < float(started_at), (dead_at, started_at)  # never live on both nodes at once
        assert "fencing" in m.log(cut) and "Traceback" not in m.log(cut)
        assert _jobs(m, other)[job]["node"] == other.name

        # healed (no restart): cut, declared lost meanwhile, joins again and follows the log (the job ran to its
        # end on the other node, never again on cut)
        m.proxies[cut.name].heal()
        poll(lambda: _jobs(m, cut)[job]["state"] == "COMPLETED", timeout=30, what="the job completes (cut's view)")
        poll(lambda: all(n["alive"] for n in m.nodes_view(other)), timeout=30, what="cut joined again")
        poll(lambda: m.nodes_view(cut)[0]["mesh"]["fenced_at"] is None, what="cut no longer fenced")
        assert starts.read_text().count("\n") == 2 and m.nodes_view(cut)[0]["mesh"]["fences"] == 1

        # cut off again: a hold is acknowledged into cut's outbox; SIGKILL its meshd, heal, start it again
        m.proxies[cut.name].stall()
        m.client(cut).call("POST", f"/v1/jobs/{later}/hold")
        assert "HoldRequested" in (cut.state / "mesh-outbox.jsonl").read_text()
        m.kill(cut)
        m.proxies[cut.name].heal()
        m.launch(cut)
        m.wait_up(cut)
        poll(lambda: _jobs(m, other)[later].get("held"), timeout=30, what="the hold reaches the log")
        poll(lambda: m.nodes_view(cut)[0]["mesh"]["outbox"] == 0, timeout=30, what="cut's outbox empty")
        assert _log_entries(m.etcd.url, later, ev.HoldRequested) == 1
        assert not (cut.state / "mesh-outbox.jsonl").read_text()


def test_fence_checkpoints_where_there_is_time_and_stops_at_once_where_there_is_not():
    """MeshReplica.fence: rank 0's node asks for a checkpoint (the preemption path) and SIGTERMs once the time
    before the leader may declare the node lost, less the kill grace, has passed; with no such time, or for
    another node's rank 0, it stops the ranks at once; a rank 0 stopped so exits as a pause, never a failure."""
    from types import SimpleNamespace

    from meshsched.daemon.mesh_node import MeshReplica

    calls: list[tuple] = []
    running = {"a", "b", "c"}
    runs = SimpleNamespace(launched={"a": 1, "b": 1, "c": 1}, restart_for={},
                           rank0_here=lambda job: job != "c",
                           preempt=lambda action: calls.append(("checkpoint", action.job_id)))
    launcher = SimpleNamespace(running=lambda job: job in running,
                               stop=lambda job, grace: calls.append(("stop", job)))
    records = {j: SimpleNamespace(pausing=False) for j in running}
    ctx = SimpleNamespace(runs=runs, launcher=launcher, records=records, config=SimpleNamespace(kill_grace=1.0))
    replica = MeshReplica(ctx)

    async def go() -> None:
        assert replica.fence(budget=7.2) == ["a", "b", "c"]  # 7.2 - 1 - 6 = 0.2 s to checkpoint
        assert calls == [("checkpoint", "a"), ("checkpoint", "b"), ("stop", "c")]
        assert replica.fence(budget=7.0) == []  # fenced already: not asked twice
        running.discard("b")  # b checkpointed and left in time
        await asyncio.sleep(0.5)
        assert calls[3:] == [("stop", "a")]  # a did not: SIGTERM before the leader may count it lost
        replica.unfence()
        runs.launched["d"], records["d"] = 1, SimpleNamespace(pausing=False)
        running.add("d")
        assert replica.fence(budget=3.0) == ["a", "c", "d"]  # no time to checkpoint: stopped at once, as a pause
        assert calls[4:] == [("stop", "a"), ("stop", "c"), ("stop", "d")] and records["d"].pausing
        assert not records["c"].pausing  # not rank 0's node: its exit reports nothing (terminated, not failed)

    asyncio.run(go())
