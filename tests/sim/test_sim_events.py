"""The simulator replays drains and resumes from an event list (issue 23, "Drain and resume": `mesh simulate`
can replay a drain, so that a maintenance window can be planned): the loop feeds `DrainChanged` events at
their times, and `meshsched.loaders.events` reads them from a CSV or JSON-lines file."""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.loaders.events import EventsError, load_events, parse_events
from meshsched.loaders.profiles import installed_handle
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.sim.metrics import summarise, summary_dict
from meshsched.sim.rules import rules_named
from meshsched.state import JobSpec, JobState
from tests.support.fakes import LinearPerf

DRAIN_AT, RESUME_AT = 100.0, 5000.0
CLUSTER = ClusterSpec(2, 2, "fake", 16384)  # node0, node1; 2 GPUs each


def _job(job_id: str, gpus: int, iterations: int, submit: float) -> JobSpec:
    return JobSpec(job_id, gpus, "m", 100 * gpus, iterations, submit_time=submit)  # 1 s a step (LinearPerf)


def _jobs() -> list[JobSpec]:
    """Two 2-GPU jobs fill both nodes at 0 (about 1,010 s each); twenty 1-GPU jobs (510 s) queue behind them."""
    return [_job("a", 2, 1000, 0.0), _job("b", 2, 1000, 0.0)] + [_job(f"q{i:02d}", 1, 500, 200.0) for i in range(20)]


def _starts():
    """An `after_event` that records each placement (job, its nodes, when), stamped with the engine's last log time."""
    seen: dict[str, tuple[int, ...]] = {}
    starts: list[tuple[str, set[str], float]] = []

    def check(engine) -> None:
        now = engine.log[-1].time if engine.log else 0.0
        for job in engine.state.jobs.values():
            if job.gpus and seen.get(job.job_id) != job.gpus:
                seen[job.job_id] = job.gpus
                starts.append((job.job_id, {engine.state.gpus[g].node for g in job.gpus}, now))
            engine.state.validate()

    return check, starts


def _run(events=(), policy: str = "fifo", rules=None):
    check, starts = _starts()
    kw = {} if rules is None else {"rules": rules}
    r = simulate(_jobs(), make_policy(policy, installed_handle()), LinearPerf(), CLUSTER, after_event=check,
                 events=events, **kw)
    return r, starts


def _window(node: str = "node0"):
    return [(DRAIN_AT, ev.DrainChanged("d", node, (), True, "driver update")),
            (RESUME_AT, ev.DrainChanged("r", node, (), False))]


def test_drain_window_running_jobs_finish_nothing_starts_there_resume_places_again():
    base, base_starts = _run()
    r, starts = _run(_window())
    jobs = r.engine.state.jobs
    on_node0 = [j for j, nodes, _ in base_starts if nodes == {"node0"} and j in ("a", "b")]
    assert len(on_node0) == 1  # one of the two big jobs runs on node0 when it is drained
    held = jobs[on_node0[0]]
    assert held.state is JobState.COMPLETED  # the job running there at the drain finishes, as without the drain
    assert held.acct.finish_time == pytest.approx(base.engine.state.jobs[held.job_id].acct.finish_time)
    assert DRAIN_AT < held.acct.finish_time < RESUME_AT
    inside = [(j, t) for j, nodes, t in starts if "node0" in nodes and DRAIN_AT <= t < RESUME_AT]
    assert inside == []  # nothing starts on the drained node inside the window
    assert any("node1" in nodes and DRAIN_AT <= t < RESUME_AT for _, nodes, t in starts)  # the other node works on
    after = [(j, t) for j, nodes, t in starts if "node0" in nodes and t >= RESUME_AT]
    assert after and min(t for _, t in after) == pytest.approx(RESUME_AT)  # the resume's pass places jobs there
    assert all(j.state is JobState.COMPLETED for j in jobs.values())
    assert summarise(r, "fifo").jct_mean_h > summarise(base, "fifo").jct_mean_h  # the window costs something
    assert r.engine.drains.all_status() == []


def test_without_events_the_replay_is_unchanged():
    plain = simulate(_jobs(), make_policy("srtf", installed_handle()), LinearPerf(), CLUSTER)
    empty = simulate(_jobs(), make_policy("srtf", installed_handle()), LinearPerf(), CLUSTER, events=[])
    assert summary_dict(summarise(plain, "srtf")) == summary_dict(summarise(empty, "srtf"))


