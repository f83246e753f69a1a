"""A full disk loses no end and runs nothing twice (issue 24, point 1).

On a full state disk a finished job's result.json could not be written: meshd said FAILED ("the job's supervisor
exited without a result"), could not journal that either (two tracebacks in its log), and after a restart ran
the finished job again. Now the supervisor tells meshd over the job socket when the file is refused, meshd keeps
what it cannot journal in memory and retries it, and a full disk holds new launches (reason DiskFull) instead.
The first tests make the journal's SQLite connection fail as a full disk does, so they run anywhere; the last
one is the issue's scenario on a 2 MB tmpfs (skipped where mounting is not permitted).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
from pathlib import Path

import pytest
from meshsched.daemon.journal import JobRecord, Journal

from meshsched.wire.protocol import (
    ProtocolError,
    SubmitRequest,
    decode_body,
    encode_frame,
)
from tests.support.daemon import (
    kill_sessions,
    make_config,
    poll,
    py,
    remove,
    short_dir,
    small_tmpfs,
    start_meshd,
    wait_for,
)

REAL_CONNECT = sqlite3.connect
FULL = "database or disk is full"


class Flaky:
    """A SQLite connection whose writes fail as on a full disk while `full` is set."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real
        self.full = False

    def execute(self, sql: str, *args):
        if self.full and sql.split()[0].upper() in ("INSERT", "COMMIT"):
            raise sqlite3.OperationalError(FULL)
        return self.real.execute(sql, *args)

    def executescript(self, script: str):
        return self.real.executescript(script)

    @property
    def in_transaction(self) -> bool:
        return self.real.in_transaction

    def close(self) -> None:
        self.real.close()


@pytest.fixture
def flaky(monkeypatch) -> list[Flaky]:
    """Every journal opened from now on gets a Flaky connection (the list holds them, newest last)."""
    made: list[Flaky] = []

    def connect(*args, **kw):
        made.append(Flaky(REAL_CONNECT(*args, **kw)))
        return made[-1]

    monkeypatch.setattr(sqlite3, "connect", connect)
    return made


def on_disk(path: Path) -> dict[str, str]:
    """Job -> state as the journal file holds it (what a restarted meshd would read)."""
    db = REAL_CONNECT(f"file:{path}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT job_id, state FROM jobs"))
    finally:
        db.close()


def history_on_disk(path: Path, job_id: str) -> list[str]:
    db = REAL_CONNECT(f"file:{path}?mode=ro", uri=True)
    try:
        return [r[0] for r in db.execute("SELECT state FROM transitions WHERE job_id=? ORDER BY id", (job_id,))]
    finally:
        db.close()


def record(job_id: str, state: str = "PENDING") -> JobRecord:
    return JobRecord(job_id=job_id, seq=int(job_id), gpus=1, model="custom", batch_size=32, iterations=10,
                     submit_time=0.0, name="t", user="u", deadline=None, guaranteed=False, command=["true"],
                     cwd="/", env={}, job_dir="/nonexistent", state=state)


# ------------------------------------------------------------------ the journal's write side


def test_the_journal_keeps_an_event_it_cannot_commit_and_writes_it_once_it_can(tmp_path, flaky):
    path = tmp_path / "journal.sqlite"
    j = Journal(path)
    db = flaky[-1]
    rec = record("1", "RUNNING")
    with j.batch():
        j.put(rec)
        j.transition("1", 1.0, "RUNNING", "")
    db.full = True
    rec.state = "COMPLETED"
    with pytest.raises(sqlite3.OperationalError, match="disk is full"), j.batch():  # a plain batch: its caller hears it
        j.put(rec)
    assert not j.pending
    with j.batch(defer=True):  # an engine event: it happened, its writes wait
        j.put(rec)
        j.transition("1", 2.0, "COMPLETED", "")
    assert j.pending and FULL in j.failure
    assert [h[1] for h in j.history("1")] == ["RUNNING", "COMPLETED"]  # `mesh show` says what happened
    assert on_disk(path) == {"1": "RUNNING"}
    assert not j.retry()  # still full: still kept
    rec.state = "FAILED"  # a later write of the same job supersedes the kept one, never the other way round
    with j.batch(defer=True):
        j.put(rec)
        j.transition("1", 3.0, "FAILED", "")
    db.full = False
    assert j.retry() and not j.pending and j.failure == ""
    assert on_disk(path) == {"1": "FAILED"}
    assert history_on_disk(path, "1") == ["RUNNING", "COMPLETED", "FAILED"]  # each once, in order
    with j.batch():  # and a later commit writes nothing twice
        j.put(record("2"))
    assert history_on_disk(path, "1") == ["RUNNING", "COMPLETED", "FAILED"]
    j.close()


