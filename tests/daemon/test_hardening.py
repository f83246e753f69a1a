"""meshd under faults and hostile input (issue 10, and the cancel race of issue 15): one test per fix."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
from meshsched.daemon.config import ConfigError, load_config
from meshsched.daemon.launcher import proc_start_time
from meshsched.daemon.node import NodeDaemon
from meshsched.daemon.supervisor import LaunchSpec

from meshsched.wire.protocol import (
    HEADER,
    REPLY_TYPES,
    FrameDecoder,
    RequestError,
    SubmitRequest,
)
from tests.support.daemon import (
    PY,
    kill_sessions,
    make_config,
    py,
    remove,
    short_dir,
    wait_for,
)


def submit(d: NodeDaemon, command: list[str], gpus: int = 1, **kw):
    return d.submit(SubmitRequest(command=command, cwd="/tmp", gpus=gpus, **kw), "tester")


def alive(pid: int) -> bool:
    return proc_start_time(pid) is not None


def pids_in(folder: Path) -> list[int]:
    return [int(x) for f in folder.iterdir() for x in f.read_text().split()]


# A rank that starts a background child, writes "<its pid> <child pid>" to ARGV[1]/<rank>, and trains.
WITH_CHILD = (
    "import os, subprocess, sys, time\n"
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "tmp = os.path.join(sys.argv[1], os.environ['RANK'] + '.tmp')\n"
    "open(tmp, 'w').write(f'{os.getpid()} {c.pid}')\n"
    "os.rename(tmp, os.path.join(sys.argv[1], os.environ['RANK']))\n"
    "time.sleep(60)\n"
)


# ------------------------------------------------------------------ 1, 2: a job's processes are one unit


async def test_dead_supervisor_takes_its_ranks_and_their_children(daemon, tmp_path):
    out = tmp_path / "pids"
    out.mkdir()
    rec = submit(daemon, py(WITH_CHILD) + [str(out)], gpus=2)
    await wait_for(lambda: len(list(out.glob("[0-9]"))) == 2, what="ranks started")
    pids = pids_in(out)
    os.kill(daemon.records[rec.job_id].supervisor_pid, signal.SIGKILL)
    seen: list[bool] = []

    def failed() -> bool:
        if daemon.records[rec.job_id].state != "FAILED":
            return False
        seen.extend(alive(p) for p in pids)  # the GPUs came back: nothing of the job may run now
        return True

    try:
        await wait_for(failed, what="job failed")
        assert not any(seen), "GPUs were freed while the dead supervisor's ranks or their children ran"
        assert daemon.engine.state.free_gpus == 4
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


DAEMONISING = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "r, w = os.pipe()\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        os.write(w, str(os.getpid()).encode()); time.sleep(60); os._exit(0)\n"
    "    os._exit(0)\n"
    "os.wait()\n"
    "g = int(os.read(r, 32))\n"
    "open(sys.argv[1] + '.tmp', 'w').write(f'{os.getpid()} {g}')\n"
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "time.sleep(60)\n"
)


async def test_cancel_holds_the_gpus_until_every_process_is_gone(daemon, tmp_path):
    """A script that ignores SIGTERM and a daemonised (setsid, double-forked) grandchild: cancel frees the GPUs
    only when both are dead, and the grandchild does not survive."""
    marker = tmp_path / "pids"
    rec = submit(daemon, py(DAEMONISING) + [str(marker)], gpus=2)
    await wait_for(marker.exists, what="job started its grandchild")
    pids = [int(x) for x in marker.read_text().split()]
    nxt = submit(daemon, py("pass"), gpus=4)
    daemon.cancel(rec.job_id)
    assert daemon.listings.job_view(daemon.records[rec.job_id])["state"] == "COMPLETING"
    assert daemon.engine.state.free_gpus == 2 and daemon.records[nxt.job_id].state == "PENDING"
    seen: list[bool] = []

    def cancelled() -> bool:
        if daemon.records[rec.job_id].state != "CANCELLED":
            return False
        seen.extend(alive(p) for p in pids)
        return True

    try:
        await wait_for(cancelled, what="cancelled")
        assert not any(seen), "the job was CANCELLED (GPUs freed) while its processes still ran"
        await wait_for(lambda: daemon.records[nxt.job_id].state == "COMPLETED", what="next job ran")
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)


def test_supervisor_passes_on_a_sigterm_that_arrives_while_spawning(tmp_path):
    """Issue 15's cancel race: SIGTERM reaching the supervisor while it spawns its ranks was not passed on."""
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    spec = LaunchSpec(job_id="7", command=py("import time; time.sleep(30)"), cwd="/tmp", env=dict(os.environ),
                      local_gpus=[0, 1, 2], master_port=1, restart=0, socket="/nonexistent", grace=30.0,
                      checkpoint_dir=str(job_dir / "ck"))
    (job_dir / "launch.json").write_text(json.dumps(_asdict(spec)))
    driver = (  # SIGTERM arrives inside the spawn of rank 0, before the supervisor has recorded it
        "import os, signal, subprocess, sys\nfrom pathlib import Path\n"
        "from meshsched.daemon import supervisor as s\n"
        "class P(subprocess.Popen):\n"
        "    def __init__(self, *a, **k):\n"
        "        super().__init__(*a, **k)\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "s.subprocess.Popen = P\n"
        "sys.exit(s.Supervisor(Path(sys.argv[1])).run())\n"
    )
    proc = subprocess.Popen([PY, "-c", driver, str(job_dir)], start_new_session=True)
    try:
        assert proc.wait(timeout=8) == 143  # before the fix no rank got SIGTERM: SIGKILL only after the 30 s grace
        assert json.loads((job_dir / "result.json").read_text())["status"] == "terminated"
        assert not (job_dir / "logs" / "rank1.log").exists()  # no rank spawned after the SIGTERM
        assert not alive(proc.pid)
    finally:
        kill_sessions([proc.pid])


