"""GPU inventory and live readings: NVML (pynvml from nvidia-ml-py) when present, else N fake GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str
    memory_total_mb: int
    uuid: str


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    utilization: int  # percent, -1 when unknown
    memory_used_mb: int
    temperature: int  # Celsius, -1 when unknown


class GpuBackend(Protocol):
    kind: str

    def inventory(self) -> list[GpuInfo]: ...

    def readings(self) -> list[GpuReading]: ...

    def close(self) -> None: ...


class FakeGpus:
    """N virtual GPUs: jobs run as real CPU processes; readings are zeros."""

    kind = "fake"

    def __init__(self, count: int, gpu_type: str, memory_mb: int) -> None:
        if count < 1:
            raise ValueError("fake GPU count must be >= 1")
        self._gpus = [GpuInfo(i, gpu_type, memory_mb, f"FAKE-{i}") for i in range(count)]

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def readings(self) -> list[GpuReading]:
        return [GpuReading(g.index, 0, 0, -1) for g in self._gpus]

    def close(self) -> None:
        return None


class NvmlGpus:
    """Real GPUs through NVML; construct only via `open_backend` (raises when NVML is unusable)."""

    kind = "nvml"

    def __init__(self) -> None:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        self._nv = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        if not self._handles:
            pynvml.nvmlShutdown()
            raise RuntimeError("NVML reports no GPUs")

    def inventory(self) -> list[GpuInfo]:
        nv = self._nv
        out = []
        for i, h in enumerate(self._handles):
            name = nv.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            uuid = nv.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            out.append(GpuInfo(i, name, nv.nvmlDeviceGetMemoryInfo(h).total // 2**20, uuid))
        return out

    def readings(self) -> list[GpuReading]:
        nv = self._nv
        out = []
        for i, h in enumerate(self._handles):
            try:
                util = nv.nvmlDeviceGetUtilizationRates(h).gpu
            except nv.NVMLError:
                util = -1
            try:
                temp = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
            except nv.NVMLError:
                temp = -1
            out.append(GpuReading(i, util, nv.nvmlDeviceGetMemoryInfo(h).used // 2**20, temp))
        return out

    def close(self) -> None:
        self._nv.nvmlShutdown()


def open_backend(fake_gpus: int, gpu_type: str, memory_mb: int) -> GpuBackend:
    """`fake_gpus` > 0 forces fakes; 0 tries NVML and falls back to 8 fake GPUs."""
    if fake_gpus > 0:
        return FakeGpus(fake_gpus, gpu_type, memory_mb)
    try:
        return NvmlGpus()
    except Exception:  # no pynvml, no driver, no GPUs: all mean "use fakes"
        return FakeGpus(8, gpu_type, memory_mb)