def test_a_plain_batch_commits_what_earlier_events_kept(tmp_path, flaky):
    path = tmp_path / "journal.sqlite"
    j = Journal(path)
    flaky[-1].full = True
    with j.batch(defer=True):
        j.put(record("1", "COMPLETED"))
    with pytest.raises(sqlite3.OperationalError), j.batch():  # a submit on a full disk fails; the kept end stays
        j.put(record("2"))
    assert j.pending
    flaky[-1].full = False
    with j.batch():
        j.put(record("2"))
    assert on_disk(path) == {"1": "COMPLETED", "2": "PENDING"} and not j.pending
    j.close()


# ------------------------------------------------------------------ meshd with a journal that cannot write


WAIT_FLAG = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.02)\nprint('done')\n"


async def test_meshd_keeps_ends_it_cannot_journal_and_holds_new_launches_until_space_returns(
        tmp_path, flaky, monkeypatch, caplog):
    from meshsched.daemon.node import NodeDaemon

    from tests.support.daemon import close_daemon

    monkeypatch.setattr("meshsched.daemon.diskwatch.RETRY_S", 0.05)
    caplog.set_level(logging.INFO, logger="meshd")
    runtime = short_dir()
    d = NodeDaemon(make_config(tmp_path / "state", runtime, gpus=1))
    await d.start()
    try:
        db, path = flaky[-1], d.config.journal_path
        flag = tmp_path / "flag"
        one = d.submit(SubmitRequest(command=py(WAIT_FLAG) + [str(flag)], cwd=str(tmp_path), iterations=10), "u")
        await wait_for(lambda: one.state == "RUNNING", what="job 1 running")
        two = d.submit(SubmitRequest(command=py("print('two')"), cwd=str(tmp_path), iterations=10), "u")
        assert two.state == "PENDING"
        db.full = True
        d.control.hold(two.job_id)  # an event whose writes the disk refuses: kept, one line, no traceback
        d.control.release(two.job_id)
        assert d.journal.pending
        flag.touch()
        await wait_for(lambda: one.state == "COMPLETED", what="job 1 completed")
        assert one.exit_code == 0
        # job 2 got the GPU, but a full disk starts nothing new: it waits, and says why
        await wait_for(lambda: two.state == "LOADING", what="job 2 placed")
        assert d.listings.job_view(two)["reason"].startswith("DiskFull (meshd's state disk is full: " + FULL)
        assert not d.launcher.running(two.job_id)
        assert on_disk(path)[one.job_id] == "RUNNING"  # not written yet, and nothing else was written instead
        db.full = False
        await wait_for(lambda: two.state == "COMPLETED", what="job 2 ran once space returned")
        await wait_for(lambda: not d.journal.pending, what="the journal written")
        assert on_disk(path) == {one.job_id: "COMPLETED", two.job_id: "COMPLETED"}
        assert history_on_disk(path, one.job_id).count("COMPLETED") == 1
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(said) == 2 and "is full" in said[0] and "has space again" in said[1], said
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    finally:
        await close_daemon(d)
        remove(runtime)


# ------------------------------------------------------------------ the result over the job socket


FORGE = """import os, sys, time
from meshsched.daemon.supervisor import tell_meshd
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
said = tell_meshd(os.environ["MESH_SOCKET"], os.environ["MESH_JOB_ID"], {"status": "failed", "reason": "forged"})
print("forged result taken:", bool(said))
"""


async def test_a_result_the_disk_refuses_reaches_meshd_over_the_job_socket(daemon, tmp_path):
    flag = tmp_path / "flag"
    rec = daemon.submit(SubmitRequest(command=py(FORGE) + [str(flag)], cwd=str(tmp_path), iterations=10), "u")
    await wait_for(lambda: rec.state == "RUNNING", what="running")
    (Path(rec.job_dir) / "result.json.tmp").mkdir()  # result.json cannot be written (as on a full disk)
    flag.touch()
    await wait_for(lambda: rec.state in ("COMPLETED", "FAILED"), what="the end")
    assert (rec.state, rec.exit_code, rec.reason) == ("COMPLETED", 0, "")
    written = json.loads((Path(rec.job_dir) / "result.json").read_text())  # by meshd, with what it was told
    assert (written["status"], written["exit_code"], written["restart"]) == ("completed", 0, 0)
    log = (Path(rec.job_dir) / "logs" / "rank0.log").read_text()
    assert "forged result taken: False" in log  # only the supervisor says how its job ended
    assert "cannot write result.json" in (Path(rec.job_dir) / "supervisor.log").read_text()