def _asdict(spec: LaunchSpec) -> dict:
    from dataclasses import asdict

    return asdict(spec)


async def test_recovery_kills_what_a_dead_supervisor_left_before_requeueing(dirs, tmp_path):
    cfg = make_config(*dirs)
    out = tmp_path / "pids"
    out.mkdir()
    d1 = NodeDaemon(cfg)
    await d1.start()
    rec = submit(d1, py(WITH_CHILD) + [str(out)], gpus=1)
    await wait_for(lambda: (out / "0").exists(), what="rank started")
    rank, child = pids_in(out)
    sup = d1.records[rec.job_id].supervisor_pid
    await d1.close()
    os.kill(sup, signal.SIGKILL)  # the supervisor dies while meshd is down
    await wait_for(lambda: not alive(sup), what="the supervisor dead")  # SIGKILL is not instant under load
    (out / "0").unlink()
    d2 = NodeDaemon(cfg)
    await d2.start()
    try:
        assert not alive(rank) and not alive(child), "the old copy of the job still runs beside the requeued one"
        assert d2.records[rec.job_id].restarts == 2  # requeued and started again
    finally:
        pids = [r.supervisor_pid for r in d2.records.values()]
        await d2.close()
        kill_sessions(pids + [sup])
        for p in (rank, child):
            if alive(p):
                os.kill(p, signal.SIGKILL)


