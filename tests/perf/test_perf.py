"""Tests of meshsched.perf: loader, iteration-time properties, fit accuracy, colocation, errors, determinism."""

from __future__ import annotations

import csv
import json
import math
from importlib.resources import files
from pathlib import Path

import pytest

from meshsched.loaders.profiles import load_perf_model
from meshsched.perf import DEFAULT_GPU_TYPE, PerfModel, UnknownProfile, ideal_placement
from meshsched.perf.itermodel import comp_time

PROFILES = files("meshsched.profiles")  # the raw measurements come from the `raw_data` fixture (conftest.py)

# Tolerances for fitted vs measured iteration times: single-GPU points are fitted closely; the multi-GPU
# points carry measurement noise and the comm model is coarser (see profiles/README.md).
SINGLE_GPU_TOL = 0.10
MULTI_GPU_TOL = 0.25


@pytest.fixture(scope="module")
def pm() -> PerfModel:
    return load_perf_model()


def all_profiles(pm: PerfModel) -> list[tuple[str, str]]:
    return [(m, g) for g in pm.gpu_types for m in pm.models(g)]


def multi_profiles(pm: PerfModel) -> list[tuple[str, str]]:
    return [(m, g) for g in pm.gpu_types for m in pm.models(g, gpus=8)]


# -- loader ----------------------------------------------------------------------------------------------


def test_loader_is_package_relative_and_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    load_perf_model.cache_clear()
    monkeypatch.chdir(tmp_path)  # nothing may depend on the working directory
    pm = load_perf_model()
    assert load_perf_model() is pm
    assert pm.gpu_types == ("k80", "p100", "t4", "v100")
    assert DEFAULT_GPU_TYPE in pm.gpu_types
    assert (PROFILES / "iteration_v100.json").is_file()


def test_catalogue(pm: PerfModel) -> None:
    assert pm.models("v100") == (
        "a3c", "cyclegan", "lm", "recommendation", "resnet18", "resnet50", "transformer",
    )
    assert pm.models("v100", gpus=4) == ("lm", "resnet18", "resnet50", "transformer")
    assert pm.models("t4", gpus=64) == ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
    assert pm.profiled_batches("resnet50", "v100") == (16, 32, 64, 128)
    assert pm.profiled_batches("a3c", "k80") == (1,)
    assert pm.profiled_batches("cifar10", "t4")[0] == 32
    assert pm.gpu_memory_mb("k80") == 12 * 1024
    assert pm.gpu_memory_mb("v100") == 16 * 1024
    for model in pm.models("v100") + pm.models("t4"):
        assert 0 < pm.pause_time(model) < pm.load_time(model)


def test_ideal_placement() -> None:
    assert ideal_placement(16, 8) == (8, 8)
    assert ideal_placement(12, 8) == (8, 4)
    assert ideal_placement(3, 8) == (3,)
    assert ideal_placement(8, 8) == (8,)
    assert ideal_placement(5, 4) == (4, 1)
    with pytest.raises(ValueError):
        ideal_placement(0, 8)


# -- iteration-time properties ---------------------------------------------------------------------------


def test_increasing_in_batch(pm: PerfModel) -> None:
    for model, gpu in all_profiles(pm):
        placements = [(1,)] + ([(8,), (4, 4)] if model in pm.models(gpu, 8) else [])
        for placement in placements:
            times = [pm.iteration_time(model, gpu, placement, b) for b in (1, 2, 16, 64, 256, 4096)]
            assert all(a < b for a, b in zip(times, times[1:])), (model, gpu, placement, times)


