"""A hand-checkable performance model for engine, policy and simulator tests."""

from __future__ import annotations

import types

from meshsched.perf import UnknownProfile


class LinearPerf:
    """Step time = per_gpu_batch * 0.01 s, +10% per extra node; load 10 s, pause 5 s; pairs slow both by 1.5x."""

    gpu_types = ("fake",)

    def __init__(self, load: float = 10.0, pause: float = 5.0) -> None:
        self.load, self.pause = load, pause

    def models(self, gpu_type: str, gpus: int = 1) -> tuple[str, ...]:
        return ("m",)

    def profiled_batches(self, model: str, gpu_type: str) -> tuple[int, ...]:
        return (100,)

    def iteration_time(self, model, gpu_type, placement, per_gpu_batch, accumulation=1) -> float:
        if model != "m":
            raise UnknownProfile(f"unknown model {model!r}")
        return per_gpu_batch * 0.01 * (1.0 + 0.1 * (len(placement) - 1))

    def colocation(self, model_a, batch_a, model_b, batch_b, gpu_type):
        return (1.5, 1.5)

    def load_time(self, model: str) -> float:
        return self.load

    def pause_time(self, model: str) -> float:
        return self.pause

    def gpu_memory_mb(self, gpu_type: str) -> int:
        return 16384


def launch(job_id, gpus, resume_from=0.0, restart=0, per_gpu_batch=100):
    """The Launch the engine sends for a job of the harnesses (global batch 100 per GPU, default ExecConfig)."""
    from meshsched.actions import Launch
    from meshsched.state import ExecConfig

    return Launch(job_id, gpus, resume_from, restart, ExecConfig(per_gpu_batch))


def fake_pynvml(count: int) -> types.ModuleType:
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    mem = types.SimpleNamespace(total=80 * 2**30, used=3 * 2**30)
    nv.NVMLError = NVMLError
    nv.NVML_TEMPERATURE_GPU = 0
    nv.calls = []
    nv.nvmlInit = lambda: nv.calls.append("init")
    nv.nvmlShutdown = lambda: nv.calls.append("shutdown")
    nv.nvmlDeviceGetCount = lambda: count
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    nv.nvmlDeviceGetMemoryInfo = lambda h: mem
    nv.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=40 + h)

    def temp(h, kind):
        raise NVMLError("not supported")

    nv.nvmlDeviceGetTemperature = temp
    return nv


# A stand-in `nvidia-cuda-mps-control` that records what it was told (format with py=, log=).
FAKE_MPS_CONTROL = """#!{py}
import json, os, sys
line = sys.stdin.read() if "-d" not in sys.argv else ""
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
dead = os.path.join(pipe, "dead")  # kill_mps_server: the GPU's daemon is gone, its socket left behind
if "-d" in sys.argv:  # a new daemon: it listens on the pipe's control socket
    open(os.path.join(pipe, "control"), "w").close()
    if os.path.exists(dead):
        os.unlink(dead)
elif os.path.exists(dead):
    sys.exit("Cannot connect to the MPS control daemon")
with open({log!r}, "a") as fh:
    fh.write(json.dumps({{"argv": sys.argv[1:], "stdin": line.strip(),
        "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
        "logdir": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}) + "\\n")
if line.startswith("get_server_list"):
    print("4242")
if "-d" in sys.argv and os.environ.get("FAKE_MPS_LINGER") and os.fork() == 0:  # the daemon, as the real -d forks it:
    open(os.environ["FAKE_MPS_LINGER"], "w").write(str(os.getpid()))  # it keeps the inherited stdout open
    import time; time.sleep(30)
    os._exit(0)
clients = os.path.join(pipe, "clients")  # the test writes the pids a server has
if line.startswith("get_client_list") and os.path.exists(clients):
    print(open(clients).read())
"""


def kill_mps_server(pipe_dir) -> None:
    """The stand-in's MPS daemon of the GPU whose pipe dir this is dies: every command to it fails until `-d`
    starts a new one (as a real daemon that died leaves a control socket nobody answers on)."""
    import pathlib

    (pathlib.Path(pipe_dir) / "dead").write_text("")
