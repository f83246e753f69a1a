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

    @property
    def cuda_id(self) -> str:
        """What CUDA_VISIBLE_DEVICES names this GPU by: its UUID for a real GPU (CUDA's device order can differ
        from NVML's, and an MPS server renumbers the devices it serves, so an index would pick another GPU or
        fail); the index for a fake one."""
        return self.uuid if self.uuid.startswith("GPU-") else str(self.index)


_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}


def profile_type(name: str) -> str:
    """The GPU type the performance profiles are keyed by, from a device's name: 'Tesla V100-SXM2-16GB' -> 'v100',
    'NVIDIA H200' -> 'h200', 'NVIDIA GeForce RTX 4090' -> 'rtx4090'."""
    words = [w for w in name.lower().replace("-", " ").split() if w not in _VENDOR_WORDS]
    if not words:
        return name.lower()
    if words[0] in ("rtx", "gtx") and len(words) > 1:
        return words[0] + words[1]
    return words[0]


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


FAKE_GPU_TYPE = "v100"  # so `--model` profiles apply


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
    """`fake_gpus` > 0 forces fakes; 0 tries NVML and falls back to 8 fake GPUs (named `gpu_type`, else v100)."""
    if fake_gpus > 0:
        return FakeGpus(fake_gpus, gpu_type or FAKE_GPU_TYPE, memory_mb)
    try:
        return NvmlGpus()
    except Exception:  # no pynvml, no driver, no GPUs: all mean "use fakes"
        return FakeGpus(8, gpu_type or FAKE_GPU_TYPE, memory_mb)
