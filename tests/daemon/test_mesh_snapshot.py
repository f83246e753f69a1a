"""The mesh's snapshots beside its log (daemon.eventlog): the newest one that decodes is loaded and only the tail
after it is replayed; a damaged one is refused in one line and the older one used; compaction keeps what that
fallback needs."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

import pytest
from meshsched.cli.mesh_local import MeshNode
from meshsched.daemon.config import CoordinatorConfig
from meshsched.daemon.etcd import EtcdCoordinator
from meshsched.daemon.eventlog import (
    Snapshot,
    compactable,
    index_of,
    load_newest,
    log_key,
    part_key,
    snapshot_key,
)

from meshsched import snapshot
from tests.support.mesh import local_mesh
from tests.support.daemon import poll
from tests.support.workload import engine, record


def _snap(run, policy: str, cut: int) -> Snapshot:
    eng = engine(policy)
    for event, now in run.fed[:cut]:
        eng.handle(event, now)
    return Snapshot(cut, snapshot.encode(eng), {"j0": {"command": ["true"]}}, {"n0": "0001"}, {"n0": "10.0.0.1"})


def _catch_up(run, policy: str, items: dict[str, str], refused: list[str]):
    """A joining node: the newest snapshot that loads, then the log after it."""
    found = load_newest(items, lambda s: snapshot.decode(s.engine, engine(policy)), refused.append)
    start, eng = (0, engine(policy)) if found is None else (found[0].index, found[1])
    for event, now in run.fed[start:]:
        eng.handle(event, now)
    return eng


def test_the_newest_snapshot_is_loaded_and_the_tail_replayed():
    run = record("sjf", 3, jobs=30)
    n = len(run.fed)
    items = {snapshot_key(k): _snap(run, "sjf", k).to_json() for k in (n // 3, 2 * n // 3)}
    refused: list[str] = []
    loaded = load_newest(items, lambda s: s.index, refused.append)
    assert loaded is not None and loaded[0].index == 2 * n // 3 and not refused
    assert loaded[0].addresses == {"n0": "10.0.0.1"} and loaded[0].last_seq == {"n0": "0001"}
    eng = _catch_up(run, "sjf", items, refused)
    assert snapshot.encode(eng) == snapshot.encode(run.engine)


def test_a_corrupt_newest_snapshot_falls_back_to_the_older_one():
    run = record("srtf", 5, jobs=30)
    n = len(run.fed)
    older, newest = n // 3, 2 * n // 3
    good = _snap(run, "srtf", newest)
    broken_engine = dict(good.engine, jobs=[{"spec": "nonsense"}])
    for damaged in (good.to_json()[:-40], Snapshot(newest, broken_engine, {}, {}, {}).to_json(),
                    Snapshot(newest, dict(good.engine, version=0), {}, {}, {}).to_json()):
        items = {snapshot_key(older): _snap(run, "srtf", older).to_json(), snapshot_key(newest): damaged}
        refused: list[str] = []
        found = load_newest(items, lambda s: snapshot.decode(s.engine, engine("srtf")), refused.append)
        assert found is not None and found[0].index == older
        assert len(refused) == 1 and refused[0].startswith(f"snapshot {newest} refused: ") and "\n" not in refused[0]
        eng = _catch_up(run, "srtf", items, [])
        assert snapshot.encode(eng) == snapshot.encode(run.engine)  # the older snapshot and a longer tail agree


def test_no_readable_snapshot_means_the_whole_log():
    refused: list[str] = []
    assert load_newest({snapshot_key(7): "{"}, lambda s: s, refused.append) is None
    assert len(refused) == 1 and "snapshot 7 refused" in refused[0]
    assert load_newest({}, lambda s: s, refused.append) is None


def test_compaction_keeps_the_previous_snapshot_and_the_log_after_it():
    logs = [log_key(i) for i in range(1, 31)]
    assert compactable(logs, [snapshot_key(10)]) == ([], [])  # one snapshot: nothing to fall back on yet
    drop_log, drop_snaps = compactable(logs, [snapshot_key(10), snapshot_key(20), snapshot_key(30)])
    assert drop_log == [log_key(i) for i in range(1, 21)]
    assert drop_snaps == [snapshot_key(10)]


# ------------------------------------------------------------------ over etcd: meshd writes, compacts and loads them

def _store(url: str):
    return EtcdCoordinator(CoordinatorConfig("etcd", (url,), ttl=3, loop_wait=1.0, retry_timeout=1.0), "probe")


def _etcd(url: str, what):
    """Run `what(coordinator)` against the mesh's etcd (a probe that is not a member)."""
    async def go():
        coord = _store(url)
        await coord.start()
        try:
            return await what(coord)
        finally:
            await coord.close(release=True)

    return asyncio.run(go())


