"""Loading the profiles shipped in the meshsched.profiles package (package-relative, cached once)."""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

from meshsched.perf.errors import UnknownProfile
from meshsched.perf.interference import FEATURE_NAMES, Interference
from meshsched.perf.model import PerfModel
from meshsched.perf.mps_share import MpsShareModel, anchors_from_measurements, fit_mps_share
from meshsched.perf.plans import PlanCatalog, PlanPerfModel, catalog_from_json
from meshsched.perf.schema import colocation_from_json, model_profiles_from_json, overheads_from_json
from meshsched.policies.stack import PolicyHandle


def _read(entry: Traversable) -> Any:
    return json.loads(entry.read_text(encoding="utf-8"))


# Load/pause regimes (Lazer's l and p), by name: the file in profiles/ that holds each (see profiles/README.md).
OVERHEAD_REGIMES = {
    "measured": "overheads.json",  # derived from our models' checkpoint sizes: loads 20-30 s, pauses 5-15 s
    "lazer": "overheads_lazer.json",  # scaled to Lazer's figures (section 3.2): loads ~2 min, pauses ~8 s
}


def perf_model_from(root: Traversable, overheads: str = "measured") -> PerfModel:
    """Build a PerfModel from a folder of profile files (the package folder, or a freshly fitted one), with the
    load/pause regime `overheads` (a key of OVERHEAD_REGIMES)."""
    entries = sorted((e for e in root.iterdir() if e.name.endswith(".json")), key=lambda e: e.name)
    profiles, pairs = [], []
    for e in entries:
        if e.name.startswith("iteration_"):
            profiles.extend(model_profiles_from_json(_read(e)))
        elif e.name.startswith("colocation_"):
            doc = _read(e)
            pairs.extend((doc["gpu_type"], p) for p in colocation_from_json(doc))
    memory = {gpu: int(v["memory_mb"]) for gpu, v in _read(root / "gpus.json")["gpus"].items()}
    return PerfModel(profiles, pairs, overheads_from_json(_read(root / _regime_file(overheads))), memory)


def _regime_file(name: str) -> str:
    file = OVERHEAD_REGIMES.get(name)
    if file is None:
        raise UnknownProfile(f"unknown overhead regime {name!r}", OVERHEAD_REGIMES)
    return file


@cache
def load_perf_model(overheads: str = "measured") -> PerfModel:
    """The PerfModel of the profiles installed with meshsched (read once per process and regime), with the
    load/pause regime `overheads`: "measured" (profiles/overheads.json) or "lazer" (overheads_lazer.json)."""
    return perf_model_from(files("meshsched.profiles"), overheads)


IR_MODEL_FILE = "ir_model.json"


def ir_predictor_from(root: Traversable):
    """The XGBoost IR predictor written by `mesh profiles train-ir`, as `rows -> list[float]`; None if absent,
    if xgboost is not installed or if the file's feature count differs from FEATURE_NAMES (then unmeasured pairs
    get the conservative default)."""
    entry = root / IR_MODEL_FILE
    if not entry.is_file():
        return None
    try:
        import numpy as np
        import xgboost as xgb
    except ImportError:
        return None
    booster = xgb.Booster()
    booster.load_model(bytearray(entry.read_bytes()))
    booster.set_param({"nthread": 1})  # small batches: thread start-up would dominate
    if booster.num_features() != len(FEATURE_NAMES):
        return None  # trained with another feature layout (stale file): retrain with `mesh profiles train-ir`

    log_target = booster.attr("target") == "log_xi"

    def predict(rows: list[list[float]]) -> list[float]:
        out = booster.inplace_predict(np.asarray(rows, dtype=np.float32))
        return [float(v) for v in (np.exp(out) if log_target else out)]

    return predict


@cache
def load_interference() -> Interference:
    """Interference ratios for the installed profiles: measured pairs, else the trained predictor, else default."""
    return Interference(load_perf_model(), ir_predictor_from(files("meshsched.profiles")))




MEASURED_H100_FILE = "measured_h100.json"


@cache
def load_mps_share() -> MpsShareModel:
    """The MPS-share model (perf/mps_share.py) fitted to the H100 MPS 100%/50% measurements in measured_h100.json."""
    return fit_mps_share(*anchors_from_measurements(_read(files("meshsched.profiles") / MEASURED_H100_FILE)))


@cache
def load_plan_catalog(gpu_type: str = "a800") -> PlanCatalog:
    """Execution-plan profiles (Rubick): fitted plan-model parameters and measured plans, from plans_<gpu>.json."""
    root = files("meshsched.profiles")
    entry = root / f"plans_{gpu_type}.json"
    if not entry.is_file():
        known = [e.name[len("plans_") : -len(".json")] for e in root.iterdir() if e.name.startswith("plans_")]
        raise UnknownProfile(f"no plan profiles for GPU type {gpu_type!r}", known)
    return catalog_from_json(_read(entry))


class InstalledProfiles:
    """The profiles installed with meshsched as the registry's `Profiles` provider (policies.stack.Profiles):
    each model read once per process, when a policy needing it is built."""

    def perf(self) -> PerfModel:
        return load_perf_model()

    def interference(self) -> Interference:
        return load_interference()

    def mps_share(self) -> MpsShareModel:
        return load_mps_share()

    def plan_catalog(self, gpu_type: str = "a800") -> PlanCatalog:
        return load_plan_catalog(gpu_type)


INSTALLED = InstalledProfiles()


def installed_handle(seed: int = 1, interference: bool = True, one_user_per_gpu: bool = False,
                     perf: PerfModel | PlanPerfModel | None = None) -> PolicyHandle:
    """The handle meshd, `mesh simulate` and tests build policies with: `perf` (default: the installed model),
    the interference predictor unless `interference` is False (XGBoost is slow to import; a sharing policy
    still gets it from the profiles), and the installed profiles for every other model a policy asks for."""
    return PolicyHandle(load_perf_model() if perf is None else perf, load_interference() if interference else None,
                        seed, one_user_per_gpu=one_user_per_gpu, profiles=INSTALLED)
