"""Recovery finds what the journal forgot (issue 24, points 2 and 3).

meshd's advice for an unusable journal is to move it aside. With a job running that used to double-book GPUs
(the old supervisor ran on while a new job got its GPU) and give out again the id of a job that had no
directory yet; a corrupt page of the journal was a traceback instead of the one line other journal errors get.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from meshsched.daemon.launcher import proc_start_time
from tests.support.daemon import PY, kill_sessions, poll, py, remove, short_dir, start_meshd

OLD_JOB = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(300)\n"
# The new job looks, once it runs, whether any process of the old job (its supervisor or its rank) still runs.
NEW_JOB = """import sys
def alive(pid, start):
    try:
        data = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    rest = data[data.rfind(")") + 2:].split()
    return rest[0] != "Z" and (start is None or rest[19] == start)
sup, start, rank = sys.argv[2].split(",")
both = alive(int(sup), start) or alive(int(rank), None)
open(sys.argv[1], "w").write("both" if both else "alone")
"""


def _submit(client, code: str, args: list[str], cwd: Path, gpus: int, **extra) -> str:
    body = {"command": py(code) + args, "cwd": str(cwd), "gpus": gpus, "iterations": 10, **extra}
    return client.call("POST", "/v1/jobs", body)["job_id"]


def _jobs(client) -> dict[str, dict]:
    return {j["job_id"]: j for j in client.call("GET", "/v1/jobs?all=1")}


def _forget_the_journal(state: Path, how: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        path = state / f"journal.sqlite{suffix}"
        if not path.exists():
            continue
        if how == "moved aside":
            path.rename(path.with_name(path.name + ".aside"))
        else:  # a 0-byte journal (and WAL)
            os.truncate(path, 0)


@pytest.mark.parametrize("how", ["moved aside", "0 bytes"])
def test_a_forgotten_job_never_shares_its_gpus_and_its_id_is_not_given_again(tmp_path, how):
    state, runtime = tmp_path / "state", short_dir()
    proc, client = start_meshd(state, runtime, "--fake-gpus", "2", "--kill-grace", "1")
    procs, pids = [proc], []
    try:
        rank_file, seen = tmp_path / "old.pid", tmp_path / "seen"
        old = _submit(client, OLD_JOB, [str(rank_file)], tmp_path, 1)
        held = _submit(client, "pass", [], tmp_path, 1, hold=True)  # queued, no job directory yet
        poll(lambda: _jobs(client)[old]["state"] == "RUNNING" and rank_file.exists() and rank_file.read_text(),
             what="the old job running")
        sup = _jobs(client)[old]["supervisor_pid"]
        pids.append(sup)
        start = proc_start_time(sup)
        assert start and (state / "jobs" / old / "supervisor.pid").read_text().split() == [str(sup), start]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        _forget_the_journal(state, how)

        proc, client = start_meshd(state, runtime, "--fake-gpus", "2", "--kill-grace", "1")
        procs.append(proc)
        new = _submit(client, NEW_JOB, [str(seen), f"{sup},{start},{rank_file.read_text()}"], tmp_path, 2)
        assert new not in (old, held)  # before: the held job's id was given again (it had no directory)
        poll(lambda: seen.exists() and seen.read_text(), what="the new job running")
        assert seen.read_text() == "alone"  # before: "both", the old job still ran on GPU 0
        assert proc_start_time(sup) != start
        poll(lambda: _jobs(client)[new]["state"] == "COMPLETED", what="the new job done")
        later = _submit(client, "pass", [], tmp_path, 1)
        assert int(later) > int(new)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
        kill_sessions(pids)
        remove(runtime)


def _corrupt_meta_page(path: Path) -> None:
    """A journal whose jobs table reads fine but whose meta table's page (the id counter, the policy's memory) is
    overwritten with garbage."""
    from meshsched.daemon.journal import Journal

    j = Journal(path)
    for _ in range(3):
        j.next_seq()
    j.put_memory("{}")
    j.close()
    db = sqlite3.connect(str(path))
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name='meta'").fetchone()[0]
    db.close()
    with open(path, "r+b") as fh:
        fh.seek((root - 1) * page_size)
        fh.write(b"\xa5garbage" * (page_size // 8))


async def test_a_corrupt_journal_page_is_one_line_not_a_traceback(tmp_path):
    from meshsched.daemon.journal import JournalError
    from meshsched.daemon.node import NodeDaemon
    from tests.support.daemon import make_config

    state, runtime = tmp_path / "state", short_dir()
    try:
        state.mkdir()
        _corrupt_meta_page(state / "journal.sqlite")
        with pytest.raises(JournalError, match="move it aside"):  # before: sqlite3.DatabaseError from load_memory
            await NodeDaemon(make_config(state, runtime, gpus=1)).start()
        r = subprocess.run([PY, "-m", "meshsched.daemon.main", "--state-dir", str(state), "--runtime-dir",
                            str(runtime), "--fake-gpus", "1"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        errors = [line for line in r.stderr.splitlines() if line.startswith("meshd: error: journal")]
        assert len(errors) == 1 and "malformed" in errors[0], r.stderr
    finally:
        remove(runtime)


def _sleeper(env: dict) -> subprocess.Popen:
    p = subprocess.Popen(["sleep", "60"], env={**os.environ, **env})
    poll(lambda: b"sleep" in Path(f"/proc/{p.pid}/cmdline").read_bytes(), what="sleep started")
    return p


def test_a_reused_pid_or_another_meshds_job_is_never_taken_for_a_forgotten_one(tmp_path):
    from meshsched.daemon.forgotten import find_forgotten, stop_forgotten

    jobs, sock = tmp_path / "jobs", tmp_path / "job.sock"
    (jobs / "7").mkdir(parents=True)
    other = _sleeper({"MESH_JOB_ID": "7", "MESH_SOCKET": "/elsewhere/job.sock"})  # another meshd's job 7
    ours = None
    try:
        # its pid and true start time in our job 7's supervisor.pid (a reused pid): not a supervisor, not taken
        (jobs / "7" / "supervisor.pid").write_text(f"{other.pid} {proc_start_time(other.pid)}\n")
        assert find_forgotten(jobs, sock, None, lambda job_id: False) == []
        ours = _sleeper({"MESH_JOB_ID": "7", "MESH_SOCKET": str(sock)})  # a rank of this meshd's job 7
        assert find_forgotten(jobs, sock, None, lambda job_id: job_id == "7") == []  # a job the journal knows
        found = find_forgotten(jobs, sock, None, lambda job_id: False)
        assert [f.job_id for f in found] == ["7"] and found[0].processes() == {ours.pid}
        assert stop_forgotten(found, jobs, grace=1.0) == []
        assert ours.wait(timeout=10) == -signal.SIGKILL  # its supervisor gone: killed at once, as meshd drains a job
        assert other.poll() is None
    finally:
        for p in (other, ours):
            if p is not None:
                p.kill()
                p.wait()


def test_the_id_mark_outlives_the_journal(tmp_path):
    from meshsched.daemon.idmark import IdMark

    (tmp_path / "jobs" / "4").mkdir(parents=True)
    mark = IdMark(tmp_path / "last-job-id", tmp_path / "jobs")
    assert mark.floor() == 5
    mark.given(9)
    mark.close()
    assert IdMark(tmp_path / "last-job-id", tmp_path / "jobs").floor() == 10
    (tmp_path / "last-job-id").write_text("garbage")
    assert IdMark(tmp_path / "last-job-id", tmp_path / "jobs").floor() == 5  # the job directories still hold