async def _keys(coord) -> tuple[list[int], list[int]]:
    logs, snaps = await coord.list("log/"), await coord.list("snapshots/")
    return sorted(map(index_of, logs.items)), sorted(map(index_of, snaps.items))


@pytest.mark.slow
def test_meshd_snapshots_compacts_and_a_joining_node_loads_the_older_one_when_the_newest_is_corrupt(monkeypatch):
    monkeypatch.setenv("MESHD_COORDINATOR_SNAPSHOT_ENTRIES", "12")
    with local_mesh(2, prefix="meshsnap", gpus=2, ttl=3, node_grace=30.0) as m:
        client = m.client(m.members[0])
        jobs = [client.call("POST", "/v1/jobs", {"command": [sys.executable, "-c", "pass"], "gpus": 1, "cwd": "/tmp",
                                                 "env": {}})["job_id"] for _ in range(10)]

        def states(node) -> dict[str, str]:
            return {j["job_id"]: j["state"] for j in m.client(node).call("GET", "/v1/jobs?all=1")}

        poll(lambda: all(states(m.members[0]).get(j) == "COMPLETED" for j in jobs), timeout=90, what="jobs end")
        # two snapshots at least: the log up to the older one is gone, the older snapshots too
        logs, snaps = poll(lambda: (k := _etcd(m.etcd.url, _keys)) and len(k[1]) == 2 and k, timeout=30,
                           what="a second snapshot and the compaction after it")
        assert logs and logs[0] == snaps[0] + 1, (logs, snaps)  # every entry after the older snapshot is kept
        # the newest snapshot damaged: a joining node refuses it in one line and loads the older one
        newest, older = snaps[1], snaps[0]
        _etcd(m.etcd.url, lambda c: c.put(part_key(newest, 0), '{"i": 1, "engine": {"vers'))  # its first part
        base = Path(tempfile.mkdtemp(prefix="mn3", dir="/tmp"))
        joiner = MeshNode("n3", base / "s", base / "r", base / "meshd.toml")
        joiner.config.write_text(m.members[0].config.read_text().replace('node_name = "n1"', 'node_name = "n3"'))
        m.members.append(joiner)
        m.launch(joiner)
        m.wait_up(joiner)
        poll(lambda: sum(n["alive"] for n in m.nodes_view(joiner)) == 3, timeout=30, what="n3 joined, as n3 sees it")
        log = m.log(joiner)
        assert log.count(f"snapshot {newest} refused") == 1, log
        assert f"loaded the snapshot at log entry {older}" in log, log
        assert states(joiner) == states(m.members[0]) == states(m.members[1])  # it agrees with the others
        # and it runs what the mesh gives it
        more = m.client(joiner).call("POST", "/v1/jobs", {"command": [sys.executable, "-c", "pass"], "gpus": 1,
                                                          "cwd": "/tmp", "env": {}})["job_id"]
        poll(lambda: states(m.members[0]).get(more) == "COMPLETED", timeout=60, what="a job through the joiner")


