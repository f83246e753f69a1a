"""The MPS manager against a fake `nvidia-cuda-mps-control` on PATH that records what it was told."""

from __future__ import annotations

import json
import os
import stat

import pytest

from meshsched.daemon.mps import NoMps, RealMps
from meshsched.daemon.node import NodeDaemon
from meshsched.protocol import SubmitRequest
from tests.test_daemon_helpers import PY, kill_sessions, make_config, py, remove, short_dir, wait_for

FAKE = """#!{py}
import json, os, sys
line = sys.stdin.read() if "-d" not in sys.argv else ""
with open({log!r}, "a") as fh:
    fh.write(json.dumps({{"argv": sys.argv[1:], "stdin": line.strip(),
        "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
        "logdir": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}) + "\\n")
if line.startswith("get_server_list"):
    print("4242")
"""


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "mps.log"
    tool = bindir / "nvidia-cuda-mps-control"
    tool.write_text(FAKE.format(py=PY, log=str(log)))
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")

    def calls() -> list[dict]:
        return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []

    return calls


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
    assert told == [("1", "get_server_list"), ("1", "terminate_client 4242 777"), ("1", "quit"), ("0", "quit")]


async def test_no_mps_is_inert():
    mps = NoMps()
    await mps.start()
    assert mps.client_env(0, 50) == {} and mps.kind == "none"
    await mps.terminate_client(0, 1)
    await mps.close()


async def test_cancel_sends_terminate_client_before_signals(tmp_path, fake_control):
    runtime = short_dir()
    d = NodeDaemon(make_config(tmp_path / "state", runtime, gpus=2))
    await d.start()
    d.mps = RealMps(runtime / "mps", [0, 1])  # as with NVML GPUs and use_mps = true
    await d.mps.start()
    try:
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
    finally:
        pids = [r.supervisor_pid for r in d.records.values()]
        await d.mps.close()
        await d.close()
        kill_sessions(pids)
        remove(runtime)
