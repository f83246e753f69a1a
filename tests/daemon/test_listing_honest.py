"""Honest figures in meshd's views (issue 22, points 4 and 6): measured progress kept in the journal and told from
the engine's estimate, TIME as the time a job held GPUs (the recorded end of a job that ended while meshd was
down), and the table laid out in display cells with pending array tasks collapsed."""

from __future__ import annotations

import os

from meshsched.daemon.jobformat import DEFAULT, FIELDS, cells, collapse, render, row, task_ranges
from meshsched.daemon.journal import JobRecord, Journal
from meshsched.daemon.listing import progress_of, run_time, time_left
from meshsched.daemon.mirror import job_spec, mirror

from meshsched.state import Job, JobState


def _rec(tmp_path=None, **kw) -> JobRecord:
    base = dict(job_id="1", seq=1, gpus=1, model="custom", batch_size=32, iterations=100, submit_time=0.0, name="t",
                user="u", deadline=None, guaranteed=False, command=["true"], cwd="/", env={},
                job_dir=str(tmp_path) if tmp_path else "")
    base.update(kw)
    return JobRecord(**base)


def _job(rec: JobRecord, state: JobState, **kw) -> Job:
    return Job(job_spec(rec), ideal_step_time=1.0, state=state, **kw)


def test_a_measured_figure_is_journaled_and_survives_a_rebuilt_engine(tmp_path):
    """Fails before: nothing told a reported figure from the engine's extrapolation, and after a restart the
    figure started again from the estimate."""
    rec = _rec()
    mirror(rec, _job(rec, JobState.RUNNING, reported=(1220.0, 0.05), done_iterations=100.0), 10.0)
    assert rec.reported == [1220.0, 0.05]
    j = Journal(tmp_path / "j.sqlite")
    with j.batch():
        j.put(rec)
    j.close()
    back = Journal(tmp_path / "j.sqlite").load()[0]
    assert back.reported == [1220.0, 0.05]
    mirror(back, _job(back, JobState.RUNNING), 20.0)  # meshd restarted: the engine's Job has heard no report yet
    figures = progress_of(back, _job(back, JobState.RUNNING, step_time=1.0, progress_time=20.0), 25.0)
    assert figures["done_iterations"] == 1220.0 and figures["step_time"] == 0.05
    assert figures["progress"]["measured"] is True and figures["progress"]["estimated_iterations"] == 5.0


def test_a_job_that_reports_nothing_has_only_estimates():
    rec = _rec()
    job = _job(rec, JobState.RUNNING, step_time=1.0, progress_time=0.0)
    mirror(rec, job, 0.0)
    figures = progress_of(rec, job, 23.0)
    assert figures["done_iterations"] is None and figures["step_time"] is None
    assert figures["progress"] == {"measured": False, "iterations": None, "step_time": None, "estimated": True,
                                   "estimated_iterations": 23.0, "estimated_step_time": 1.0}


def test_time_counts_only_while_the_job_holds_gpus():
    """Fails before: TIME went on counting while a job was PREEMPTED (from its first start to now)."""
    rec = _rec()
    for at, state in ((100.0, JobState.LOADING), (102.0, JobState.RUNNING), (110.0, JobState.PREEMPTED),
                      (200.0, JobState.LOADING), (201.0, JobState.RUNNING)):
        mirror(rec, _job(rec, state), at)
    assert run_time(rec, 205.0) == 15.0  # 100-110 and 200-205; not the 90 s it waited preempted
    rec.time_limit, rec.time_limit_at = 60.0, 260.0
    assert time_left(rec, 205.0) == 55.0
    mirror(rec, _job(rec, JobState.COMPLETED), 206.0)
    assert run_time(rec, 999.0) == 16.0 and rec.held_since is None and time_left(rec, 999.0) is None


def test_a_job_that_ended_while_meshd_was_down_keeps_its_recorded_end(tmp_path):
    """Fails before: a 1 s job that ended while meshd was down showed the time until meshd noticed (0:13)."""
    rec = _rec(tmp_path)
    mirror(rec, _job(rec, JobState.LOADING), 1000.0)
    mirror(rec, _job(rec, JobState.RUNNING), 1000.2)
    (tmp_path / "result.json").write_text("{}")
    os.utime(tmp_path / "result.json", (1001.0, 1001.0))  # the supervisor wrote its result 1 s after the start
    mirror(rec, _job(rec, JobState.COMPLETED), 1013.0)  # meshd restarted and learned of it 13 s later
    assert rec.end_time == 1001.0 and run_time(rec, 2000.0) == 1.0


def test_an_old_result_is_not_the_end_of_a_job_cancelled_while_queued(tmp_path):
    rec = _rec(tmp_path)
    mirror(rec, _job(rec, JobState.LOADING), 1000.0)
    (tmp_path / "result.json").write_text("{}")
    os.utime(tmp_path / "result.json", (1005.0, 1005.0))
    mirror(rec, _job(rec, JobState.PREEMPTED), 1006.0)
    mirror(rec, _job(rec, JobState.CANCELLED), 1100.0)
    assert rec.end_time == 1100.0 and run_time(rec, 2000.0) == 6.0


def _brief(job_id: str, name: str = "t", state: str = "PENDING", reason: str = "Priority", **kw) -> dict:
    b = {"job_id": job_id, "name": name, "user": "u", "state": state, "gpus": 1, "node": "", "reason": reason,
         "elapsed": 0.0, "partners": [], "exec": None, "array_id": "", "array_task": None, "array_limit": 0}
    b.update(kw)
    return b


def test_pending_array_tasks_collapse_like_squeue():
    tasks = [_brief(f"12_{i}", array_id="12", array_task=i, array_limit=8) for i in range(5, 300)]
    running = _brief("12_4", state="RUNNING", array_id="12", array_task=4, node="n1")
    rows = collapse([_brief("11"), running, *tasks, _brief("13")])
    assert [r["job_id"] for r in rows] == ["11", "12_4", "12_[5-299%8]", "13"]
    assert task_ranges([1, 3, 5, 6, 7]) == "1,3,5-7"
    split = collapse([_brief("7_0", array_id="7", array_task=0, reason="Resources"),
                      *(_brief(f"7_{i}", array_id="7", array_task=i, reason="JobArrayTaskLimit") for i in (1, 2))])
    assert [r["job_id"] for r in split] == ["7_0", "7_[1-2]"]  # one row per reason, as they wait for different things


def test_columns_are_capped_and_wide_characters_aligned():
    """Fails before: a 128-character name widened every row; a CJK name moved the columns after it."""
    briefs = [_brief("1", name="x" * 128), _brief("2", name="训练任务"), _brief("3", name="e\u0301t\u00e9")]
    names = ("id", "name", "user", "state")
    lines = render([tuple(FIELDS[n][0] for n in names), *(row(b, names) for b in briefs)]).decode().splitlines()
    assert cells(lines[1]) < 60 and lines[1].split()[1].endswith("…") and cells(lines[1].split()[1]) == 32
    state_at = {cells(line[: line.rindex(" ", 0, len(line) - len(line.split()[-1]))]) for line in lines}
    assert len(state_at) == 1, lines  # the last column starts at the same cell on every row
    assert cells("训练") == 4 and cells("e\u0301") == 1
    default = render([tuple(FIELDS[n][0] for n in DEFAULT), row(_brief("1"), DEFAULT)]).decode()
    assert default.split()[:10] == ["JOBID", "NAME", "USER", "STATE", "TIME", "GPUS", "PARTNER", "BATCH", "MPS%",
                                    "NODE(REASON)"]
