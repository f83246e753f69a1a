"""GPU backends: NVML through a stand-in pynvml module (no GPU here), the fake backend, and the fallback."""

from __future__ import annotations

import sys
import types

from meshsched.daemon.gpus import FakeGpus, NvmlGpus, open_backend


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


def test_nvml_inventory_and_readings(monkeypatch):
    nv = fake_pynvml(2)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    backend = open_backend(0, "v100", 16384)
    assert isinstance(backend, NvmlGpus) and backend.kind == "nvml"
    inv = backend.inventory()
    assert [(g.index, g.name, g.memory_total_mb, g.uuid) for g in inv] == [
        (0, "NVIDIA H100 80GB HBM3", 81920, "GPU-0"), (1, "NVIDIA H100 80GB HBM3", 81920, "GPU-1")]
    r = backend.readings()
    assert [(x.utilization, x.memory_used_mb, x.temperature) for x in r] == [(40, 3072, -1), (41, 3072, -1)]
    backend.close()
    assert nv.calls == ["init", "shutdown"]


def test_fallbacks(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(0))  # driver present, no GPUs
    backend = open_backend(0, "v100", 16384)
    assert isinstance(backend, FakeGpus) and len(backend.inventory()) == 8
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert len(open_backend(0, "t4", 1).inventory()) == 8
    forced = open_backend(3, "t4", 15000).inventory()
    assert len(forced) == 3 and forced[0].name == "t4" and forced[0].memory_total_mb == 15000
