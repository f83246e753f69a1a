"""What benchmarks/storage_chaos.py found in meshd, each pinned by a test that failed before its fix."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from meshsched.daemon.journal import Journal, JournalError
from meshsched.daemon.launcher import Outcome, proc_start_time, read_outcome
from meshsched.daemon.node import NodeDaemon
from meshsched.daemon.supervisor import reserve_result, write_result

from meshsched.wire.protocol import SubmitRequest
from tests.support.daemon import close_daemon, kill_sessions, make_config, py, small_tmpfs, wait_for


def _alive(pid: int) -> bool:
    return proc_start_time(pid) is not None  # a zombie (not reaped: meshd is gone) counts as ended


async def test_a_job_that_ends_while_meshd_is_down_keeps_its_exit_code(dirs):
    """Found by the storage chaos run (seed 1): a job that ended while meshd was down took its state from
    result.json on restart (FAILED) but not its exit code, so the record said FAILED with exit code None and
    `mesh submit --wait` could not return the job's own code."""
    cfg = make_config(*dirs)
    d1 = NodeDaemon(cfg)
    await d1.start()
    rec = d1.submit(SubmitRequest(command=py("import time, sys; time.sleep(1.0); sys.exit(7)"), cwd="/tmp", gpus=1,
                                  iterations=10), "tester")
    await wait_for(lambda: d1.records[rec.job_id].state == "RUNNING", what="started")
    sup = d1.records[rec.job_id].supervisor_pid
    await d1.close()  # meshd goes away; the job runs on and ends
    await wait_for(lambda: (Path(rec.job_dir) / "result.json").exists() and not _alive(sup),
                   what="job ended while meshd was down")
    d2 = NodeDaemon(cfg)
    await d2.start()
    try:
        got = d2.records[rec.job_id]
        assert (got.state, got.exit_code) == ("FAILED", 7)
    finally:
        await d2.close()
        kill_sessions([sup])
    async with NodeDaemon(cfg) as d3:  # and it is in the journal, not only in memory
        assert d3.records[rec.job_id].exit_code == 7


def test_a_journal_that_cannot_open_for_a_full_disk_is_not_called_unusable(tmp_path, monkeypatch):
    """Found by the storage chaos run (seed 1): meshd started on a full state disk said the journal "is unusable
    (database or disk is full); move it aside to start with an empty queue" -- advice that, followed, discards
    every job. A full disk is not a damaged journal: the line says to free space and start again."""
    path = tmp_path / "journal.sqlite"
    Journal(path).close()

    def full(*_a, **_k):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(sqlite3, "connect", full)
    try:
        Journal(path)
    except JournalError as exc:
        line = str(exc)
    else:
        raise AssertionError("a journal that cannot open must raise JournalError")
    assert "disk is full" in line and "move it aside to start" not in line and "free space" in line, line


def _back_to_queued(cfg, job_id: str, restarts: int = 0) -> None:
    """Rewrite the job's journal record as it was before its launch (what a WAL cut short leaves: the launch and
    the end lost), as meshd SIGKILLed would have left it."""
    journal = Journal(cfg.journal_path)
    try:
        rec = next(r for r in journal.load() if r.job_id == job_id)
        rec.state, rec.reason, rec.restarts, rec.assigned, rec.exit_code = "PENDING", "", restarts, [], None
        rec.start_time = rec.end_time = None
        rec.supervisor_pid, rec.supervisor_start = 0, ""
        rec.done_iterations = rec.checkpoint_iterations = 0.0
        with journal.batch():
            journal.put(rec)
    finally:
        journal.close()


def _counting(truth: Path, code: int) -> list[str]:
    """A job that appends a line to `truth` per run (its ground truth) and exits `code`."""
    return py(f"import sys; open({str(truth)!r}, 'a').write('run\\n'); sys.exit({code})")


@pytest.mark.parametrize("code", [0, 7])
async def test_a_finished_job_the_journal_lost_the_end_of_is_not_run_again(dirs, tmp_path, code):
    """Found by the storage chaos run (seed 3): meshd SIGKILLed, its journal's WAL cut short, the journal lost a
    finished job's launch and end (the record was queued again); on restart meshd launched it again under the same
    id although result.json said how it had ended. Now the result (newer than the record's last launch) ends it:
    one run, its real state and exit code."""
    cfg = make_config(*dirs)
    truth = tmp_path / "truth"
    async with NodeDaemon(cfg) as d1:
        rec = d1.submit(SubmitRequest(command=_counting(truth, code), cwd="/tmp", gpus=1, iterations=10), "tester")
        await wait_for(lambda: d1.records[rec.job_id].state in ("COMPLETED", "FAILED"), what="the job ended")
    _back_to_queued(cfg, rec.job_id)
    d2 = NodeDaemon(cfg)
    await d2.start()
    try:
        got = d2.records[rec.job_id]
        assert (got.state, got.exit_code) == ("COMPLETED" if code == 0 else "FAILED", code)
        assert not d2.launcher.running(rec.job_id)
    finally:
        await close_daemon(d2)
    assert truth.read_text().splitlines() == ["run"]
    async with NodeDaemon(cfg) as d3:  # durable: in the journal, not only in memory
        assert (d3.records[rec.job_id].state, d3.records[rec.job_id].exit_code) == (got.state, code)