def test_a_partial_drain_keeps_only_the_named_gpus_free():
    r, starts = _run([(DRAIN_AT, ev.DrainChanged("d", "node0", (1,), True, "xid"))])
    late = [(nodes, t) for j, nodes, t in starts if j.startswith("q")]
    assert any("node0" in nodes for nodes, _ in late)  # GPU 0 of node0 still takes jobs
    for job in r.engine.state.jobs.values():
        assert job.state is JobState.COMPLETED
    assert r.engine.drains.status("node0")["gpus"] == [1]  # never resumed: drained to the end


def test_drain_under_time_stepped_rules():
    r, starts = _run(_window(), rules=rules_named("lucid"))
    assert not [j for j, nodes, t in starts if "node0" in nodes and DRAIN_AT <= t < RESUME_AT]
    assert all(j.state is JobState.COMPLETED for j in r.engine.state.jobs.values())


# ---------------------------------------------------------------------------------------------- the file


NODES = CLUSTER.node_specs()


def test_csv_and_json_lines_read_the_same_events():
    csv_text = ("# a maintenance window\n"
                "time,node,action,gpus,reason\n"
                "2h,node1,resume,,\n"
                "90m,0,drain,\"0,1\",driver update\n"
                "7300,node1:1,drain,,xid 79\n")
    jsonl = ('{"time": 7200, "node": "node1", "action": "resume"}\n'
             '{"time": "90m", "node": 0, "action": "drain", "gpus": [0, 1], "reason": "driver update"}\n'
             '\n'
             '{"time": 7300, "node": "node1", "gpus": "1", "action": "drain", "reason": "xid 79"}\n')
    for text in (csv_text, jsonl):
        got = [(t, e.node, e.gpus, e.drain, e.reason) for t, e in parse_events("f", text, NODES)]
        assert got == [(5400.0, "node0", (0, 1), True, "driver update"), (7200.0, "node1", (), False, ""),
                       (7300.0, "node1", (1,), True, "xid 79")]


def test_timestamps_are_on_the_trace_clock(tmp_path):
    path = tmp_path / "ev.csv"
    path.write_text("time,node,action\n2017-09-04 12:30:41,0,drain\n")
    origin = 1504521041.0  # 2017-09-04 10:30:41, the first arrival of the built-in philly trace
    assert [t for t, _ in load_events(path, NODES, origin)] == [7200.0]
    assert [t for t, _ in load_events(path, NODES, origin, load=2.0)] == [3600.0]  # placed as an arrival would be
    with pytest.raises(EventsError, match=r"ev.csv:2: .*no clock"):
        load_events(path, NODES, None)


@pytest.mark.parametrize("text, where, what", [
    ("time,node,action\n1,0,drain\n5,9,resume\n", ":3:", "node '9'"),
    ("time,node,action\nsoon,0,drain\n", ":2:", "neither seconds"),
    ("time,node,action\n-5,0,drain\n", ":2:", "before the replay's first arrival"),
    ("time,node,action\n5,0,reboot\n", ":2:", "expected drain or resume"),
    ("time,node,action,gpus\n5,0,drain,7\n", ":2:", "node0 has GPUs 0..1"),
    ("time,node,action,colour\n5,0,drain,red\n", ":1:", "unknown column 'colour'"),
    ("time,node\n5,0\n", ":1:", "missing column(s) action"),
    ("time,node,action\n5,0,drain,extra\n", ":2:", "field(s)"),
    ('{"time": 5, "node": 0, "action": "drain"}\n{"time": 6, "node": 0\n', ":2:", "not a JSON object"),
    ('{"time": 5, "node": 0, "action": "drain", "why": "x"}\n', ":1:", "unknown key 'why'"),
    ("time,node,action\n", "", "no events"),
    ("\n\n", "", "empty events file"),
])
def test_a_bad_file_is_one_line_naming_the_line(text, where, what):
    with pytest.raises(EventsError) as info:
        parse_events("ev.csv", text, NODES)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"ev.csv{where}") and what in msg, msg


def test_missing_file(tmp_path):
    with pytest.raises(EventsError, match="no such events file"):
        load_events(tmp_path / "nope.csv", NODES)
