"""Castor's decision latency on a large mesh (issue 26): a change the state's log cannot name (a timer tick, a
fitted model, forgotten jobs) no longer rebuilds the holders' arrays from scratch, and the release pass's partner
search adds candidates one by one before it asks `holding_prefix`; neither changes a decision."""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import installed_handle, load_perf_model
from meshsched.policies import castor as castor_mod
from meshsched.policies.castor import Castor
from meshsched.policies.occupancy import Occupancy
from meshsched.policies.registry import make_policy, stack_of
from meshsched.state import ClusterState, JobSpec, NodeSpec
from tests.support.occupancy import snapshot as _snapshot

PERF = load_perf_model()


class FixedXi:
    def xi(self, *_):
        return (1.1, 1.1)


def _count_builds(monkeypatch, occ) -> list[int]:
    """A list that gets a 1 for each full build of `occ`'s arrays (the policy's own, not a fresh copy's)."""
    builds: list[int] = []
    real = Occupancy._build
    monkeypatch.setattr(Occupancy, "_build", lambda self, holding: builds.extend([1] if self is occ else []) or
                        real(self, holding))
    return builds


def _fresh(castor, eng):
    return Occupancy(eng.state, eng.view().holding(), castor._solo_step, castor._occupancy(eng.view(), eng.state)._group_of)


def test_an_unnamed_change_rereads_only_the_holders_that_moved(monkeypatch):
    eng = Engine(stack_of(Castor(perf=PERF, interference=FixedXi())), ProfileEstimator(PERF), ClusterState())
    for name in ("n0", "n1"):
        eng.handle(ev.NodeJoined(f"join-{name}", NodeSpec(name, 4, "v100", 16384)), 0.0)
    for i, gpus in enumerate((4, 2, 1, 1)):
        eng.handle(ev.JobSubmitted(f"s{i}", JobSpec(f"j{i}", gpus, "resnet18", 64 * gpus, 50_000, submit_time=0.0)), 0.0)
        eng.handle(ev.JobStarted(f"st{i}", f"j{i}"), 1.0)
    castor = eng.policy.placement
    occ = castor._occupancy(eng.view(), eng.state)
    builds = _count_builds(monkeypatch, occ)

    eng.handle(ev.Tick("tick", 7), 10.0)  # no job id: the log cannot name what moved
    assert eng.state.changed_since(occ.version) is None
    assert castor._occupancy(eng.view(), eng.state) is occ and occ.current(eng.state)
    assert builds == []  # was a full rebuild
    assert _snapshot(occ, 30.0) == _snapshot(_fresh(castor, eng), 30.0)

    job = eng.state.jobs["j1"]  # progress moved without a name, as a change the log cannot tell would
    job.done_iterations, job.progress_time = 1_234.0, 12.0
    eng.state.touch()
    castor._occupancy(eng.view(), eng.state)
    assert builds == [] and occ.left[occ.row("j1")] == job.spec.iterations - 1_234.0
    assert _snapshot(occ, 30.0) == _snapshot(_fresh(castor, eng), 30.0)

    eng.handle(ev.JobFinished("fin", "j2"), 20.0)  # a named change: the log's own path
    eng.state.touch()
    castor._occupancy(eng.view(), eng.state)
    assert builds == [] and occ.row("j2") is None
    assert _snapshot(occ, 30.0) == _snapshot(_fresh(castor, eng), 30.0)

    eng.handle(ev.NodeJoined("join-n2", NodeSpec("n2", 4, "v100", 16384)), 25.0)  # new GPUs: they join the arrays
    castor._occupancy(eng.view(), eng.state)
    assert builds == []  # was a full rebuild
    assert _snapshot(occ, 30.0) == _snapshot(_fresh(castor, eng), 30.0)
    assert occ.holders.shape == (12, 2) and occ.node_row == {"n0": 0, "n1": 1, "n2": 2}

    eng.handle(ev.JobSubmitted("s9", JobSpec("j9", 4, "resnet18", 256, 50_000, submit_time=26.0)), 26.0)
    eng.handle(ev.JobStarted("st9", "j9"), 26.5)
    lost = eng.state.jobs["j0"].gpus and eng.state.gpus[eng.state.jobs["j0"].gpus[0]].node
    eng.handle(ev.NodeLost("lost", lost), 27.0)  # its jobs are released, then the node is gone
    castor._occupancy(eng.view(), eng.state)
    assert builds == [] and lost not in occ.node_row and sorted(occ.node_row.values()) == [0, 1]
    assert (occ.holders[eng.state.nodes[lost].gpus] == -1).all()
    assert _snapshot(occ, 30.0) == _snapshot(_fresh(castor, eng), 30.0)

    eng.handle(ev.NodeJoined("join-n3", NodeSpec("n3", 4, "p100", 16384)), 28.0)  # a new GPU type: rebuilt
    castor._occupancy(eng.view(), eng.state)
    assert builds == [1]
    assert _snapshot(occ, 30.0) == _snapshot(_fresh(castor, eng), 30.0)


