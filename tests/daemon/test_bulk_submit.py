"""Bulk submission (issue 22, point 8): an array is accepted in one journal transaction, whatever its size.

The SQL meshd's journal runs is traced (sqlite3's trace callback on every connection opened during the test) and
the statements one `Submission.submit` runs are counted: no timing is measured.
"""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from tests.support.daemon import daemon_in_thread, make_config, poll, remove, short_dir


@pytest.fixture
def traced(tmp_path, monkeypatch):
    """(meshd in a thread, statements): every SQL statement its journal runs, in order."""
    statements: list[str] = []
    real = sqlite3.connect

    def connect(*args, **kwargs):
        db = real(*args, **kwargs)
        db.set_trace_callback(statements.append)
        return db

    monkeypatch.setattr(sqlite3, "connect", connect)
    runtime = short_dir()
    with daemon_in_thread(make_config(tmp_path / "state", runtime)) as (d, loop):
        yield d, loop, statements
    remove(runtime)


def on_loop(loop, call):
    """`call()` run on meshd's own thread (its journal is that thread's), its value returned."""

    async def run():
        return call()

    return asyncio.run_coroutine_threadsafe(run(), loop).result(60)


def submitted(d, loop, statements: list[str], tasks: int, hold: bool = True) -> list[list[str]]:
    """Submit an array of `tasks` as the API does; the transactions (their statements) that submit committed."""
    from meshsched.daemon.control import ControlRequest

    from meshsched.wire.protocol import SubmitRequest

    ctl, body = ControlRequest.split({"command": ["true"], "cwd": "/tmp", "gpus": 1, "env": {"A": "1"},
                                      "export": "ALL", "array": f"0-{tasks - 1}", "hold": hold})
    before = len(statements)
    recs = on_loop(loop, lambda: d.submission.submit(SubmitRequest.from_json(body), ctl, "tester"))
    # (on meshd's thread, in one call: nothing else it does interleaves)
    assert len(recs) == tasks
    return transactions(statements[before:])


def transactions(run: list[str]) -> list[list[str]]:
    """The statements of each transaction committed in `run`, in order."""
    out, current = [], None
    for sql in run:
        if sql.startswith("BEGIN"):
            current = []
        elif sql == "COMMIT":
            out.append(current)
            current = None
        elif current is not None:
            current.append(sql)
    assert current is None, "a transaction left open"
    return out


def test_an_array_of_300_is_accepted_in_one_transaction_and_scheduled_in_one_more(traced):
    d, loop, statements = traced
    small = submitted(d, loop, statements, 3)
    big = submitted(d, loop, statements, 300)
    # the id, every task's record and its PENDING transition: one commit; their first scheduling pass: one more
    assert len(big) == len(small) == 2, [len(t) for t in big]
    accept = big[0]
    assert sum("INSERT OR REPLACE INTO jobs" in s for s in accept) == 300
    assert sum("INSERT INTO transitions" in s for s in accept) == 300
    assert sum("next_seq" in s for s in accept) == 1  # the id is taken in the same transaction
    assert [r.job_id for r in d.control.targets("2")][:2] == ["2_0", "2_1"] and len(d.control.targets("2")) == 300


def test_ids_keep_counting_across_array_and_single_submits(traced):
    from meshsched.wire.protocol import SubmitRequest

    d, loop, statements = traced
    submitted(d, loop, statements, 2)
    one = on_loop(loop, lambda: d.submit(SubmitRequest(command=["true"], cwd="/tmp", iterations=10), "tester"))
    submitted(d, loop, statements, 2)
    assert one.job_id == "2" and "3_0" in d.records and "3_1" in d.records


def one_submit(d, loop, statements: list[str]) -> list[list[str]]:
    """One plain 1-GPU submit as the API makes it; the transactions (their statements) it committed."""
    from meshsched.daemon.control import PLAIN

    from meshsched.wire.protocol import SubmitRequest

    req = SubmitRequest(command=["true"], cwd="/tmp", gpus=1, iterations=10, env={"A": "1"}, export="ALL")
    before = len(statements)
    on_loop(loop, lambda: d.submission.submit(req, PLAIN, "tester"))
    return transactions(statements[before:])


