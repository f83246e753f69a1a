"""Interference ratio (IR) of two jobs sharing GPUs: xi_X = t_X(shared) / t_X(alone) (Castor eq. 14-15).

Where the answer comes from, in order:
1. the measured pair (profiles/colocation_<gpu>.json, Gavel, scale factor 1); a pair measured infeasible
   (out of memory) answers None;
2. the XGBoost IR predictor trained on the measured pairs (`mesh profiles train-ir`, profiles/ir_model.json,
   see meshsched/cli/train_ir.py), for pairs at batches or GPU types not measured;
3. DEFAULT_XI for both jobs: the documented conservative default when neither exists (2.0 = plain time
   slicing, each job gets half the GPU; with xi = 2 for both Theorem 1 never shares).

The predictor's features are each job's solo profile plus the model-family identity of both jobs (see
`pair_features`); a family outside KNOWN_FAMILIES (a user's own model, or the T4-only models) gets all-zero
identity features, which the predictor is trained to handle (see meshsched/cli/train_ir.py). Predictions are cached per
(models, batches, GPU type): a finite set, so a scheduling pass does not call XGBoost repeatedly.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from meshsched.perf.errors import UnknownProfile
from meshsched.perf.memory import job_memory_mb

DEFAULT_XI = 2.0
MIN_XI = 1.0  # sharing never speeds a job up (measured values below 1 are noise)

FEATURES_PER_JOB = ("step_time_s", "throughput", "batch", "log2_batch", "memory_mb", "compute_s_per_sample", "fixed_s")
# The model families with measured colocation pairs (Gavel). Fixed here, not read from the data, so the feature
# layout of a shipped ir_model.json never changes silently; any other model name is "unknown" (all zeros).
KNOWN_FAMILIES = ("a3c", "cyclegan", "lm", "recommendation", "resnet18", "resnet50", "transformer")
FEATURE_NAMES = (
    tuple(f"{who}_{f}" for who in ("self", "other") for f in FEATURES_PER_JOB)
    + ("gpu_memory_mb",)
    + tuple(f"{who}_is_{m}" for who in ("self", "other") for m in KNOWN_FAMILIES)
)
N_PROFILE_FEATURES = 2 * len(FEATURES_PER_JOB) + 1  # the identity one-hots follow these


def job_features(perf, model: str, batch: int, gpu_type: str) -> list[float]:
    """A job's solo profile on one GPU: step time, throughput, batch, memory, compute intensity."""
    import math

    p = perf.profile(model, gpu_type).params
    step = perf.iteration_time(model, gpu_type, (1,), batch)
    return [step, batch / step, float(batch), math.log2(batch), job_memory_mb(model, batch), p.beta_comp, p.alpha_comp]


def family_features(model: str) -> list[float]:
    """One-hot of the model family over KNOWN_FAMILIES; all zeros for a family the predictor never saw."""
    return [float(model == m) for m in KNOWN_FAMILIES]


def pair_features(perf, model_a: str, batch_a: int, model_b: str, batch_b: int, gpu_type: str) -> list[float]:
    """Features for predicting xi of job a (the 'self') next to job b; swap the arguments for xi_b."""
    return (
        job_features(perf, model_a, batch_a, gpu_type)
        + job_features(perf, model_b, batch_b, gpu_type)
        + [float(perf.gpu_memory_mb(gpu_type))]
        + family_features(model_a)
        + family_features(model_b)
    )


class Interference:
    """xi of a pair: measured, else predicted, else DEFAULT_XI. `predictor(rows) -> list[float]` or None."""

    def __init__(self, perf, predictor: Callable[[list[list[float]]], list[float]] | None = None) -> None:
        self._perf = perf
        self._measured = perf.measured_pairs()
        self._predictor = predictor
        self.xi = lru_cache(maxsize=1 << 16)(self._xi)
        self._predicted: dict[tuple, tuple[float, float]] = {}
        self._prefilled: set[str] = set()

    def prefill(self, gpu_type: str) -> None:
        """Predict every unmeasured pair of profiled models at their profiled batches and all power-of-two
        sub-batches (Algorithm 2's search space) on `gpu_type`, in one batched call."""
        if self._predictor is None or gpu_type in self._prefilled:
            return
        self._prefilled.add(gpu_type)
        try:
            models = self._perf.models(gpu_type)
        except UnknownProfile:
            return
        combos = sorted({(m, b) for m in models for top in self._perf.profiled_batches(m, gpu_type) for b in _halvings(top)})
        keys, rows = [], []
        for ma, ba in combos:
            for mb, bb in combos:
                if self._is_measured(ma, ba, mb, bb, gpu_type):
                    continue
                keys.append((ma, ba, mb, bb, gpu_type))
                rows.append(pair_features(self._perf, ma, ba, mb, bb, gpu_type))
        if not rows:
            return
        preds = self._predictor(rows)
        by_key = dict(zip(keys, preds))
        for (ma, ba, mb, bb, g), xa in by_key.items():
            self._predicted[(ma, ba, mb, bb, g)] = (max(MIN_XI, float(xa)), max(MIN_XI, float(by_key[(mb, bb, ma, ba, g)])))

    @property
    def has_predictor(self) -> bool:
        return self._predictor is not None

    def source(self, model_a: str, batch_a: int, model_b: str, batch_b: int, gpu_type: str) -> str:
        try:
            measured = self._perf.colocation(model_a, batch_a, model_b, batch_b, gpu_type)
        except UnknownProfile:
            measured = None
        if measured is not None or self._is_measured(model_a, batch_a, model_b, batch_b, gpu_type):
            return "measured"
        return "predicted" if self._predictor is not None else "default"

    def _is_measured(self, model_a: str, batch_a: int, model_b: str, batch_b: int, gpu_type: str) -> bool:
        return (gpu_type, model_a, batch_a, model_b, batch_b) in self._measured

    def _xi(self, model_a: str, batch_a: int, model_b: str, batch_b: int, gpu_type: str) -> tuple[float, float] | None:
        if self._is_measured(model_a, batch_a, model_b, batch_b, gpu_type):
            m = self._perf.colocation(model_a, batch_a, model_b, batch_b, gpu_type)
            return None if m is None else (max(MIN_XI, m[0]), max(MIN_XI, m[1]))
        if self._predictor is not None:
            hit = self._predicted.get((model_a, batch_a, model_b, batch_b, gpu_type))
            if hit is not None:
                return hit
            try:
                rows = [
                    pair_features(self._perf, model_a, batch_a, model_b, batch_b, gpu_type),
                    pair_features(self._perf, model_b, batch_b, model_a, batch_a, gpu_type),
                ]
            except (UnknownProfile, ValueError):
                return (DEFAULT_XI, DEFAULT_XI)
            xa, xb = self._predictor(rows)
            return (max(MIN_XI, float(xa)), max(MIN_XI, float(xb)))
        return (DEFAULT_XI, DEFAULT_XI)


def _halvings(b: int) -> list[int]:
    out = [b]
    while b > 1:
        b //= 2
        out.append(b)
    return out
