"""Typed, frozen contents of the profile files in meshsched/profiles/ and their JSON decoding.

Files (all carry their GPU type explicitly):
  gpus.json                 memory per GPU type
  iteration_<gpu>.json      fitted IterParams per model, measured per-GPU batches, fit quality
  colocation_<gpu>.json     measured interference pairs (xi = isolated / colocated throughput)
  overheads.json            load time l and pause time p per model (derived, see README.md)
  measurements_<gpu>.json   the converted measurements the fit used (not read at run time)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshsched.perf.itermodel import IterParams

PARAM_FIELDS = ("alpha_comp", "beta_comp", "alpha_local", "beta_local", "alpha_inter", "beta_inter", "delta")


@dataclass(frozen=True, slots=True)
class FitQuality:
    points: int
    excluded: int
    median_rel_err: float
    p90_rel_err: float
    max_rel_err: float


@dataclass(frozen=True, slots=True)
class ModelProfile:
    model: str
    gpu_type: str
    params: IterParams
    profiled_batches: tuple[int, ...]
    max_gpus_measured: int
    quality: FitQuality


@dataclass(frozen=True, slots=True)
class ColocationPair:
    model_a: str
    batch_a: int
    model_b: str
    batch_b: int
    xi: tuple[float, float] | None  # None: measured as infeasible ([0, 0] in the source)


@dataclass(frozen=True, slots=True)
class Overhead:
    model: str
    load_s: float
    pause_s: float


def params_to_json(p: IterParams) -> dict[str, float | None]:
    return {name: getattr(p, name) for name in PARAM_FIELDS}


def params_from_json(d: dict[str, Any]) -> IterParams:
    return IterParams(**{name: d.get(name) for name in PARAM_FIELDS if d.get(name) is not None})


def model_profiles_from_json(doc: dict[str, Any]) -> tuple[ModelProfile, ...]:
    gpu = doc["gpu_type"]
    out = []
    for name, m in doc["models"].items():
        q = m["fit"]
        out.append(
            ModelProfile(
                model=name,
                gpu_type=gpu,
                params=params_from_json(m["params"]),
                profiled_batches=tuple(m["profiled_batches"]),
                max_gpus_measured=int(m["max_gpus_measured"]),
                quality=FitQuality(
                    q["points"], q["excluded"], q["median_rel_err"], q["p90_rel_err"], q["max_rel_err"]
                ),
            )
        )
    return tuple(out)


def colocation_from_json(doc: dict[str, Any]) -> tuple[ColocationPair, ...]:
    return tuple(
        ColocationPair(a, int(ba), b, int(bb), None if xa is None else (float(xa), float(xb)))
        for a, ba, b, bb, xa, xb in doc["pairs"]
    )


def overheads_from_json(doc: dict[str, Any]) -> tuple[Overhead, ...]:
    return tuple(Overhead(name, float(v["load_s"]), float(v["pause_s"])) for name, v in doc["models"].items())
