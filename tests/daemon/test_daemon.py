"""In-process meshd: NodeDaemon with fake GPUs in the test's event loop, real job processes, real sockets."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from contextlib import closing

import aiohttp
import pytest
from meshsched.daemon.confine import format_cpus
from meshsched.daemon.journal import Journal
from meshsched.daemon.launcher import proc_start_time
from meshsched.daemon.node import NodeDaemon, Status

from meshsched.wire.protocol import (
    HEADER,
    REPLY_TYPES,
    FrameDecoder,
    encode_frame,
)
from tests.support.daemon import kill_sessions, make_config, py, state, submit, wait_for


async def test_lifecycle(dirs):
    d = NodeDaemon(make_config(*dirs))
    assert d.status is Status.NEW
    async with d:
        assert d.status is Status.RUNNING
        assert d.config.api_socket.exists() and d.config.job_socket.exists()
        with pytest.raises(RuntimeError, match="another meshd"):
            await NodeDaemon(make_config(*dirs)).start()  # one daemon per state dir
        with pytest.raises(RuntimeError):
            await d.start()
    assert d.status is Status.CLOSED
    assert not d.config.api_socket.exists() and not d.config.job_socket.exists()
    await d.close()  # idempotent


async def test_jobs_run_in_policy_order_with_torchrun_env(daemon):
    blocker = submit(daemon, py("import time; time.sleep(0.6)"), gpus=4, iters=1)
    env_dump = (
        "import os, json; print(json.dumps({k: os.environ[k] for k in ['RANK','LOCAL_RANK','WORLD_SIZE',"
        "'LOCAL_WORLD_SIZE','MASTER_ADDR','MASTER_PORT','CUDA_VISIBLE_DEVICES','MESH_JOB_ID','MESH_SOCKET',"
        "'MESH_CHECKPOINT_DIR','MESH_RESTART_COUNT']}))"
    )
    long, mid, short = (submit(daemon, py(env_dump), gpus=2, iters=n) for n in (300, 200, 100))
    assert state(daemon, long.job_id) == "PENDING"
    jobs = {i: daemon.listings.job_view(r) for i, r in daemon.records.items()}
    assert jobs[short.job_id]["reason"] == "Resources"
    assert jobs[long.job_id]["reason"] == "Priority"
    ids = [blocker.job_id, long.job_id, mid.job_id, short.job_id]
    await wait_for(lambda: all(state(daemon, i) == "COMPLETED" for i in ids), what="all jobs completed")
    starts = {i: daemon.records[i].start_time for i in ids}
    assert starts[blocker.job_id] < starts[short.job_id] <= starts[mid.job_id] < starts[long.job_id]
    logs = [json.loads((daemon.config.jobs_dir / short.job_id / "logs" / f"rank{r}.log").read_text()) for r in (0, 1)]
    assert [e["RANK"] for e in logs] == ["0", "1"] and logs[0]["WORLD_SIZE"] == "2"
    assert logs[0]["MASTER_PORT"] == logs[1]["MASTER_PORT"] and logs[0]["MESH_JOB_ID"] == short.job_id
    assert {e["CUDA_VISIBLE_DEVICES"] for e in logs} == {str(g) for g in daemon.records[short.job_id].assigned}
    assert logs[0]["MESH_SOCKET"] == str(daemon.config.job_socket) and logs[0]["MESH_RESTART_COUNT"] == "0"
    hist = [s for _, s, _ in daemon.journal.history(short.job_id)]
    assert hist == ["PENDING", "LOADING", "RUNNING", "COMPLETED"]


async def test_failed_rank_stops_the_others(daemon):
    code = (
        "import os, sys, time\nr = int(os.environ['RANK'])\n"
        "print('rank', r, 'out of memory' if r == 1 else 'training', flush=True)\n"
        "time.sleep(0.2 if r == 1 else 60)\nsys.exit(3 if r == 1 else 0)\n"
    )
    rec = submit(daemon, py(code), gpus=2)
    await wait_for(lambda: state(daemon, rec.job_id) == "FAILED", what="job failed")
    reason = daemon.records[rec.job_id].reason
    assert "rank 1" in reason and "exit code 3" in reason and "out of memory" in reason
    assert daemon.engine.state.free_gpus == 4


async def test_cancel_running_and_pending(daemon):
    run = submit(daemon, py("import time; time.sleep(60)"), gpus=4)
    queued = submit(daemon, py("pass"), gpus=4)
    await wait_for(lambda: state(daemon, run.job_id) == "RUNNING")
    pid = daemon.records[run.job_id].supervisor_pid
    daemon.cancel(queued.job_id)
    daemon.cancel(run.job_id)
    assert state(daemon, queued.job_id) == "CANCELLED"
    # its GPUs stay taken until its processes are gone: COMPLETING, then CANCELLED
    assert daemon.listings.job_view(daemon.records[run.job_id])["state"] == "COMPLETING"
    await wait_for(lambda: state(daemon, run.job_id) == "CANCELLED", what="cancelled once its processes are gone")
    assert daemon.records[run.job_id].supervisor_pid == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_job_socket_reports_and_peer_checks(daemon):
    code = (
        "from meshsched.job.client import JobClient\nimport time\n"
        "c = JobClient.from_env()\nprint(c.hello()['job_id'], flush=True)\n"
        "c.report(7, 0.25)\nc.checkpoint(5)\n"
        "try:\n    c.request({'type': 'report', 'job_id': '999', 'iterations': 1, 'step_time': 1})\n"
        "except Exception as e:\n    print('refused:', e, flush=True)\n"
        "time.sleep(30)\n"
    )
    rec = submit(daemon, py(code), gpus=1)
    await wait_for(lambda: daemon.records[rec.job_id].checkpoint_iterations == 5, what="checkpoint")
    job = daemon.engine.state.jobs[rec.job_id]
    assert job.done_iterations >= 7 and job.step_time == 0.25
    log = daemon.config.jobs_dir / rec.job_id / "logs" / "rank0.log"
    await wait_for(lambda: "refused" in log.read_text(), what="cross-job refusal")
    assert "may speak only for job" in log.read_text()
    metrics = await _http(daemon, "/metrics")
    assert f'meshd_job_steps_per_second{{job="{rec.job_id}"' in metrics and "meshd_running_jobs" in metrics
    assert 'meshd_is_leader{node="n1"} 1' in metrics  # one server leads itself

    # this test process belongs to no job: refused; garbage and oversized frames close only that connection
    for payload in (encode_frame({"type": "ping"}), HEADER.pack(10**9), HEADER.pack(3) + b"\xc1\xc1\xc1"):
        r, w = await asyncio.open_unix_connection(str(daemon.config.job_socket))
        w.write(payload)
        data = await asyncio.wait_for(r.read(), 5)  # read to EOF: the daemon closed the connection
        reply = FrameDecoder(REPLY_TYPES).feed(data)[0]
        assert reply["type"] == "error"
        w.close()
    assert json.loads(await _http(daemon, "/v1/health"))["status"] == "running"
    assert state(daemon, rec.job_id) == "RUNNING"


async def _http(d: NodeDaemon, path: str) -> str:
    conn = aiohttp.UnixConnector(path=str(d.config.api_socket))
    async with aiohttp.ClientSession(connector=conn) as s:
        async with s.get(f"http://meshd{path}") as resp:
            return await resp.text()


async def test_http_api_errors(daemon):
    conn = aiohttp.UnixConnector(path=str(daemon.config.api_socket))
    async with aiohttp.ClientSession(connector=conn) as s:
        async with s.post("http://meshd/v1/jobs", json={"command": ["true"], "cwd": "/", "gpus": 5}) as r:
            assert r.status == 400 and "only 4 GPU" in (await r.json())["error"]
        async with s.post("http://meshd/v1/jobs", data=b"{not json") as r:
            assert r.status == 400
        async with s.get("http://meshd/v1/jobs/42") as r:
            assert r.status == 404 and "unknown job 42" in (await r.json())["error"]
        async with s.post("http://meshd/v1/jobs", json={"command": ["true"], "cwd": "/", "gpus": 1}) as r:
            assert r.status == 201 and (await r.json())["user"]


async def test_restart_readopts_live_jobs_and_requeues_dead_ones(dirs):
    cfg = make_config(*dirs)
    d1 = NodeDaemon(cfg)
    await d1.start()
    live = submit(d1, py("import time; time.sleep(60)"), gpus=1, iters=30)
    dead = submit(d1, py("import time; time.sleep(60)"), gpus=1, iters=40)
    quick = submit(d1, py("import time; time.sleep(0.3)"), gpus=1, iters=50)
    wide = submit(d1, py("pass"), gpus=4, iters=60)
    ids = (live.job_id, dead.job_id, quick.job_id)
    await wait_for(lambda: all(state(d1, i) == "RUNNING" for i in ids))
    d1.job_checkpoint(dead.job_id, 12)
    pids = {i: d1.records[i].supervisor_pid for i in ids}
    await d1.close()  # jobs keep running without meshd
    os.kill(pids[live.job_id], 0)
    os.killpg(pids[dead.job_id], signal.SIGKILL)  # the machine "lost" this job's processes
    await wait_for(lambda: (cfg.jobs_dir / quick.job_id / "result.json").exists(), what="quick job done")
    d2 = NodeDaemon(cfg)
    await d2.start()
    try:
        assert state(d2, live.job_id) == "RUNNING" and d2.records[live.job_id].supervisor_pid == pids[live.job_id]
        # its supervisor may still be exiting after writing result.json: re-adopted, then seen to complete
        await wait_for(lambda: state(d2, quick.job_id) == "COMPLETED", what="quick job recorded as completed")
        # the dead job was requeued from its checkpoint and (SJF, 2 GPUs free) started again
        assert d2.records[dead.job_id].restarts == 2
        assert d2.engine.state.jobs[dead.job_id].checkpoint_iterations == 12
        assert state(d2, dead.job_id) in ("LOADING", "RUNNING")
        assert state(d2, wide.job_id) == "PENDING"
        assert d2.job_of_pid(pids[live.job_id]) == live.job_id
        d2.cancel(live.job_id)
        await wait_for(lambda: d2.records[live.job_id].supervisor_pid == 0, what="re-adopted job's exit seen")
    finally:
        left = [r.supervisor_pid for r in d2.records.values()]
        await d2.close()
        kill_sessions(left + list(pids.values()))


async def test_preemption_checkpoints_and_resumes(dirs):
    """srtf preempts a long job for a short one: SIGTERM -> checkpoint -> PREEMPTED -> relaunched, restart 1."""
    d = NodeDaemon(make_config(*dirs, policy="srtf"))
    await d.start()
    code = (
        "import os, signal, sys, time\nfrom meshsched.job.client import JobClient\n"
        "c = JobClient.from_env()\nprint('restart', os.environ['MESH_RESTART_COUNT'], flush=True)\n"
        "if os.environ['MESH_RESTART_COUNT'] != '0': sys.exit(0)\n"
        "def term(*_):\n    c.checkpoint(42)\n    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\nc.hello()\nprint('ready', flush=True)\ntime.sleep(60)\n"
    )
    try:
        long = submit(d, py(code), gpus=4, iters=1000)
        log = d.config.jobs_dir / long.job_id / "logs" / "rank0.log"
        await wait_for(lambda: log.exists() and "ready" in log.read_text(), what="long job ready")
        short = submit(d, py("pass"), gpus=2, iters=1)
        assert state(d, long.job_id) == "PAUSING"
        await wait_for(lambda: state(d, short.job_id) == "COMPLETED", what="short job done")
        await wait_for(lambda: state(d, long.job_id) == "COMPLETED", what="long job resumed and done")
        hist = [s for _, s, _ in d.journal.history(long.job_id)]
        assert hist[:6] == ["PENDING", "LOADING", "RUNNING", "PAUSING", "PREEMPTED", "LOADING"]
        assert d.records[long.job_id].restarts == 2 and "restart 1" in log.read_text()
    finally:
        pids = [r.supervisor_pid for r in d.records.values()]
        await d.close()
        kill_sessions(pids)


async def test_systemd_notify_ready_watchdog_stopping(dirs, monkeypatch):
    import socket

    path = dirs[1] / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    monkeypatch.setenv("WATCHDOG_USEC", "100000")  # ping every 50 ms
    loop = asyncio.get_running_loop()
    try:
        async with NodeDaemon(make_config(*dirs)):
            got = [await asyncio.wait_for(loop.sock_recv(sock, 4096), 5) for _ in range(3)]
        got.append(await asyncio.wait_for(loop.sock_recv(sock, 4096), 5))
        while True:
            try:
                got.append(sock.recv(4096))
            except BlockingIOError:
                break
    finally:
        sock.close()
    text = b"\n".join(got).decode()
    assert "READY=1" in text and "WATCHDOG=1" in text and "STOPPING=1" in text


async def test_tcp_api_needs_the_token(dirs):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with NodeDaemon(make_config(*dirs, http_tcp=f"127.0.0.1:{port}", token="s3cret")):
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/v1/jobs") as r:
                assert r.status == 401
            async with s.get(f"http://127.0.0.1:{port}/v1/jobs", headers={"Authorization": "Bearer nope"}) as r:
                assert r.status == 401
            async with s.get(f"http://127.0.0.1:{port}/v1/jobs", headers={"Authorization": "Bearer s3cret"}) as r:
                assert r.status == 200 and await r.json() == []


async def test_model_option_reuses_a_profile(daemon):
    rec = submit(daemon, py("import time; time.sleep(5)"), gpus=1, iters=10, model="resnet18")
    job = daemon.engine.state.jobs[rec.job_id]
    assert job.ideal_step_time != 1.0  # the fitted v100 profile, not the unprofiled fallback
    daemon.cancel(rec.job_id)


async def test_a_live_run_of_an_unjournalled_launch_is_adopted_not_started_again(dirs):
    """meshd died after spawning a job but before committing: the journal says PENDING, a supervisor runs. It used
    to be killed as an orphan and the job launched again (a job that had ended and was handing its result over
    then ran twice: the storage chaos run); now that run is adopted, its GPUs held, never started twice."""
    cfg = make_config(*dirs)
    d1 = NodeDaemon(cfg)
    await d1.start()
    rec = submit(d1, py("import time; time.sleep(60)"), gpus=1)
    await wait_for(lambda: state(d1, rec.job_id) == "RUNNING")
    orphan = d1.records[rec.job_id].supervisor_pid
    await d1.close()
    with closing(Journal(cfg.journal_path)) as j:  # rewrite history: the launch never committed
        r = next(x for x in j.load() if x.job_id == rec.job_id)
        r.state, r.supervisor_pid, r.supervisor_start, r.restarts, r.assigned = "PENDING", 0, "", 0, []
        with j.batch():
            j.put(r)
    d2 = NodeDaemon(cfg)
    await d2.start()
    try:
        assert state(d2, rec.job_id) == "RUNNING" and d2.records[rec.job_id].supervisor_pid == orphan
        assert not _gone(orphan) and d2.engine.state.jobs[rec.job_id].gpus == (0,)
    finally:
        pids = [r.supervisor_pid for r in d2.records.values()]
        await d2.close()
        kill_sessions(pids + [orphan])


def _gone(pid: int) -> bool:
    return proc_start_time(pid) is None



async def test_jobs_get_transient_scopes_via_systemd_run(dirs, tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "systemd-run.args"
    tool = bindir / "systemd-run"
    tool.write_text(
        f"#!{sys.executable}\nimport os, sys\nopen({str(record)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "rest = sys.argv[sys.argv.index('--') + 1:]\nos.execv(rest[0], rest)\n"
    )
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    async with NodeDaemon(make_config(*dirs, systemd_scope="yes")) as d:
        rec = submit(d, py("pass"), gpus=1)
        await wait_for(lambda: state(d, rec.job_id) == "COMPLETED", what="scoped job done")
    args = record.read_text().split()
    assert args[:4] == ["--scope", "--quiet", "--collect", f"--unit=mesh-job-{rec.job_id}-0.scope"]
    r = d.records[rec.job_id]  # the scope holds its CPUs and memory limit (daemon/confine.py)
    assert r.memory_enforced_by == "systemd" and r.cpu_ids
    limits = ["-p", f"AllowedCPUs={format_cpus(r.cpu_ids)}", "-p", f"MemoryMax={int(r.memory_limit_gb * 2**30)}"]
    assert args[4:8] == limits and args[8:12] == ["--", sys.executable, "-P", "-m"]


async def test_lazer_memory_survives_a_restart(dirs):
    """The preemption layer's memory (Lazer's arrivals, deferrals, GP observations) is journaled with the event
    that changed it and restored before recovery schedules anything (it was lost on every restart)."""
    cfg = make_config(*dirs, policy="lazer")
    d1 = NodeDaemon(cfg)
    await d1.start()
    try:
        for gpus in (4, 2, 2):
            submit(d1, py("import time; time.sleep(30)"), gpus=gpus)
        await wait_for(lambda: d1.engine.memory is not None, what="Lazer remembered the arrivals")
        memory = d1.engine.memory
        pids = [r.supervisor_pid for r in d1.records.values()]
    finally:
        await d1.close()
    d2 = NodeDaemon(cfg)
    await d2.start()
    try:
        assert d2.engine.memory is not None
        assert d2.engine.memory.arrivals == memory.arrivals and d2.engine.memory.optimizer == memory.optimizer
    finally:
        pids += [r.supervisor_pid for r in d2.records.values()]
        await d2.close()
        kill_sessions(pids)


async def test_the_supervisor_does_not_import_from_meshds_cwd(daemon):
    """meshd started from a checkout of this repo, with meshsched installed (not editable), started no supervisor:
    the supervisor inherits meshd's cwd, `python -m` put it first on sys.path, and the checkout's `meshsched/`
    (which has no `daemon` package: it lives at the top level) shadowed the installed one (seen on the GPU machine:
    "No module named 'meshsched.daemon'"). An editable install, as here, hides it, so the command line is checked."""
    rec = submit(daemon, py("import time; time.sleep(30)"))
    await wait_for(lambda: daemon.records[rec.job_id].supervisor_pid, what="supervisor up")

    def argv() -> list[str]:  # until the forked child has exec'd, /proc shows the parent's command line
        return open(f"/proc/{daemon.records[rec.job_id].supervisor_pid}/cmdline").read().split("\0")

    await wait_for(lambda: "meshsched.daemon.supervisor" in argv(), what="the supervisor exec'd")
    assert argv()[1:4] == ["-P", "-m", "meshsched.daemon.supervisor"]
    daemon.cancel(rec.job_id)
    await wait_for(lambda: state(daemon, rec.job_id) == "CANCELLED", what="cancelled")