async def test_recovery_adopts_every_live_job_before_it_schedules(dirs):
    """Found by benchmarks/chaos.py: recovery dispatched a dead job's outcome (which runs a scheduling pass)
    before later live jobs were re-adopted, so a queued job was started on GPUs a live job still held."""
    cfg = make_config(*dirs)
    d1 = NodeDaemon(cfg)
    await d1.start()
    blocker = submit(d1, py("import time; time.sleep(0.5)"), gpus=4, iterations=1)
    wide = submit(d1, py("import time; time.sleep(60)"), gpus=4, iterations=1000)  # queued behind shorter ones
    done = submit(d1, py("import time; time.sleep(1.5)"), gpus=2, iterations=10)  # ends while meshd is down
    live = submit(d1, py("import time; time.sleep(60)"), gpus=2, iterations=20)
    await wait_for(lambda: all(d1.records[j.job_id].state == "RUNNING" for j in (done, live)), what="started")
    assert blocker.job_id and d1.records[wide.job_id].state == "PENDING"
    pids = [r.supervisor_pid for r in d1.records.values()]
    sup = d1.records[done.job_id].supervisor_pid
    await d1.close()
    await wait_for(lambda: (Path(done.job_dir) / "result.json").exists() and not alive(sup),
                   what="job ended while meshd was down")
    d2 = NodeDaemon(cfg)
    await d2.start()
    try:
        assert d2.records[done.job_id].state == "COMPLETED" and d2.records[live.job_id].state == "RUNNING"
        assert d2.records[wide.job_id].state == "PENDING", "started on GPUs the live job holds"
        assert all(len(g.jobs) <= 1 for g in d2.engine.state.gpus)
    finally:
        pids += [r.supervisor_pid for r in d2.records.values()]
        await d2.close()
        kill_sessions(pids)


# ------------------------------------------------------------------ 3: a lost journal reuses nothing


async def test_a_lost_journal_never_reuses_ids_or_job_dirs(dirs):
    cfg = make_config(*dirs)
    async with NodeDaemon(cfg) as d1:
        rec = submit(d1, py("import os; os.makedirs(os.environ['MESH_CHECKPOINT_DIR'] + '/step50')"), gpus=1)
        await wait_for(lambda: d1.records[rec.job_id].state == "COMPLETED")
    for suffix in ("", "-wal", "-shm"):
        Path(str(cfg.journal_path) + suffix).unlink(missing_ok=True)
    async with NodeDaemon(cfg) as d2:
        new = submit(d2, py("import os; print(sorted(os.listdir(os.environ['MESH_CHECKPOINT_DIR'])))"), gpus=1)
        assert new.job_id != rec.job_id and new.job_dir != rec.job_dir
        await wait_for(lambda: d2.records[new.job_id].state == "COMPLETED")
        assert (Path(new.job_dir) / "logs" / "rank0.log").read_text().strip() == "[]"


# ------------------------------------------------------------------ 4: secrets and private files


async def test_the_token_never_reaches_a_job_and_job_files_are_private(dirs, monkeypatch):
    monkeypatch.setenv("MESHD_TOKEN", "tok-s3cret-123")
    async with NodeDaemon(make_config(*dirs)) as d:
        rec = submit(d, py("import os; print(sorted(os.environ.items()))"), gpus=1)
        await wait_for(lambda: d.records[rec.job_id].state == "COMPLETED")
        job_dir = Path(rec.job_dir)
        for path in [job_dir, *job_dir.rglob("*")]:
            assert b"tok-s3cret-123" not in (b"" if path.is_dir() else path.read_bytes()), path
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & 0o077 == 0, f"{path} is mode {mode:o}"
        for path in (d.config.state_dir, d.config.jobs_dir, d.config.runtime_dir):
            assert stat.S_IMODE(path.stat().st_mode) == 0o700


def test_token_on_the_command_line_is_refused_and_token_file_is_read(tmp_path, capsys):
    from meshsched.daemon.main import main

    with pytest.raises(SystemExit) as exc:
        main(["--token", "abc", "--fake-gpus", "1"])
    assert "--token-file" in str(exc.value) and "ps" in str(exc.value)
    token = tmp_path / "token"
    token.write_text("abc123\n")
    token.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        load_config(env={}, overrides={"token_file": str(token), "state_dir": str(tmp_path)})
    token.chmod(0o600)
    cfg = load_config(env={}, overrides={"token_file": str(token), "state_dir": str(tmp_path)})
    assert cfg.token == "abc123"