@pytest.mark.slow
def test_a_node_restarted_behind_the_snapshot_does_not_leave_the_skipped_launches_undone(monkeypatch):
    """n2's meshd is down (not yet lost) while the leader places jobs on its GPUs and snapshots twice past n2's
    journal: the launches were in the skipped entries. Restarted, n2 loads the snapshot and sends those jobs back
    to the queue (replaying the full log it would have launched them); every job completes."""
    monkeypatch.setenv("MESHD_COORDINATOR_SNAPSHOT_ENTRIES", "8")
    with local_mesh(2, prefix="meshsnap", gpus=2, ttl=3, node_grace=300.0) as m:
        n1, n2 = m.members
        poll(lambda: sum(n["alive"] for n in m.nodes_view(n1)) == 2, what="two nodes joined")
        client = m.client(n1)
        m.kill(n2)  # its ranks would outlive it; its member entry lapses, it is not lost for node_grace

        def submit(code: str) -> str:
            return client.call("POST", "/v1/jobs", {"command": [sys.executable, "-c", code], "gpus": 1, "cwd": "/tmp",
                                                    "env": {}})["job_id"]

        def states() -> dict[str, str]:
            return {j["job_id"]: j["state"] for j in client.call("GET", "/v1/jobs?all=1")}

        def placed_on_n2() -> list[str]:
            return [j["job_id"] for j in client.call("GET", "/v1/jobs?all=1") if "n2" in str(j.get("node", ""))
                    and j["state"] in ("LOADING", "RUNNING")]

        stuck = [submit("pass") for _ in range(4)]  # two of them land on n2's GPUs, which nobody launches
        poll(lambda: len(placed_on_n2()) == 2, timeout=30, what="two jobs placed on the dead n2")
        on_n2 = placed_on_n2()
        more = [submit("pass") for _ in range(8)]  # entries enough for two snapshots past n2's journal
        poll(lambda: all(states().get(j) == "COMPLETED" for j in more), timeout=90, what="n1's jobs end")
        poll(lambda: (k := _etcd(m.etcd.url, _keys)) and len(k[1]) == 2 and k, timeout=30, what="two snapshots")
        m.launch(n2)
        m.wait_up(n2)
        poll(lambda: all(states().get(j) == "COMPLETED" for j in stuck + more), timeout=60,
             what=f"the jobs placed on n2 while it was down ({on_n2}) complete")
        assert "loaded the snapshot at log entry" in m.log(n2)  # (its first start found none)


def test_snapshot_interval_keys_are_read_and_checked():
    from meshsched.daemon.config import ConfigError

    cfg = CoordinatorConfig.from_mapping({"snapshot_entries": "20", "snapshot_bytes": 0}, "env")
    assert (cfg.snapshot_entries, cfg.snapshot_bytes) == (20, 0)
    assert (CoordinatorConfig().snapshot_entries, CoordinatorConfig().snapshot_bytes) == (1000, 8 * 2**20)
    for bad in ({"snapshot_entries": "-1"}, {"snapshot_bytes": "lots"}, {"snapshot_entries": 2.5}):
        with pytest.raises(ConfigError, match="snapshot_"):
            CoordinatorConfig.from_mapping(bad, "env")


def test_a_large_snapshot_is_written_in_parts_each_under_etcds_request_limit():
    from meshsched.daemon.eventlog import PART_CHARS, join_snapshots, split_snapshot

    big = Snapshot(9, {"blob": "x" * (3 * PART_CHARS)}, {}, {}, {})
    parts, head = split_snapshot(big)
    assert len(parts) == 4 and all(len(t) <= PART_CHARS for t in parts.values())
    assert join_snapshots({snapshot_key(9): head}, parts) == {snapshot_key(9): big.to_json()}
    del parts[part_key(9, 2)]  # a lost part: the text does not decode, load_newest refuses it
    refused: list[str] = []
    assert load_newest(join_snapshots({snapshot_key(9): head}, parts), lambda s: s, refused.append) is None
    assert len(refused) == 1 and "missing or damaged" in refused[0], refused