def test_a_submit_writes_the_same_whatever_the_queue_behind_a_busy_node(traced):
    """Many shells submitting at once (issue 22 point 8): what meshd writes for one submit does not grow with the
    jobs already queued (no pass that rewrites every pending record): the same statements with 3 or 207 waiting."""
    import time

    from meshsched.daemon.control import PLAIN, ControlRequest

    from meshsched.wire.protocol import SubmitRequest

    d, loop, statements = traced
    hog = SubmitRequest(command=["sleep", "600"], cwd="/tmp", gpus=4, iterations=10)
    blocker = on_loop(loop, lambda: d.submission.submit(hog, PLAIN, "tester"))[0].job_id
    try:
        deadline = time.monotonic() + 30
        while d.records[blocker].state != "RUNNING":
            assert time.monotonic() < deadline, d.records[blocker].state
            time.sleep(0.05)
        for _ in range(3):
            one_submit(d, loop, statements)
        few = one_submit(d, loop, statements)
        ctl, body = ControlRequest.split({"command": ["true"], "cwd": "/tmp", "gpus": 1, "array": "0-199"})
        on_loop(loop, lambda: d.submission.submit(SubmitRequest.from_json(body), ctl, "tester"))  # 200 more waiting
        for _ in range(3):
            one_submit(d, loop, statements)
        many = one_submit(d, loop, statements)
        assert sum(r.state == "PENDING" for r in d.records.values()) >= 207
        shape = lambda txs: [[s.split("(")[0][:40] for s in tx] for tx in txs]
        assert shape(many) == shape(few), (few, many)
        assert sum("INSERT OR REPLACE INTO jobs" in s for tx in many for s in tx) == 1  # its record (a pass that
        # leaves it as it is writes it no more: test_a_busy_clusters_array_is_written_once)
    finally:
        on_loop(loop, lambda: d.cancel(blocker))
        deadline = time.monotonic() + 30
        while d.records[blocker].state != "CANCELLED" and time.monotonic() < deadline:
            time.sleep(0.05)


def wait_running(d, job_id: str) -> None:
    import time

    deadline = time.monotonic() + 30
    while d.records[job_id].state != "RUNNING":
        assert time.monotonic() < deadline, d.records[job_id].state
        time.sleep(0.05)


def journaled_records(d) -> dict:
    """job id -> the record meshd's journal has committed, as a restart reads it (on a connection of its own)."""
    from meshsched.daemon.journal import Journal

    journal = Journal(d.journal.path)
    try:
        return {rec.job_id: rec for rec in journal.load()}
    finally:
        journal.close()


def test_a_busy_clusters_array_is_written_once_and_a_started_task_twice(traced):
    """Fails before: every task's first scheduling pass wrote its record again, unchanged (600 records for an
    array of 300 behind a busy node). A pass that changes a task (it starts) still writes it; the journal holds
    what meshd holds in memory either way."""
    from meshsched.daemon.control import PLAIN

    from meshsched.wire.protocol import SubmitRequest

    d, loop, statements = traced
    free = submitted(d, loop, statements, 2, hold=False)  # 4 GPUs: both tasks start in their pass
    assert sum("INSERT OR REPLACE INTO jobs" in s for s in free[1]) == 2
    assert {d.records["1_0"].state, d.records["1_1"].state} <= {"LOADING", "RUNNING", "COMPLETED"}
    on_loop(loop, lambda: [d.cancel(j) for j in ("1_0", "1_1")])
    hog = SubmitRequest(command=["sleep", "600"], cwd="/tmp", gpus=4, iterations=10)
    blocker = on_loop(loop, lambda: d.submission.submit(hog, PLAIN, "tester"))[0].job_id
    try:
        wait_running(d, blocker)  # every GPU held: no task of the next array can start
        busy = submitted(d, loop, statements, 5, hold=False)
        # their records, their transitions, the id: one commit; their passes changed nothing, so wrote nothing
        assert len(busy) == 1 and sum("INSERT OR REPLACE INTO jobs" in s for s in busy[0]) == 5, busy
        kept = journaled_records(d)  # (the tasks' env is the array's, written once: test_array_env_is_journaled_once)
        assert all(kept[f"3_{i}"] == d.records[f"3_{i}"] for i in range(5))
        assert all(d.records[f"3_{i}"].state == "PENDING" for i in range(5))
    finally:
        on_loop(loop, lambda: d.cancel(blocker))