def test_accumulation(pm: PerfModel) -> None:
    for model, gpu in multi_profiles(pm):
        p = pm.profile(model, gpu).params
        for placement in [(1,), (4,), (4, 4)]:
            b = 64
            one = pm.iteration_time(model, gpu, placement, b, accumulation=1)
            assert pm.iteration_time(model, gpu, placement, b, accumulation=2) > one
            assert pm.iteration_time(model, gpu, placement, b, accumulation=4) > one
            # s = 1 reduces to the overlap formula (t_comp^delta + t_comm^delta)^(1/delta)
            k, nodes = sum(placement), len(placement)
            tc = p.alpha_comp + p.beta_comp * b
            if k == 1:
                tm = 0.0
            elif nodes == 1:
                tm = p.alpha_local + p.beta_local * (k - 2)
            else:
                tm = p.alpha_inter + p.beta_inter * (k - 2)
            expected = (tc**p.delta + tm**p.delta) ** (1 / p.delta)
            assert one == pytest.approx(expected, rel=1e-9)
            # s = 4: three compute-only micro-steps, then one overlapped with the all-reduce
            tc4 = comp_time(p, b / 4)
            four = 3 * tc4 + (tc4**p.delta + tm**p.delta) ** (1 / p.delta)
            assert pm.iteration_time(model, gpu, placement, b, accumulation=4) == pytest.approx(four, rel=1e-9)


def test_more_nodes_not_faster(pm: PerfModel) -> None:
    for model, gpu in multi_profiles(pm):
        for b in (16, 128):
            t8 = pm.iteration_time(model, gpu, (8,), b)
            t44 = pm.iteration_time(model, gpu, (4, 4), b)
            t2222 = pm.iteration_time(model, gpu, (2, 2, 2, 2), b)
            t1s = pm.iteration_time(model, gpu, (1,) * 8, b)
            assert t8 <= t44 <= t2222 <= t1s, (model, gpu, b)
            assert pm.iteration_time(model, gpu, (1,), b) <= pm.iteration_time(model, gpu, (2,), b)


def test_large_gpu_counts_extrapolate(pm: PerfModel) -> None:
    for model, gpu in multi_profiles(pm):
        for placement in (ideal_placement(128, 8), (1,) * 128, ideal_placement(16, 8), ideal_placement(40, 4)):
            t = pm.iteration_time(model, gpu, placement, 32, accumulation=2)
            assert t > 0 and math.isfinite(t)
            assert t >= pm.iteration_time(model, gpu, (1,), 32, accumulation=2)


def test_invalid_arguments(pm: PerfModel) -> None:
    with pytest.raises(ValueError):
        pm.iteration_time("resnet50", "v100", (), 32)
    with pytest.raises(ValueError):
        pm.iteration_time("resnet50", "v100", (1,), 0)
    with pytest.raises(ValueError):
        pm.iteration_time("resnet50", "v100", (1,), 32, accumulation=0)


# -- fitted values against the raw measurements ----------------------------------------------------------


def _gavel_isolated(data: Path, gpu: str, job_type: str, sf: int) -> float:
    with (data / "throughputs/gavel/simulation_throughputs_flat.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            if (row["worker_type"], row["job_type"], row["scale_factor"], row["colocated_with"]) == (
                gpu, job_type, str(sf), ""
            ):
                return float(row["throughput"])
    raise LookupError(job_type)


