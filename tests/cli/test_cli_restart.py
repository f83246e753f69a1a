"""`mesh submit --wait` and `mesh logs -f` ride through a restart of meshd (SIGKILL, then a new meshd on the same
state dir): one notice on stderr each way, the job's own exit code, every log line once.

Real meshd processes and the real `mesh` in subprocesses; no timing assertions: each step polls with a deadline
for what the previous one made true (the job's output, the client's notice)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from tests.support.daemon import kill_sessions, poll, remove, short_dir, start_meshd

pytestmark = pytest.mark.slow

# Prints `line 0..4`, waits for the file `go` beside it, prints `line 5..9`, waits for `end`, exits 7.
JOB = """
import os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
def wait(name):
    while not os.path.exists(os.path.join(here, name)):
        time.sleep(0.05)
for i in range(5):
    print("line", i, flush=True)
wait("go")
for i in range(5, 10):
    print("line", i, flush=True)
wait("end")
sys.exit(7)
"""

FLAGS = ("--fake-gpus", "2", "--kill-grace", "1", "--node-name", "r1")


class Cli:
    """`mesh ARGS` in a subprocess whose stdout and stderr lines are collected as they come."""

    def __init__(self, sock, *args: str) -> None:
        env = dict(os.environ, MESH_API_SOCKET=str(sock))
        self.proc = subprocess.Popen([sys.executable, "-m", "meshsched.cli.main", *args], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(s, into), daemon=True)
                         for s, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def said(self, text: str, where: str = "err") -> bool:
        lines = self.err if where == "err" else self.out
        if any(text in line for line in list(lines)):
            return True
        assert self.proc.poll() is None or any(t.is_alive() for t in self._readers), \
            f"mesh exited {self.proc.returncode} before saying {text!r}: {self.err}"
        return False

    def finish(self, timeout: float = 60.0) -> int:
        rc = self.proc.wait(timeout)
        for t in self._readers:
            t.join(10)
        return rc


@pytest.fixture
def restartable(tmp_path):
    """(start, kill, job_dir): a real meshd on the same state dir, started again after a SIGKILL."""
    state, runtime = tmp_path / "state", short_dir()
    procs, clients = [], []

    def start():
        proc, client = start_meshd(state, runtime, *FLAGS)
        procs.append(proc)
        clients.append(client)
        return client

    def kill() -> None:
        procs[-1].send_signal(signal.SIGKILL)
        procs[-1].wait(10)

    yield start, kill, runtime / "api.sock"
    pids = []
    try:
        pids = [j["supervisor_pid"] for j in clients[-1].call("GET", "/v1/jobs")]
    except Exception:  # noqa: BLE001 - meshd may be down: its jobs' sessions are still killed below
        pids = [int(p.read_text().split()[0]) for p in (state / "jobs").glob("*/supervisor.pid") if p.read_text().strip()]
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)
    kill_sessions(pids)
    remove(runtime)


def _script(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    script = work / "job.py"
    script.write_text(JOB)
    return work, script


def test_submit_wait_rides_through_a_meshd_restart_and_exits_with_the_jobs_code(restartable, tmp_path):
    """Fails before: `mesh submit --wait` exited 2 (`meshd closed the connection without an answer`) the moment
    meshd was killed; the job ran on and ended with 7, which the caller never saw."""
    start, kill, sock = restartable
    work, script = _script(tmp_path)
    client = start()
    cli = Cli(sock, "submit", str(script), "--wait")
    poll(lambda: cli.said("Submitted job", where="out"), timeout=60, what="the job submitted")
    job = cli.out[0].split()[-1]
    poll(lambda: client.call("GET", f"/v1/jobs/{job}")["state"] == "RUNNING", timeout=60, what="the job running")
    kill()
    poll(lambda: cli.said("meshd went away"), timeout=60, what="the client's notice that meshd went away")
    client = start()
    (work / "go").touch()
    (work / "end").touch()
    assert cli.finish() == 7, cli.err
    notices = [line for line in cli.err if "meshd went away" in line]
    assert len(notices) == 1 and "reconnecting" in notices[0], cli.err
    assert sum("reconnected" in line for line in cli.err) == 1, cli.err
    assert client.call("GET", f"/v1/jobs/{job}")["exit_code"] == 7


def test_logs_follow_prints_every_line_once_across_a_restart(restartable, tmp_path):
    """Fails before: `mesh logs -f` exited 2 when meshd was killed, lines 5..9 never printed. The lines written
    while meshd was down come after the reconnect, from the byte offset it had: none twice, none lost."""
    start, kill, sock = restartable
    work, script = _script(tmp_path)
    client = start()
    job = client.call("POST", "/v1/jobs", {"command": [sys.executable, str(script)], "cwd": str(work)})["job_id"]
    cli = Cli(sock, "logs", job, "-f")
    poll(lambda: cli.said("line 4", where="out"), timeout=60, what="the first five lines followed")
    kill()
    poll(lambda: cli.said("meshd went away"), timeout=60, what="the client's notice that meshd went away")
    (work / "go").touch()
    log = tmp_path / "state" / "jobs" / job / "logs" / "rank0.log"
    poll(lambda: "line 9" in log.read_text(), timeout=60, what="the job writing on while meshd is down")
    start()
    poll(lambda: cli.said("reconnected"), timeout=60, what="the client reconnected")
    (work / "end").touch()
    assert cli.finish() == 0, cli.err
    assert cli.out == [f"line {i}" for i in range(10)], cli.out
    assert sum("meshd went away" in line for line in cli.err) == 1, cli.err


def test_a_client_gives_up_in_one_line_when_meshd_stays_away(restartable, tmp_path):
    """`--reconnect SECONDS` bounds the wait; then one line says meshd did not come back, exit 2."""
    start, kill, sock = restartable
    work, script = _script(tmp_path)
    client = start()
    job = client.call("POST", "/v1/jobs", {"command": [sys.executable, str(script)], "cwd": str(work)})["job_id"]
    cli = Cli(sock, "logs", job, "-f", "--reconnect", "1")
    poll(lambda: cli.said("line 4", where="out"), timeout=60, what="the first five lines followed")
    kill()
    assert cli.finish() == 2
    err = [line for line in cli.err if "log (rank 0) is empty so far" not in line]  # said if it was, at the start
    assert len(err) == 2 and "meshd went away" in err[0], cli.err
    assert err[1].startswith("mesh: error: ") and "did not come back within 1 s" in err[1], cli.err
    assert str(sock) in err[1] and "systemctl status meshd" in err[1]


def test_riding_tries_again_only_after_meshd_answered(monkeypatch, capsys):
    """The reconnect rule on its own (no meshd): a first request that finds none fails at once (the usual
    `meshd is not running` line); once meshd has answered, one that finds none is tried again, with one notice
    when meshd went and one when it is back; a reset mid-answer counts as gone too."""
    from meshsched.cli.client import Client, DaemonUnavailable, Riding

    answers = [DaemonUnavailable("Connection refused"), (200, {}, b"{}"), DaemonUnavailable("closed"),
               DaemonUnavailable("No such file or directory"), (200, {}, b'{"ok": true}')]

    def raw(self, method, url, body=None):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(Client, "raw", raw)
    monkeypatch.setattr("time.sleep", lambda s: None)
    riding = Riding(Client("/nowhere.sock"), within=60.0)
    with pytest.raises(DaemonUnavailable):
        riding.call("GET", "/v1/health")  # never answered yet: no retry
    assert capsys.readouterr().err == ""
    assert riding.call("GET", "/v1/health") == {}
    assert riding.call("GET", "/v1/health") == {"ok": True}  # through two failed tries
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[0].startswith("mesh: meshd went away (closed); reconnecting for up to 60 s")
    assert err[1] == "mesh: reconnected to meshd"


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="no pseudo-terminals on this platform")
def test_live_top_rides_through_a_restart_and_q_still_quits(restartable, tmp_path):
    """Fails before: the live `mesh top` exited 2 the moment meshd was killed."""
    import select

    start, kill, sock = restartable
    start()
    master, slave = os.openpty()
    env = dict(os.environ, MESH_API_SOCKET=str(sock))
    proc = subprocess.Popen([sys.executable, "-m", "meshsched.cli.main", "top", "--interval", "0.2"], stdin=slave,
                            stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    seen = bytearray()

    def drain() -> None:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                seen.extend(os.read(master, 65536))
            except OSError:  # the terminal's other side closed
                pass

    def saw(text: bytes) -> bool:
        running = proc.poll() is None  # before the read: what it printed before exiting is read below
        drain()
        assert text in seen or running, bytes(seen)
        return text in seen

    try:
        poll(lambda: saw(b"JOBID"), timeout=60, what="the first frame")
        kill()
        poll(lambda: saw(b"meshd went away"), timeout=60, what="the notice that meshd went away")
        start()
        poll(lambda: saw(b"reconnected to meshd"), timeout=60, what="the notice that meshd is back")
        os.write(master, b"q")
        poll(lambda: (drain(), proc.poll() is not None)[1], timeout=60, what="mesh top quitting on q")
        assert proc.returncode == 0, bytes(seen)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