def test_a_placement_without_an_admission_check_is_not_asked_per_task(traced, monkeypatch):
    """Fails before: an array's every task asked the policy stack whether its placement layer refuses it (an
    isinstance on a runtime Protocol, ~40 us each) though the default layer has no such check."""
    from meshsched.policies.stack import PolicyStack

    d, loop, statements = traced
    asked = []
    real = PolicyStack.admission_error
    monkeypatch.setattr(PolicyStack, "admission_error", lambda self, view, spec: asked.append(spec) or real(
        self, view, spec))
    submitted(d, loop, statements, 30)
    assert asked == []


def test_an_array_gets_one_scheduling_pass_and_its_cancel_one_more(traced, monkeypatch):
    """Fails before: each of an array's tasks had a scheduling pass of its own at submit (300 passes for 300 tasks,
    ~40 % of the accept's CPU), and its cancel one event (and a pass wherever a slot freed) per task. Now the tasks
    reach the engine together (`Engine.handle_many`): one pass, the same tasks started; one pass for the cancel."""
    from meshsched.policies.stack import PolicyStack

    d, loop, _ = traced
    passes: list = []
    real = PolicyStack.schedule
    monkeypatch.setattr(PolicyStack, "schedule", lambda self, view, now, trigger: passes.append(trigger) or real(
        self, view, now, trigger))

    def counted(call):
        before = len(passes)  # on meshd's thread: nothing else it does interleaves with `call`
        out = call()
        return out, len(passes) - before

    from meshsched.daemon.control import ControlRequest

    from meshsched.wire.protocol import SubmitRequest

    ctl, body = ControlRequest.split({"command": ["sleep", "600"], "cwd": "/tmp", "gpus": 1, "array": "0-299%3"})
    recs, n = on_loop(loop, lambda: counted(lambda: d.submission.submit(SubmitRequest.from_json(body), ctl, "t")))
    assert n == 1 and len(recs) == 300
    states = [d.records[r.job_id].state for r in recs]
    assert states[:3] == ["LOADING"] * 3 or all(s in ("LOADING", "RUNNING") for s in states[:3]), states[:3]
    assert set(states[3:]) == {"PENDING"}  # the throttle %3: as one task at a time would have had it
    assert d.engine.pending_reason("1_3") == d.engine.pending_reason("1_299") != ""
    ctl, body = ControlRequest.split({"command": ["sleep", "600"], "cwd": "/tmp", "gpus": 1, "array": "0-299"})
    plain, n = on_loop(loop, lambda: counted(lambda: d.submission.submit(SubmitRequest.from_json(body), ctl, "t")))
    assert n == 1  # (before: 300)
    assert d.records["2_0"].state in ("LOADING", "RUNNING") and {r.state for r in plain[1:]} == {"PENDING"}
    assert (d.engine.pending_reason("2_1"), d.engine.pending_reason("2_299")) == ("Resources", "Priority")
    running = recs[:3] + plain[:1]
    _, n = on_loop(loop, lambda: counted(lambda: d.cancel_many([r.job_id for r in recs + plain])))
    assert n <= 1
    assert {d.records[r.job_id].state for r in recs[3:] + plain[1:]} == {"CANCELLED"}
    assert all(d.records[r.job_id].cancelling or d.records[r.job_id].state == "CANCELLED" for r in running)
    poll(lambda: all(d.records[r.job_id].state == "CANCELLED" for r in running), 30, "tasks killed")
