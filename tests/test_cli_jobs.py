"""`mesh submit|ls|show|logs|cancel|nodes|top` against a meshd running in a background thread."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import typer
from typer.testing import CliRunner

from meshsched.cli import jobs
from meshsched.cli.jobs import fmt_time, parse_deadline
from meshsched.daemon.node import NodeDaemon
from tests.test_daemon_helpers import kill_sessions, make_config, poll, remove, short_dir


def _app() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)
    jobs.register(app)
    return app


@pytest.fixture
def served(tmp_path, monkeypatch):
    runtime = short_dir()
    cfg = make_config(tmp_path / "state", runtime)
    monkeypatch.setenv("MESH_API_SOCKET", str(cfg.api_socket))
    loop = asyncio.new_event_loop()
    d = NodeDaemon(cfg)
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(d.start())
        started.set()
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert started.wait(20)
    yield d
    pids = [r.supervisor_pid for r in list(d.records.values())]
    asyncio.run_coroutine_threadsafe(d.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)
    loop.close()
    kill_sessions(pids)
    remove(runtime)


def mesh(*args: str):
    return CliRunner().invoke(_app(), list(args))


def test_daemon_not_running(monkeypatch, tmp_path):
    monkeypatch.setenv("MESH_API_SOCKET", str(tmp_path / "none.sock"))
    r = mesh("ls")
    assert r.exit_code == 2
    assert "meshd is not running" in r.output and "mesh daemon" in r.output


def test_submit_ls_show_logs_cancel(served, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import sys, time\nprint('args', sys.argv[1:], flush=True)\ntime.sleep(float(sys.argv[1]))\n")
    r = mesh("submit", str(script), "--gpus", "2", "--iters", "10", "--name", "tiny", "--", "0.1")
    assert r.exit_code == 0, r.output
    first = r.output.split()[-1]
    r = mesh("submit", str(script), "--gpus", "4", "--json", "--", "30")
    assert r.exit_code == 0, r.output
    second = json.loads(r.output)["job_id"]
    poll(lambda: served.records[first].state == "COMPLETED", what="first job completed")
    poll(lambda: served.records[second].state == "RUNNING", what="second job running")
    r = mesh("ls")
    assert r.exit_code == 0
    header = r.output.splitlines()[0].split()
    assert header == ["JOBID", "NAME", "USER", "STATE", "TIME", "GPUS", "PARTNER", "BATCH", "MPS%", "NODE(REASON)"]
    assert second in r.output and "RUNNING" in r.output and first not in r.output.split()
    listed = json.loads(mesh("ls", "--all", "--json").output)
    assert {j["job_id"]: j["state"] for j in listed} == {first: "COMPLETED", second: "RUNNING"}
    r = mesh("show", first)
    assert "COMPLETED" in r.output and "tiny" in r.output
    assert json.loads(mesh("show", first, "--json").output)["name"] == "tiny"
    assert mesh("logs", first).output.strip() == "args ['0.1']"
    assert mesh("logs", first, "-f").output.strip() == "args ['0.1']"  # ends: the job is done
    r = mesh("top", "--once")
    assert r.exit_code == 0 and "[0]" in r.output and second in r.output
    nodes = json.loads(mesh("nodes", "--json").output)
    assert nodes[0]["total_gpus"] == 4 and nodes[0]["free_gpus"] == 0
    assert "fake" in mesh("nodes").output
    r = mesh("cancel", second)
    assert r.exit_code == 0 and "CANCELLED" in r.output


def test_user_errors_are_one_line(served, tmp_path):
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    for args, text in [
        (("submit", str(script), "--gpus", "0"), "--gpus must be at least 1"),
        (("submit", str(script), "--gpus", "9"), "only 4 GPU"),
        (("submit", str(tmp_path / "missing.py")), "does not exist"),
        (("show", "404"), "unknown job 404"),
        (("cancel", "404"), "unknown job 404"),
        (("logs", "404"), "unknown job 404"),
        (("submit", str(script), "--deadline", "soon"), "--deadline"),
    ]:
        r = mesh(*args)
        assert r.exit_code != 0, args
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("mesh: error:") and text in lines[0], r.output


def test_formatting_helpers():
    assert fmt_time(5) == "0:05" and fmt_time(3725) == "1:02:05" and fmt_time(90061) == "1-01:01:01"
    assert parse_deadline("2h", 100.0) == 7300.0 and parse_deadline("30m", 0.0) == 1800.0


def test_mesh_daemon_reports_bad_flags(tmp_path):
    r = mesh("daemon", "--fake-gpus", "-1", "--state-dir", str(tmp_path / "s"), "--runtime-dir", str(tmp_path / "r"))
    assert r.exit_code != 0 and "fake_gpus must be >= 0" in r.output
