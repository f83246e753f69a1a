"""The state's change log names a node joining or lost (`ClusterState.changes_since`: the jobs, and whether the
nodes changed), while `changed_since` (victim_rank, the plain occupancy) still answers None for it."""

from __future__ import annotations

from meshsched.state import ClusterState, NodeSpec


def _state() -> ClusterState:
    s = ClusterState()
    s.add_node(NodeSpec("a", 4, "v100", 16384))
    return s


def test_a_node_joining_or_lost_is_named_with_the_jobs_around_it():
    s = _state()
    v = s.version
    s.touch("j1")
    s.add_node(NodeSpec("b", 4, "v100", 16384))
    s.touch("j2")
    assert s.changes_since(v) == ({"j1", "j2"}, True)
    assert s.changes_since(v + 2) == ({"j2"}, False)
    assert s.changed_since(v) is None  # unchanged for its users: a node change is not a job's
    assert s.changed_since(v + 2) == {"j2"}
    w = s.version
    s.mark_lost("b")
    assert s.changes_since(w) == (set(), True) and s.changed_since(w) is None
    s.add_node(NodeSpec("b", 4, "v100", 16384))  # back again
    assert s.changes_since(w) == (set(), True)


def test_an_anonymous_touch_or_an_outrun_log_still_answers_none():
    s = _state()
    v = s.version
    s.add_node(NodeSpec("b", 4, "v100", 16384))
    s.touch()
    assert s.changes_since(v) is None and s.changed_since(v) is None
    s.version += 1  # bumped by hand
    assert s.changes_since(v + 2) is None
    assert s.changes_since(s.version) == (set(), False) and s.changed_since(s.version) == set()
    t = _state()
    for i in range(len(t.changes) + t.changes.maxlen):
        t.touch(f"j{i}")
    assert t.changes_since(0) is None


def test_a_job_named_like_anything_is_never_the_node_marker():
    s = _state()
    v = s.version
    for name in ("nodes", "\0nodes", "", "NODES"):
        s.touch(name)
    assert s.changes_since(v) == ({"nodes", "\0nodes", "", "NODES"}, False)