def _pollux_step_time(data: Path, model: str, placement: str, local_bsz: int) -> float:
    with (data / "throughputs/pollux" / model / "placements.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            if row["placement"] == placement and int(row["local_bsz"]) == local_bsz:
                return float(row["step_time"])
    raise LookupError((model, placement, local_bsz))


@pytest.mark.parametrize(
    ("gpu", "job_type", "model", "batch", "sf", "tol"),
    [
        ("v100", "ResNet-50 (batch size 64)", "resnet50", 64, 1, SINGLE_GPU_TOL),
        ("p100", "Transformer (batch size 64)", "transformer", 64, 1, SINGLE_GPU_TOL),
        ("k80", "LM (batch size 20)", "lm", 20, 1, SINGLE_GPU_TOL),
        ("p100", "ResNet-50 (batch size 32)", "resnet50", 32, 4, MULTI_GPU_TOL),
        ("k80", "Transformer (batch size 64)", "transformer", 64, 8, MULTI_GPU_TOL),
    ],
)
def test_fit_matches_gavel(pm: PerfModel, raw_data: Path, gpu: str, job_type: str, model: str, batch: int, sf: int, tol: float) -> None:
    measured = sf / _gavel_isolated(raw_data, gpu, job_type, sf)  # aggregate steps/s -> seconds per global step
    assert pm.iteration_time(model, gpu, (sf,), batch) == pytest.approx(measured, rel=tol)


@pytest.mark.parametrize(
    ("model", "placement", "bsz", "tol"),
    [
        ("cifar10", "1", 64, SINGLE_GPU_TOL),
        ("imagenet", "1", 81, SINGLE_GPU_TOL),
        ("imagenet", "44", 81, MULTI_GPU_TOL),
        ("bert", "4", 8, MULTI_GPU_TOL),
        ("yolov3", "2222", 8, MULTI_GPU_TOL),
    ],
)
def test_fit_matches_pollux(pm: PerfModel, raw_data: Path, model: str, placement: str, bsz: int, tol: float) -> None:
    measured = _pollux_step_time(raw_data, model, placement, bsz)
    fitted = pm.iteration_time(model, "t4", tuple(int(c) for c in placement), bsz)
    assert fitted == pytest.approx(measured, rel=tol)


# -- colocation ------------------------------------------------------------------------------------------


def test_colocation_from_flat_csv(pm: PerfModel, raw_data: Path) -> None:
    with (raw_data / "throughputs/gavel/simulation_throughputs_flat.csv").open(newline="") as f:
        rows = {
            (r["worker_type"], r["job_type"], r["colocated_with"]): r
            for r in csv.DictReader(f)
            if r["scale_factor"] == "1" and r["colocated_scale_factor"] in ("1", "")
        }
    r = rows[("v100", "ResNet-50 (batch size 64)", "Transformer (batch size 32)")]
    xi_a = float(r["isolated_throughput"]) / float(r["throughput"])
    xi_b = float(r["colocated_isolated_throughput"]) / float(r["colocated_throughput"])
    got = pm.colocation("resnet50", 64, "transformer", 32, "v100")
    assert got is not None
    assert got == pytest.approx((xi_a, xi_b), rel=1e-5)
    assert pm.colocation("transformer", 32, "resnet50", 64, "v100") == pytest.approx((xi_b, xi_a), rel=1e-5)
    # [0, 0] in the source: infeasible
    r0 = rows[("v100", "ResNet-50 (batch size 64)", "ResNet-50 (batch size 128)")]
    assert float(r0["throughput"]) == 0.0
    assert pm.colocation("resnet50", 64, "resnet50", 128, "v100") is None
    # not measured: a batch size nobody profiled, and a GPU type without colocation data
    assert pm.colocation("resnet50", 48, "transformer", 32, "v100") is None
    assert pm.colocation("cifar10", 32, "imagenet", 20, "t4") is None


# -- errors ----------------------------------------------------------------------------------------------


def test_unknown_profile(pm: PerfModel) -> None:
    with pytest.raises(UnknownProfile) as e:
        pm.iteration_time("gpt5", "v100", (1,), 8)
    assert isinstance(e.value, KeyError)
    msg = str(e.value)
    assert "gpt5" in msg and "resnet50" in msg and "\n" not in msg
    with pytest.raises(UnknownProfile, match="a100.*k80, p100, t4, v100"):
        pm.models("a100")
    with pytest.raises(UnknownProfile, match="a100"):
        pm.gpu_memory_mb("a100")
    with pytest.raises(UnknownProfile, match="bert"):
        pm.profiled_batches("bert", "v100")  # a T4-only model
    with pytest.raises(UnknownProfile, match="one GPU"):
        pm.iteration_time("a3c", "v100", (2,), 1)  # only single-GPU measurements exist
    with pytest.raises(UnknownProfile):
        pm.load_time("gpt5")
    with pytest.raises(UnknownProfile):
        pm.colocation("gpt5", 1, "resnet50", 64, "v100")


# -- regeneration ----------------------------------------------------------------------------------------


def test_fit_is_deterministic_and_matches_shipped_profiles(tmp_path: Path, raw_data: Path) -> None:
    from meshsched.cli.fit import fit_profiles

    report = fit_profiles(raw_data, tmp_path)
    assert "| v100 | resnet50 |" in report
    generated = sorted(p.name for p in tmp_path.iterdir())
    shipped = {e.name for e in PROFILES.iterdir()}
    assert set(generated) <= shipped
    for name in generated:
        assert (tmp_path / name).read_text() == (PROFILES / name).read_text(), name
    json.loads((tmp_path / "iteration_t4.json").read_text())
