"""GPU backends: NVML through a stand-in pynvml module (no GPU here), the fake backend, and the fallback."""

from __future__ import annotations

import sys

from meshsched.daemon.gpus import FakeGpus, NvmlGpus, open_backend

from tests.support.fakes import fake_pynvml


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


def test_profile_type_from_device_names():
    from meshsched.daemon.gpus import profile_type

    assert profile_type("Tesla V100-SXM2-16GB") == "v100"  # the profiles' key: a real V100 matched none before
    assert profile_type("Tesla K80") == "k80" and profile_type("Tesla P100-PCIE-16GB") == "p100"
    assert profile_type("NVIDIA H200") == "h200" and profile_type("NVIDIA A800-SXM4-80GB") == "a800"
    assert profile_type("NVIDIA GeForce RTX 4090") == "rtx4090" and profile_type("v100") == "v100"


def test_cuda_id_is_the_uuid_of_a_real_gpu_and_the_index_of_a_fake(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(2))
    assert [g.cuda_id for g in open_backend(0, "", 16384).inventory()] == ["GPU-0", "GPU-1"]
    assert [g.cuda_id for g in open_backend(2, "", 16384).inventory()] == ["0", "1"]
    assert open_backend(2, "", 16384).inventory()[0].name == "v100"  # fakes default to the profiled type