@pytest.mark.parametrize("pid_file", [True, False], ids=["supervisor.pid", "no-supervisor.pid"])
async def test_a_running_job_the_journal_lost_the_launch_of_is_adopted_not_run_again(dirs, tmp_path, pid_file):
    """Found by the storage chaos run (seed 3, short): meshd SIGKILLed while a job's launch was only in memory (a
    full disk) or lost with a WAL cut short; at restart its record said PENDING while its supervisor still ran
    (perhaps handing its result over), and meshd killed it as an orphan and launched the job again. Now the run
    is adopted: one run, which ends as it really did. And (seed 7, short) where the full disk had refused
    supervisor.pid as well, the run was found by its cgroup as a job the journal does not know, SIGKILLed while
    its supervisor handed its result over, and run again: the live supervisor is found in /proc and adopted."""
    cfg = make_config(*dirs)
    truth, go = tmp_path / "truth", tmp_path / "go"
    code = (f"import os, sys, time; open({str(truth)!r}, 'a').write('run\\n')\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\nsys.exit(5)")
    d1 = NodeDaemon(cfg)
    await d1.start()
    rec = d1.submit(SubmitRequest(command=py(code), cwd="/tmp", gpus=1, iterations=10), "tester")
    await wait_for(lambda: d1.records[rec.job_id].state == "RUNNING" and truth.exists(), what="running")
    sup = d1.records[rec.job_id].supervisor_pid
    await d1.close()  # meshd goes away (its jobs run on), then the journal forgets the launch
    _back_to_queued(cfg, rec.job_id)
    if not pid_file:
        (Path(rec.job_dir) / "supervisor.pid").unlink()
    d2 = NodeDaemon(cfg)
    await d2.start()
    try:
        assert d2.records[rec.job_id].state == "RUNNING" and d2.records[rec.job_id].supervisor_pid == sup
        go.write_text("")
        await wait_for(lambda: d2.records[rec.job_id].state == "FAILED", what="the adopted run ended")
        assert d2.records[rec.job_id].exit_code == 5
    finally:
        await close_daemon(d2)
        kill_sessions([sup])
    assert truth.read_text().splitlines() == ["run"]


@pytest.mark.parametrize("case", ["run-known", "preempted"])
async def test_a_result_of_a_run_meant_to_run_again_does_not_end_the_job(dirs, tmp_path, case):
    """The rule is exact: a result the record already knows of (a run since requeued: the record counts one more
    launch than the result's run) or of a preempted run does not end a queued job; it runs again."""
    cfg = make_config(*dirs)
    truth = tmp_path / "truth"
    async with NodeDaemon(cfg) as d1:
        rec = d1.submit(SubmitRequest(command=_counting(truth, 0), cwd="/tmp", gpus=1, iterations=10), "tester")
        await wait_for(lambda: d1.records[rec.job_id].state == "COMPLETED", what="the job ended")
    result = Path(rec.job_dir) / "result.json"
    if case == "preempted":
        result.write_text(json.dumps({"status": "preempted", "rank": None, "exit_code": 75, "reason": "", "restart": 0}))
    _back_to_queued(cfg, rec.job_id, restarts=1 if case == "run-known" else 0)
    d2 = NodeDaemon(cfg)
    await d2.start()
    try:
        await wait_for(lambda: d2.records[rec.job_id].state == "COMPLETED", what="the job ran again")
    finally:
        await close_daemon(d2)
    assert truth.read_text().splitlines() == ["run", "run"]


@pytest.fixture
def tiny_disk(tmp_path):
    with small_tmpfs(tmp_path / "disk", "256k") as path:
        yield path


def _fill(disk: Path) -> None:
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        chunk = b"x" * 65536
        while chunk:
            try:
                if os.write(fd, chunk) < len(chunk):
                    chunk = chunk[: len(chunk) // 2]
            except OSError:
                chunk = chunk[: len(chunk) // 2]
    finally:
        os.close(fd)


def test_a_result_reaches_result_json_on_a_disk_full_since_the_job_started(tiny_disk):
    """Found by the storage chaos run (seed 3): a job that ended on a full state disk could only tell meshd its
    result over the socket; meshd kept the end in memory, was SIGKILLed, and the restarted meshd found no
    result.json and ran the finished job again. The supervisor now takes the space of result.json when it starts
    (`reserve_result`) and the result is written into it however full the disk is by then."""
    reserve_result(tiny_disk)
    _fill(tiny_disk)
    with pytest.raises(OSError):  # the disk is full
        (tiny_disk / "probe").write_bytes(b"y" * 8192)
    result = {"status": "failed", "rank": 0, "exit_code": 3, "reason": "rank 0 failed (exit code 3)", "restart": 2}
    write_result(tiny_disk, result)
    assert json.loads((tiny_disk / "result.json").read_text()) == result
    assert read_outcome(tiny_disk) == Outcome("failed", "rank 0 failed (exit code 3)", 3, 2)


def _storage_chaos():
    """benchmarks/storage_chaos.py as a module (the benchmarks are scripts, not a package)."""
    import importlib.util
    import sys

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "storage_chaos.py"
    spec = importlib.util.spec_from_file_location("storage_chaos", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # (its dataclasses look their module up)
    spec.loader.exec_module(sys.modules[spec.name])
    return module


@pytest.mark.slow
def test_a_small_storage_chaos_run_meets_its_five_targets():
    """The storage chaos benchmark's core at a small size (a real meshd on an 8 MB tmpfs: disk fills, SIGKILLs,
    journals moved aside, emptied, cut short, corrupted): nothing lost, nothing run twice, no GPU held by two jobs,
    nothing left behind, every recorded end what the job really did."""
    res = _storage_chaos().run(6, 3, 2, seed=3, budget=120.0)
    if isinstance(res, str):
        pytest.skip(res)
    figures = (res.jobs_lost, res.ran_twice, res.double_held_gpu_seconds, res.left_behind, res.wrong_ends)
    assert figures == (0, 0, 0.0, 0, 0), res.problems