def test_many_named_changes_are_applied_one_by_one_up_to_half_the_holders(monkeypatch):
    """300 progress reports between two passes (more than the old fixed 256) no longer rebuild the arrays while
    they name under half the holders; past half they do; the arrays end as a fresh build's either way."""
    eng = Engine(stack_of(Castor(perf=PERF, interference=FixedXi())), ProfileEstimator(PERF), ClusterState())
    for i in range(80):
        eng.handle(ev.NodeJoined(f"join-{i}", NodeSpec(f"n{i:02d}", 8, "v100", 16384)), 0.0)
    for i in range(640):
        eng.handle(ev.JobSubmitted(f"s{i}", JobSpec(f"j{i}", 1, "resnet18", 64, 50_000, submit_time=0.0)), 0.0)
        eng.handle(ev.JobStarted(f"st{i}", f"j{i}"), 1.0)
    castor = eng.policy.placement
    occ = castor._occupancy(eng.view(), eng.state)
    builds = _count_builds(monkeypatch, occ)
    for count, rebuilt in ((300, []), (330, [1])):
        for i in range(count):
            job = eng.state.jobs[f"j{i}"]
            eng.handle(ev.IterationReport(f"r{count}-{i}", job.job_id, 100.0 + count + i, job.step_time), 50.0)
        assert len(eng.state.changed_since(occ.version)) == count
        assert castor._occupancy(eng.view(), eng.state) is occ and occ.current(eng.state)
        assert builds == rebuilt  # 300: was a full rebuild (past 256)
        assert _snapshot(occ, 60.0) == _snapshot(_fresh(castor, eng), 60.0)


def test_arrays_follow_nodes_lost_and_joining_in_a_busy_replay():
    """A busy replay with sharing in which nodes are lost and come back: after every event the policy's arrays
    read exactly as a fresh build, and none of those changes rebuilt them (a new node: the test above)."""
    from meshsched.loaders.traces import TraceOptions, load_trace
    from meshsched.sim.loop import ClusterSpec, simulate

    tr = load_trace("philly", PERF, TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, first_n=150, load=2.0))
    t0, t1 = tr.jobs[30].submit_time, tr.jobs[120].submit_time
    step = (t1 - t0) / 6
    back = NodeSpec  # (the simulated world knows the GPUs of its start: a lost node comes back, none is new)
    extra = [(t0, ev.NodeLost("lose-1", "node1")), (t0 + step, ev.NodeLost("lose-0", "node0")),
             (t0 + 2 * step, ev.NodeJoined("back-1", back("node1", 8, "v100", 16384))),
             (t0 + 3 * step, ev.NodeLost("lose-2", "node2")),
             (t0 + 4 * step, ev.NodeJoined("back-0", back("node0", 8, "v100", 16384))),
             (t0 + 5 * step, ev.NodeJoined("back-2", back("node2", 8, "v100", 16384)))]
    seen = {"builds": 0, "checked": 0, "nodes": set()}

    def check(eng):
        castor = eng.policy.placement
        occ = castor._occ
        if occ is None:
            return
        if seen.get("occ") is not occ:
            seen["occ"] = occ
            real = occ._build
            occ._build = lambda holding: seen.__setitem__("builds", seen["builds"] + 1) or real(holding)
        castor._occupancy(eng.view(), eng.state)
        now = max((j.since for j in eng.state.jobs.values()), default=0.0) + 7.0
        assert _snapshot(occ, now) == _snapshot(_fresh(castor, eng), now)
        seen["nodes"].add(tuple(sorted(occ.node_row)))
        seen["checked"] += 1

    r = simulate(tr.jobs, make_policy("castor", installed_handle()), PERF, ClusterSpec(4, 8, "v100", 16384),
                 after_event=check, events=extra)
    assert seen["checked"] > 150 and r.engine.policy.placement.share_log
    assert len(seen["nodes"]) >= 4  # the node changes reached the arrays
    assert seen["builds"] == 0  # each was a full rebuild


def _replay(after=None):
    from meshsched.loaders.traces import TraceOptions, load_trace
    from meshsched.sim.loop import ClusterSpec, simulate

    tr = load_trace("philly", PERF, TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, first_n=150, load=2.0))
    log = []

    def record(eng):
        if after is not None:
            after(eng)
        log.append(tuple((j.job_id, j.state.value, j.gpus, j.exec, j.reason)
                         for j in eng.state.jobs.values() if not j.state.is_terminal))

    r = simulate(tr.jobs, make_policy("castor", installed_handle()), PERF, ClusterSpec(4, 8, "v100", 16384),
                 after_event=record)
    return log, r.engine.policy.placement.share_log


@pytest.mark.slow
def test_unnamed_changes_one_by_one_partners_and_any_block_size_change_no_decision(monkeypatch):
    """A busy replay three ways: plain; every event followed by a change the log cannot name (the arrays follow
    by re-reading the holders that moved), with `holding_prefix` asked for every partner search (it was; now only
    when none of the first few candidates holds the job) and blocks of one job; blocks of every job of a kind.
    The same starts, partners, micro-batches and pending reasons each time."""
    calls = []
    real = castor_mod.holding_prefix
    monkeypatch.setattr(castor_mod, "holding_prefix", lambda *a: calls.append(1) or real(*a))
    plain, plain_shares = _replay()
    assert plain_shares and calls == []  # each search's partners were among the first candidates
    monkeypatch.setattr(castor_mod, "_ONE_BY_ONE", 0)
    monkeypatch.setattr(castor_mod, "_CHUNK", 1)
    exact, exact_shares = _replay(lambda eng: eng.state.touch())
    assert calls  # the exact search ran
    assert plain_shares == exact_shares and plain == exact
    monkeypatch.setattr(castor_mod, "_ONE_BY_ONE", 16)
    monkeypatch.setattr(castor_mod, "_CHUNK", 1 << 22)
    big, big_shares = _replay()
    assert plain_shares == big_shares and plain == big