# ------------------------------------------------------------------ 5: the runtime dir


async def test_runtime_dir_is_checked_and_locked(tmp_path):
    runtime = short_dir()
    try:
        async with NodeDaemon(make_config(tmp_path / "a", runtime)):
            with pytest.raises(RuntimeError, match="another meshd already serves"):
                await NodeDaemon(make_config(tmp_path / "b", runtime)).start()  # other state dir, same runtime
        runtime.chmod(0o777)
        with pytest.raises(RuntimeError, match="writable by group or others"):
            await NodeDaemon(make_config(tmp_path / "c", runtime)).start()
        runtime.chmod(0o700)
        if os.geteuid() == 0:  # a dir pre-created by another user
            os.chown(runtime, 65534, 65534)
            with pytest.raises(RuntimeError, match="owned by uid 65534"):
                await NodeDaemon(make_config(tmp_path / "d", runtime)).start()
    finally:
        remove(runtime)


# ------------------------------------------------------------------ 6: a script that exits 75 by itself


async def test_self_preempting_script_backs_off_then_fails(dirs):
    d = NodeDaemon(make_config(*dirs, self_preempt_limit=2, self_preempt_backoff=0.2))
    async with d:
        rec = submit(d, py("import sys; sys.exit(75)"), gpus=1)
        await wait_for(lambda: d.records[rec.job_id].state == "FAILED", timeout=20, what="gave up")
        assert "75" in d.records[rec.job_id].reason and "no preemption" in d.records[rec.job_id].reason
        starts = [t for t, s, _ in d.journal.history(rec.job_id) if s == "LOADING"]
        assert len(starts) == 3  # the first run and two requeues
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        assert gaps[0] >= 0.2 and gaps[1] >= 0.4  # backoff doubles


# ------------------------------------------------------------------ 7: the job socket


async def test_job_socket_refuses_an_outsider_before_it_sends_anything(daemon):
    r, w = await asyncio.open_unix_connection(str(daemon.config.job_socket))
    data = await asyncio.wait_for(r.read(), 5)  # nothing sent: refused at accept, connection closed
    assert FrameDecoder(REPLY_TYPES).feed(data)[0]["error"].endswith("belongs to no running job")
    w.close()


async def test_job_socket_times_out_half_frames_and_bounds_connections(daemon, monkeypatch):
    from meshsched.daemon import jobsock

    monkeypatch.setattr(jobsock, "FRAME_TIMEOUT", 0.3)
    monkeypatch.setattr(jobsock, "MAX_PER_JOB", 2)
    code = (
        "import os, socket, time\n"
        "def conn():\n"
        "    s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(os.environ['MESH_SOCKET']); return s\n"
        "a, b = conn(), conn()\n"
        "time.sleep(0.3)\n"
        "c = conn()\n"
        "print('third:', c.recv(4096)[-45:], flush=True)\n"
        f"a.sendall({HEADER.pack(10)!r}[:2])\n"
        "t = time.monotonic()\n"
        "print('half frame closed:', a.recv(4096) == b'', round(time.monotonic() - t, 1), flush=True)\n"
    )
    rec = submit(daemon, py(code), gpus=1)
    await wait_for(lambda: daemon.records[rec.job_id].state == "COMPLETED", what="probe done")
    log = (Path(rec.job_dir) / "logs" / "rank0.log").read_text()
    assert "open connections for job" in log
    closed = next(line for line in log.splitlines() if line.startswith("half frame closed"))
    assert closed.split()[3] == "True" and float(closed.split()[4]) < 3


# ------------------------------------------------------------------ 8: logs


async def _get(d: NodeDaemon, path: str, method: str = "GET", **kw):
    conn = aiohttp.UnixConnector(path=str(d.config.api_socket))
    async with aiohttp.ClientSession(connector=conn) as s:
        async with s.request(method, f"http://meshd{path}", **kw) as r:
            return r.status, dict(r.headers), await r.read()