def test_a_result_frame_is_validated():
    def body(msg: dict) -> bytes:
        return encode_frame(msg)[4:]

    ok = decode_body(body({"type": "result", "status": "completed", "exit_code": 0, "rank": None, "reason": ""}))
    assert ok["status"] == "completed"
    for bad in ({"status": "won"}, {"status": "failed", "exit_code": "1"}, {"status": "failed", "reason": 3},
                {"status": "failed", "reason": "x" * 5000}, {"status": "failed", "rank": True}):
        with pytest.raises(ProtocolError, match="result"):
            decode_body(body({"type": "result", **bad}))


# ------------------------------------------------------------------ the scenario on a 2 MB tmpfs


JOB_ONE = """import os, sys, time
open(sys.argv[1], "a").write("run\\n")
while not os.path.exists(sys.argv[2]):
    time.sleep(0.02)
try:
    print("done")
except OSError:
    pass
"""
JOB_TWO = """import os, time
chunk = b"x" * 65536
while True:
    try:
        os.write(1, chunk)
    except OSError:
        if len(chunk) == 1:
            break
        chunk = chunk[: len(chunk) // 2]
time.sleep(300)
"""


@pytest.fixture
def tiny_state(tmp_path):
    with small_tmpfs(tmp_path / "state", "2m") as path:
        yield path


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@pytest.mark.slow
def test_a_full_disk_neither_fails_a_finished_job_nor_runs_it_again(tmp_path, tiny_state, capfd):
    runtime = short_dir()
    runs, flag = tmp_path / "runs", tmp_path / "flag"
    env = dict(os.environ, MESHD_SYSTEMD_SCOPE="no")
    proc, client = start_meshd(tiny_state, runtime, "--fake-gpus", "2", "--kill-grace", "1", env=env)
    pids: list[int] = []
    try:
        def submit(code: str, *args: str) -> str:
            body = {"command": py(code) + list(args), "cwd": str(tmp_path), "gpus": 1, "iterations": 10}
            return client.call("POST", "/v1/jobs", body)["job_id"]

        def show(job_id: str) -> dict:
            return client.call("GET", f"/v1/jobs/{job_id}")

        one = submit(JOB_ONE, str(runs), str(flag))
        poll(lambda: show(one)["state"] == "RUNNING" and runs.exists(), what="job 1 running")
        two = submit(JOB_TWO)
        poll(lambda: show(two)["state"] == "RUNNING", what="job 2 running")
        pids = [show(j)["supervisor_pid"] for j in (one, two)]
        poll(lambda: _free(tiny_state) == 0, what="job 2 filling the state disk")
        flag.touch()  # job 1 ends now, on a full disk
        poll(lambda: show(one)["state"] not in ("RUNNING", "LOADING"), timeout=30, what="job 1's end")
        view = show(one)
        assert (view["state"], view["exit_code"]) == ("COMPLETED", 0), view
        log = Path(show(two)["job_dir"]) / "logs" / "rank0.log"
        os.truncate(log, 0)  # space again
        poll(lambda: on_disk(tiny_state / "journal.sqlite").get(one) == "COMPLETED", timeout=30,
             what="job 1's end journaled once space returned")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        proc, client = start_meshd(tiny_state, runtime, "--fake-gpus", "2", "--kill-grace", "1", env=env)
        view = show(one)
        assert (view["state"], view["exit_code"]) == ("COMPLETED", 0), view
        assert show(two)["state"] == "RUNNING"  # re-adopted, untouched
        assert runs.read_text() == "run\n"  # job 1 ran once
        err = capfd.readouterr().err
        assert "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        kill_sessions(pids)
        remove(runtime)


# ------------------------------------------------------------------ a disk the WAL itself fills (storage chaos, seed 4)


