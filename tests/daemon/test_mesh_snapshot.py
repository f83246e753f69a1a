"""The mesh's snapshots beside its log (daemon.eventlog): the newest one that decodes is loaded and only the tail
after it is replayed; a damaged one is refused in one line and the older one used; compaction keeps what that
fallback needs."""

from __future__ import annotations

from meshsched.daemon.eventlog import (
    Snapshot,
    compactable,
    load_newest,
    log_key,
    snapshot_key,
)

from meshsched import snapshot
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