async def test_log_offsets_are_validated(daemon):
    rec = submit(daemon, py("print('hello')"), gpus=1)
    await wait_for(lambda: daemon.records[rec.job_id].state == "COMPLETED")
    for bad in ("1e23", "-1", "nan", "0x10", "1.5", "%E2%91%A0"):
        status, _, body = await _get(daemon, f"/v1/jobs/{rec.job_id}/logs?offset={bad}")
        assert status == 400 and "offset" in json.loads(body)["error"], bad
    status, headers, body = await _get(daemon, f"/v1/jobs/{rec.job_id}/logs?offset={10**30}")
    assert status == 200 and headers["X-Log-Restarted"] == "1" and body == b"hello\n"


def test_a_log_past_its_cap_is_rotated(tmp_path):
    from meshsched.daemon.supervisor import rotate_log

    log = tmp_path / "rank0.log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(fd, b"x" * 900 + b"y" * 200)
    assert rotate_log(log, 1000)
    os.write(fd, b"after\n")  # the writer's O_APPEND fd goes on at the new end
    os.close(fd)
    assert (tmp_path / "rank0.log.1").read_bytes() == b"x" * 300 + b"y" * 200
    text = log.read_text()
    assert text.startswith("[meshd: log rotated") and text.endswith("after\n") and log.stat().st_size < 200
    assert not rotate_log(log, 1000)


async def test_job_log_is_capped_while_it_runs(dirs):
    async with NodeDaemon(make_config(*dirs, log_max_mb=0.05)) as d:  # 52 KB
        code = "import sys, time\nfor i in range(300):\n    print('z' * 10000, flush=True); time.sleep(0.003)\n"
        rec = submit(d, py(code), gpus=1)
        await wait_for(lambda: d.records[rec.job_id].state == "COMPLETED", timeout=30)
        logs = Path(rec.job_dir) / "logs"
        assert (logs / "rank0.log").stat().st_size < 0.05 * 2**20 + 1_000_000  # one poll's worth of slack at most
        assert (logs / "rank0.log.1").stat().st_size <= 0.025 * 2**20 + 1
        status, headers, _ = await _get(d, f"/v1/jobs/{rec.job_id}/logs")
        assert status == 200 and headers["X-Log-Rotated"] == "1"


def test_mesh_logs_prints_all_of_a_big_log_and_says_when_it_was_rotated(served, tmp_path):
    from meshsched.cli.main import app as typer_app
    from typer.testing import CliRunner

    script = tmp_path / "big.py"
    script.write_text("for i in range(150):\n    print(str(i).rjust(9999, '.'))\n")  # 1.5 MB
    r = CliRunner().invoke(typer_app, ["submit", str(script), "--json"])
    rec = served.records[json.loads(r.stdout)["job_id"]]
    for _ in range(300):
        if rec.state == "COMPLETED":
            break
        time.sleep(0.05)
    r = CliRunner().invoke(typer_app, ["logs", rec.job_id])
    assert r.exit_code == 0 and len(r.stdout) == 150 * 10000 and r.stdout.rstrip().endswith("149")
    assert "rotated" not in r.stderr
    (Path(rec.job_dir) / "logs" / "rank0.log.1").write_text("older\n")
    r = CliRunner().invoke(typer_app, ["logs", rec.job_id])
    assert "the log was rotated" in r.stderr and len(r.stdout) == 150 * 10000


# ------------------------------------------------------------------ 9: one clear line, never a 500


async def test_full_disk_is_one_clear_line_not_a_500(daemon, monkeypatch):
    def full(*_a, **_k):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(daemon.journal, "put", full)
    body = {"command": ["true"], "cwd": "/", "gpus": 1}
    status, _, data = await _get(daemon, "/v1/jobs", "POST", json=body)
    assert status == 507 and "disk is full" in json.loads(data)["error"]
    assert daemon.records == {}  # no phantom job
    monkeypatch.undo()
    status, _, _ = await _get(daemon, "/v1/jobs", "POST", json=body)
    assert status == 201