class WalFull(Flaky):
    """A state disk whose last free bytes the journal's WAL took: a commit (which appends to the WAL) fails as on
    a full disk while the WAL file is at least `limit` bytes, and nothing else ever frees space."""

    def __init__(self, real: sqlite3.Connection) -> None:
        super().__init__(real)
        self.wal: Path | None = None
        self.limit = 0

    def execute(self, sql: str, *args):
        over = self.wal is not None and self.wal.exists() and self.wal.stat().st_size >= self.limit
        if over and sql.split()[0].upper() in ("INSERT", "COMMIT"):
            raise sqlite3.OperationalError(FULL)
        return self.real.execute(sql, *args)


def _fill_wal(j: Journal, n: int) -> None:
    rec = record("1", "RUNNING")
    for i in range(n):
        rec.reason, rec.env = f"write {i}", {"PAD": "x" * 2000}
        with j.batch():
            j.put(rec)
            j.transition("1", float(i), "RUNNING", rec.reason)


def test_the_wal_never_grows_to_fill_a_small_state_disk(tmp_path):
    """SQLite's default let the WAL hold 1000 pages (4 MB) of superseded pages, never cut back: on the chaos
    benchmark's 8 MB state disk it took the last free bytes for good."""
    path = tmp_path / "journal.sqlite"
    j = Journal(path)
    _fill_wal(j, 1500)
    assert Path(f"{path}-wal").stat().st_size <= 2 * 2**20
    j.close()


async def test_a_journal_whose_wal_filled_the_disk_writes_again_and_held_launches_go_ahead(
        tmp_path, monkeypatch, caplog):
    """storage_chaos --seed 4: the state disk was full of the WAL's own pages; freeing the filler gave nothing
    back, the retry failed every 2 s for ever and a held launch never started. A retry now checkpoints the WAL
    into the journal and truncates it, then writes what was kept."""
    import asyncio

    from meshsched.daemon.diskwatch import DiskWatch

    from meshsched.actions import Launch
    from meshsched.state import ExecConfig

    made: list[WalFull] = []

    def connect(*args, **kw):
        made.append(WalFull(REAL_CONNECT(*args, **kw)))
        return made[-1]

    monkeypatch.setattr(sqlite3, "connect", connect)
    monkeypatch.setattr("meshsched.daemon.diskwatch.RETRY_S", 0.02)
    caplog.set_level(logging.INFO, logger="meshd")
    path = tmp_path / "journal.sqlite"
    j = Journal(path)
    db = made[-1]
    _fill_wal(j, 40)
    db.wal = Path(f"{path}-wal")
    db.limit = db.wal.stat().st_size  # the disk is full now: no commit can append to the WAL
    disk = DiskWatch(j)
    resumed: list[list[Launch]] = []
    disk.resume = resumed.append
    with j.batch(defer=True):  # an engine event (a job's end) the disk refuses
        j.put(record("2", "COMPLETED"))
    disk.check()
    assert j.pending and disk.blocked()
    held = Launch("3", (0,), 0.0, 0, ExecConfig(micro_batch=32))
    disk.park(held)
    deadline = asyncio.get_running_loop().time() + 30
    while disk.blocked() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    assert not disk.blocked() and not j.pending, "the retry never wrote what the journal kept"
    assert resumed == [[held]]
    assert on_disk(path) == {"1": "RUNNING", "2": "COMPLETED"}
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(said) == 2 and "is full" in said[0] and "has space again" in said[1], said
    disk.close()
    j.close()


# ------------------------------------------------------------------ an end only in meshd's memory (storage chaos, seed 3)


JOB_ONCE = """import os, sys, time
open(sys.argv[1], "a").write("run\\n")
while not os.path.exists(sys.argv[2]):
    time.sleep(0.02)
"""


