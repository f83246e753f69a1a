"""The MPS manager against a fake `nvidia-cuda-mps-control` on PATH that records what it was told."""

from __future__ import annotations

import os

from meshsched.daemon.mps import NoMps, RealMps
from meshsched.daemon.node import NodeDaemon

from meshsched.wire.protocol import SubmitRequest
from tests.support.daemon import (
    daemon_with_mps,
    kill_sessions,
    make_config,
    py,
    remove,
    short_dir,
    wait_for,
)


async def test_one_control_daemon_per_gpu_with_own_dirs(tmp_path, fake_control):
    mps = RealMps(tmp_path / "mps", [0, 1])
    await mps.start()
    started = fake_control()
    assert [(c["argv"], c["gpu"]) for c in started] == [(["-d"], "0"), (["-d"], "1")]
    assert started[0]["pipe"] != started[1]["pipe"] and started[0]["pipe"].endswith("gpu0/pipe")
    assert started[1]["logdir"].endswith("gpu1/log") and os.path.isdir(started[1]["pipe"])
    env = mps.client_env(1, share=50, mem_limit_mb=2048)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == started[1]["pipe"]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    await mps.terminate_client(1, 777)
    await mps.close()
    told = [(c["gpu"], c["stdin"]) for c in fake_control()[2:]]
    assert told == [("1", "get_server_list"), ("1", "terminate_client 4242 777"),
                    ("1", "get_server_list"), ("1", "get_client_list 4242"), ("1", "quit"),
                    ("0", "get_server_list"), ("0", "get_client_list 4242"), ("0", "quit")]


async def test_a_restarted_meshd_adopts_a_serving_daemon_and_leaves_one_with_clients(tmp_path, fake_control):
    """meshd stopped (or killed) under a shared job leaves its GPU's control daemon serving the job's ranks: the
    next meshd adopts it instead of starting a second one on the same pipe, and a meshd stopping while a job's
    rank is still a client does not `quit` it (before: `-d` again, and `quit` under live clients)."""
    first = RealMps(tmp_path / "mps", [0, 1])
    await first.start()
    for gpu in (0, 1):
        (first.pipe_dir(gpu) / "control").write_text("")  # what a real daemon's socket looks like on disk
    (first.pipe_dir(1) / "clients").write_text("9001")
    await first.close()
    quits = [c["gpu"] for c in fake_control() if c["stdin"] == "quit"]
    assert quits == ["0"]  # GPU 1 still serves rank 9001
    (first.pipe_dir(0) / "control").unlink()  # as the real daemon that quit does
    second = RealMps(tmp_path / "mps", [0, 1])
    await second.start()
    starts = [c["gpu"] for c in fake_control() if c["argv"] == ["-d"]]
    assert starts == ["0", "1", "0"]  # the first meshd's two, then GPU 0 again; GPU 1's daemon is adopted
    await second.close()


async def test_no_mps_is_inert():
    mps = NoMps()
    await mps.start()
    assert mps.client_env(0, 50) == {} and mps.kind == "none"
    await mps.terminate_client(0, 1)
    await mps.close()


async def test_cancel_sends_terminate_client_before_signals(tmp_path, fake_control):
    async with daemon_with_mps(tmp_path / "state", 2) as d:
        code = "import os, time; print(os.environ['CUDA_MPS_PIPE_DIRECTORY'], flush=True); time.sleep(60)"
        rec = d.submit(SubmitRequest(command=py(code), cwd="/tmp", gpus=2), "u")
        logs = [d.config.jobs_dir / rec.job_id / "logs" / f"rank{r}.log" for r in (0, 1)]
        await wait_for(lambda: all(p.exists() and p.read_text() for p in logs), what="ranks up")
        assert [p.read_text().strip() for p in logs] == [str(d.mps.pipe_dir(g)) for g in d.records[rec.job_id].assigned]
        workers = d.launcher.workers(rec.job_id)
        d.cancel(rec.job_id)
        await wait_for(lambda: d.records[rec.job_id].supervisor_pid == 0, what="job stopped")
        told = [c["stdin"] for c in fake_control() if c["stdin"].startswith("terminate_client")]
        assert told == [f"terminate_client 4242 {pid}" for pid in workers]


async def test_nvml_gpus_under_mps_are_named_by_uuid(tmp_path, fake_control, monkeypatch):
    """On a real node every rank and every MPS control daemon names its GPU by UUID: a server started with
    CUDA_VISIBLE_DEVICES=1 serves that GPU as device 0, so a client told "1" found no device (before: the index)."""
    import sys

    from tests.support.fakes import fake_pynvml

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(2))
    runtime = short_dir()
    d = NodeDaemon(make_config(tmp_path / "state", runtime, gpus=0, use_mps=True))
    await d.start()
    try:
        assert d.gpus.kind == "nvml" and d.node_spec().gpu_type == "h100"  # NVML's "NVIDIA H100 80GB HBM3"
        started = [(c["argv"], c["gpu"]) for c in fake_control()]
        assert started == [(["-d"], "GPU-0"), (["-d"], "GPU-1")]
        code = "import os, time; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['CUDA_DEVICE_ORDER'], flush=True); time.sleep(60)"
        rec = d.submit(SubmitRequest(command=py(code), cwd="/tmp", gpus=1), "u")
        log = d.config.jobs_dir / rec.job_id / "logs" / "rank0.log"
        await wait_for(lambda: log.exists() and log.read_text(), what="rank up")
        gpu = d.records[rec.job_id].assigned[0]
        assert log.read_text().split() == [f"GPU-{gpu}", "PCI_BUS_ID"]
        d.cancel(rec.job_id)
        await wait_for(lambda: d.records[rec.job_id].supervisor_pid == 0, what="job stopped")
    finally:
        pids = [r.supervisor_pid for r in d.records.values()]
        await d.close()
        kill_sessions(pids)
        remove(runtime)


async def test_start_returns_while_the_forked_control_daemon_lives_on(tmp_path, fake_control, monkeypatch):
    """`nvidia-cuda-mps-control -d` forks a daemon that keeps the stdout it inherited: meshd waits for the
    command's exit, not for EOF (before: meshd never came up with use_mps on a real GPU; seen on an H200)."""
    import signal

    marker = tmp_path / "daemon.pid"
    monkeypatch.setenv("FAKE_MPS_LINGER", str(marker))
    mps = RealMps(tmp_path / "mps", [0])
    try:
        await mps.start()
        pid = int(marker.read_text())
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        assert state != "Z"  # still alive (not exited, not a zombie): start() did not wait for it
    finally:
        if marker.exists():
            os.kill(int(marker.read_text()), signal.SIGKILL)