async def test_corrupt_journal_is_one_clear_line(dirs):
    from meshsched.daemon.journal import JournalError

    state, runtime = dirs
    state.mkdir(parents=True)
    (state / "journal.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(JournalError, match="move it aside"):
        await NodeDaemon(make_config(state, runtime)).start()
    r = subprocess.run([PY, "-m", "meshsched.daemon.main", "--state-dir", str(state), "--runtime-dir", str(runtime),
                        "--fake-gpus", "1"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("meshd: error: journal")]


def test_permission_denied_on_the_api_socket_is_one_line(tmp_path, monkeypatch):
    from meshsched.cli.main import app as typer_app
    from typer.testing import CliRunner

    path = tmp_path / "api.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    monkeypatch.setenv("MESH_API_SOCKET", str(path))

    import meshsched.cli.client as client_mod

    real = client_mod.socket.socket

    class Denied:  # the client speaks HTTP on the C-level socket module: patch what it calls
        def __init__(self, *a):
            self._s = real(*a)

        def settimeout(self, t):
            self._s.settimeout(t)

        def connect(self, addr):
            raise PermissionError(13, "Permission denied")

        def close(self):
            self._s.close()

    monkeypatch.setattr(client_mod.socket, "socket", Denied)
    r = CliRunner().invoke(typer_app, ["ls"])
    srv.close()
    assert r.exit_code == 1 and "permission denied on" in r.output and r.exception.__class__ is SystemExit


def test_mesh_refuses_a_socket_owned_by_another_user(tmp_path, monkeypatch):
    from meshsched.cli.main import app as typer_app
    from typer.testing import CliRunner

    path = tmp_path / "api.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    monkeypatch.setenv("MESH_API_SOCKET", str(path))
    real = os.lstat
    monkeypatch.setattr(os, "lstat", lambda p, *a, **k: os.stat_result(
        (*real(p)[:4], 4242, *real(p)[5:])) if str(p) == str(path) else real(p, *a, **k))
    r = CliRunner().invoke(typer_app, ["ls"])
    srv.close()
    assert r.exit_code == 1 and "belongs to uid 4242" in r.output


# ------------------------------------------------------------------ 10: names and numbers


@pytest.mark.parametrize("name", ["a\nb", "\x1b[31mred", "x" * 129, "tab\there", "nul\0"])
def test_bad_names_are_refused(name):
    with pytest.raises(RequestError):
        SubmitRequest.from_json({"command": ["true"], "cwd": "/", "name": name})


async def test_a_default_name_from_a_script_name_is_printable(daemon):
    rec = submit(daemon, ["/nonexistent/evil\nJOBID\x1b[2J.py"])
    assert rec.name == "evil?JOBID?[2J.py"


@pytest.mark.parametrize("deadline", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_deadlines_are_refused(deadline):
    with pytest.raises(RequestError, match="finite"):
        SubmitRequest.from_json({"command": ["true"], "cwd": "/", "deadline": deadline})


@pytest.mark.parametrize("key", ["MESHD_KILL_GRACE", "MESHD_PREEMPT_GRACE"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_nonfinite_graces_are_refused(key, value, tmp_path):
    with pytest.raises(ConfigError, match="finite"):
        load_config(env={key: value, "MESHD_STATE_DIR": str(tmp_path)})


def test_a_directory_is_not_called_missing(tmp_path, monkeypatch):
    from meshsched.cli.main import app as typer_app
    from typer.testing import CliRunner

    monkeypatch.setenv("MESH_API_SOCKET", str(tmp_path / "none.sock"))
    r = CliRunner().invoke(typer_app, ["submit", str(tmp_path)])
    assert r.exit_code == 2 and "is a directory" in r.output
    r = CliRunner().invoke(typer_app, ["submit", str(tmp_path / "nope.py")])
    assert r.exit_code == 2 and "does not exist" in r.output