@pytest.mark.parametrize("meshd_can_write", [True, False], ids=["meshd-writes-it", "disk-refuses-meshd-too"])
async def test_an_end_only_in_meshds_memory_never_runs_the_job_twice(dirs, tmp_path, flaky, meshd_can_write):
    """storage_chaos --jobs 10 --kills 4 --fills 3 --seed 3: a supervisor could not write result.json (the disk full
    since before the job started), told meshd its result over the job socket, got `ok` and exited; meshd could not
    journal the end either and was SIGKILLed before space returned; restarted, it found the record RUNNING, no
    result.json and no supervisor, and ran the finished job again. Now meshd acknowledges the end only once it is
    durable: it writes result.json itself, or, while its disk refuses that too, answers `durable: false` and the
    supervisor stays; the restarted meshd adopts that live supervisor, is told again, and the job ends once."""
    from meshsched.daemon.node import NodeDaemon

    from tests.support.daemon import close_daemon

    cfg = make_config(*dirs, gpus=1)
    truth, flag = tmp_path / "truth", tmp_path / "flag"
    d1 = NodeDaemon(cfg)
    await d1.start()
    rec = d1.submit(SubmitRequest(command=py(JOB_ONCE) + [str(truth), str(flag)], cwd=str(tmp_path), iterations=10),
                    "u")
    job_id, job_dir = rec.job_id, Path(rec.job_dir)
    sup = 0
    try:
        await wait_for(lambda: rec.state == "RUNNING" and truth.exists(), what="the job running")
        sup = rec.supervisor_pid
        (job_dir / "result.json.tmp").unlink()  # no reserved slot: the supervisor's result.json is refused
        (job_dir / "result.json.tmp").mkdir()
        if not meshd_can_write:  # and so is meshd's
            (job_dir / "result.json.meshd").mkdir()
            (job_dir / "result.json.meshd" / "x").touch()
        flaky[-1].full = True  # nor can meshd journal the end
        flag.touch()
        log = job_dir / "supervisor.log"
        await wait_for(lambda: rec.state == "COMPLETED" or "meshd holds the result" in log.read_text(),
                       what="the end told to meshd")
        assert on_disk(cfg.journal_path)[job_id] == "RUNNING"  # the end is not in the journal
    finally:
        await d1.close()  # as a SIGKILL leaves it: what the journal kept in memory is lost (the disk is still full)
    if not meshd_can_write:
        remove(job_dir / "result.json.meshd")  # space again (the supervisor's own write still fails)
    d2 = NodeDaemon(cfg)
    await d2.start()
    try:
        got = d2.records[job_id]
        await wait_for(lambda: got.state not in ("RUNNING", "LOADING", "PENDING"), what="the job's end")
        assert (got.state, got.exit_code) == ("COMPLETED", 0)
    finally:
        await close_daemon(d2)
        kill_sessions([sup])
    assert truth.read_text().splitlines() == ["run"]  # it ran once
    assert history_on_disk(cfg.journal_path, job_id).count("COMPLETED") == 1


class HeldThenDurable:
    """A job socket that answers a result frame `durable: false` `held` times, then `durable: true`."""

    def __init__(self, path: Path, held: int) -> None:
        import socket
        import threading

        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.held, self.told = held, 0
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        from meshsched.wire.protocol import FrameDecoder

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                decoder = FrameDecoder()
                while not (msgs := decoder.feed(conn.recv(1 << 16))):
                    pass
                assert msgs[0]["type"] == "result" and msgs[0]["restart"] == 3
                self.told += 1
                conn.sendall(encode_frame({"type": "ok", "seq": None, "durable": self.told > self.held}))

    def close(self) -> None:
        self.sock.close()


def _spec(tmp_path: Path, sock: Path):
    from meshsched.daemon.supervisor import LaunchSpec

    return LaunchSpec(job_id="1", command=["true"], cwd="/", env={}, local_gpus=[0], master_port=1, restart=3,
                      socket=str(sock), checkpoint_dir=str(tmp_path), grace=1.0)


def test_a_supervisor_waits_while_meshd_holds_its_end_without_making_it_durable(tmp_path, monkeypatch):
    """A result meshd holds only in memory is not handed over: the supervisor offers it again, without a patience
    limit while meshd answers, until meshd says it is durable."""
    from meshsched.daemon import supervisor

    monkeypatch.setattr(supervisor, "RESULT_RETRY", 0.01)
    job_dir, sock = tmp_path / "job", short_dir() / "job.sock"
    job_dir.mkdir()
    (job_dir / "result.json.tmp").mkdir()  # result.json is refused
    server = HeldThenDurable(sock, held=5)
    try:
        result = {"status": "completed", "rank": None, "exit_code": 0, "reason": ""}
        assert supervisor.hand_over(job_dir, _spec(tmp_path, sock), result, patience=0.0)
        assert server.told == 6
        server.told, server.held = 0, 10**6  # held for ever: a SIGTERM (meshd stopping the job) ends the wait
        assert not supervisor.hand_over(job_dir, _spec(tmp_path, sock), result, patience=0.0,
                                        stopped=lambda: server.told >= 3)
    finally:
        server.close()
        remove(sock.parent)
