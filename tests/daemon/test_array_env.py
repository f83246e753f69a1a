"""An array's environment is stored once (issue 22 point 8, bulk speed): its tasks share one env dict in meshd and one
row of the journal's `envs` table, named by digest from each task's record; a restart (what a kill -9 leaves: the
journal as committed when the submit was answered) reads back every task with that environment, and each task
still runs with its own MESH_ARRAY_TASK_ID. No timing is measured.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3

import pytest

from tests.support.daemon import daemon_in_thread, make_config, poll, remove, short_dir


@pytest.fixture
def meshd(tmp_path):
    runtime = short_dir()
    with daemon_in_thread(make_config(tmp_path / "state", runtime)) as (d, loop):
        yield d, loop
    remove(runtime)


def on_loop(loop, call):
    async def run():
        return call()

    return asyncio.run_coroutine_threadsafe(run(), loop).result(60)


def submit_array(d, loop, body: dict):
    from meshsched.daemon.control import ControlRequest

    from meshsched.wire.protocol import SubmitRequest

    ctl, rest = ControlRequest.split(body)
    return on_loop(loop, lambda: d.submission.submit(SubmitRequest.from_json(rest), ctl, "tester"))


def reopened(d) -> dict:
    """job id -> record, as a meshd restarted on this journal reads it (a connection of its own, beside meshd's)."""
    from meshsched.daemon.journal import Journal

    journal = Journal(d.journal.path)
    try:
        return {rec.job_id: rec for rec in journal.load()}
    finally:
        journal.close()


def rows(d, sql: str) -> list[tuple]:
    db = sqlite3.connect(d.journal.path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


ENV = {"FOO": "bar", "WANDB_MODE": "offline", "PATH": "/usr/bin:/bin", "BIG": "x" * 2000}


def test_an_arrays_env_is_journaled_once_and_read_back_for_every_task(meshd):
    """Fails before: every task's record held a copy of the environment (300 copies in the journal's `jobs` table,
    300 dicts in meshd), and there was no `envs` table."""
    d, loop = meshd
    recs = submit_array(d, loop, {"command": ["true"], "cwd": "/tmp", "gpus": 1, "env": ENV, "export": "ALL",
                                  "array": "0-299", "hold": True})
    assert len({id(r.env) for r in recs}) == 1  # one dict for the array in meshd
    assert rows(d, "SELECT count(*) FROM envs") == [(1,)]
    texts = dict(rows(d, "SELECT job_id, record FROM jobs"))
    assert all("BIG" not in texts[r.job_id] and "env_ref" in json.loads(texts[r.job_id]) for r in recs)
    back = reopened(d)  # the journal as a kill -9 right after the answer leaves it
    want = {**ENV, "MESH_ARRAY_JOB_ID": recs[0].array_id, "MESH_ARRAY_TASK_COUNT": "300",
            "MESH_ARRAY_TASK_MIN": "0", "MESH_ARRAY_TASK_MAX": "299"}
    assert all(back[r.job_id] == r for r in recs) and back[recs[7].job_id].env == want
    assert len({id(back[r.job_id].env) for r in recs}) == 1  # shared again after the restart


def test_a_plain_jobs_env_stays_in_its_record_and_arrays_with_the_same_env_share_a_row(meshd):
    d, loop = meshd
    body = {"command": ["true"], "cwd": "/tmp", "gpus": 1, "env": ENV, "export": "ALL", "array": "0-2", "hold": True}
    submit_array(d, loop, body)
    submit_array(d, loop, {**body, "array": "0-4"})  # another array id, another count: another env
    plain = submit_array(d, loop, {k: v for k, v in body.items() if k != "array"})[0]
    assert rows(d, "SELECT count(*) FROM envs") == [(2,)]
    (text,) = rows(d, f"SELECT record FROM jobs WHERE job_id='{plain.job_id}'")[0]
    assert json.loads(text)["env"] == ENV
    assert reopened(d)[plain.job_id].env == ENV


def test_an_env_no_task_names_any_more_leaves_the_journal_at_the_next_start(meshd):
    from meshsched import events as ev

    d, loop = meshd
    recs = submit_array(d, loop, {"command": ["true"], "cwd": "/tmp", "gpus": 1, "env": ENV, "export": "ALL",
                                  "array": "0-2", "hold": True})
    with_tasks = on_loop(loop, lambda: [d.cancel(r.job_id) for r in recs])
    assert all(r.state == "CANCELLED" for r in with_tasks)
    on_loop(loop, lambda: d.loop.dispatch(ev.JobsForgotten("forget", tuple(r.job_id for r in recs))))
    assert not any(r.job_id in d.records for r in recs)
    assert rows(d, "SELECT count(*) FROM envs") == [(1,)]  # until a start reads the journal
    assert not any(r.job_id in reopened(d) for r in recs)
    assert rows(d, "SELECT count(*) FROM envs") == [(0,)]


def test_a_journal_whose_array_tasks_hold_their_own_env_still_loads(meshd):
    """A journal written before the env was stored once: each task's record holds its env (MESH_ARRAY_TASK_ID
    included); it reads back as it was."""
    d, loop = meshd
    (rec,) = submit_array(d, loop, {"command": ["true"], "cwd": "/tmp", "gpus": 1, "env": ENV, "export": "ALL",
                                    "array": "0", "hold": True})
    old = json.loads(rec.to_json())
    old.update(job_id="99_0", seq=99, array_id="99", env={**ENV, "MESH_ARRAY_TASK_ID": "0"})
    db = sqlite3.connect(d.journal.path)
    with db:
        db.execute("INSERT INTO jobs (job_id, seq, record, state) VALUES (?, ?, ?, ?)",
                   ("99_0", 99, json.dumps(old), "PENDING"))
    db.close()
    assert reopened(d)["99_0"].env == {**ENV, "MESH_ARRAY_TASK_ID": "0"}


def test_each_task_runs_with_its_own_task_id_and_the_arrays_variables(meshd, tmp_path):
    d, loop = meshd
    out = tmp_path / "out"
    out.mkdir()
    script = ('echo "$MESH_ARRAY_JOB_ID $MESH_ARRAY_TASK_ID $MESH_ARRAY_TASK_COUNT $MESH_ARRAY_TASK_MIN '
              f'$MESH_ARRAY_TASK_MAX $FOO" > {out}/$MESH_ARRAY_TASK_ID')
    recs = submit_array(d, loop, {"command": ["/bin/sh", "-c", script], "cwd": "/tmp", "gpus": 1,
                                  "env": {"FOO": "bar", "PATH": "/usr/bin:/bin", "MESH_ARRAY_TASK_ID": "77"},
                                  "export": "ALL", "array": "1,3,5"})
    poll(lambda: all(d.records[r.job_id].state == "COMPLETED" for r in recs), 60, "the tasks completed")
    aid = recs[0].array_id
    assert {p.name: p.read_text().split() for p in out.iterdir()} == {
        t: [aid, t, "3", "1", "5", "bar"] for t in ("1", "3", "5")}
