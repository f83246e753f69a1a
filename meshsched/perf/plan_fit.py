"""Fitting the seven plan-model parameters (Rubick Sec. 4.3) to measured iteration times, and choosing which
measurements to fit on. Pure: takes rows, returns parameters (scipy is imported here only).

The fit is bounded least squares on log(predicted / measured) (relative error), from several starts, the best
kept. At least seven rows are needed (the paper: "at least seven throughput values").
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from meshsched.perf.plans import (
    PARAM_NAMES,
    Environment,
    ModelSpec,
    PlanMeasurement,
    PlanParams,
    PlanProfile,
    iteration_terms,
)

MIN_POINTS = len(PARAM_NAMES)

# (lower, upper) per parameter, in PARAM_NAMES order. k_bwd: backward is 1-4x forward; the overlap exponents
# run from 1 (serial) to 20 (as good as max()); the rest are non-negative rates/constants.
BOUNDS: tuple[tuple[float, float], ...] = (
    (1e-6, 10.0),  # k_fwd
    (1.0, 4.0),  # k_bwd
    (1.0, 20.0),  # k_sync
    (0.0, 10.0),  # k_opt
    (0.0, 1000.0),  # k_opt_off
    (1.0, 20.0),  # k_off
    (0.0, 10.0),  # k_const
)
STARTS: tuple[tuple[float, ...], ...] = (
    (0.02, 2.0, 2.0, 0.05, 20.0, 2.0, 0.02),
    (0.005, 1.5, 1.2, 0.01, 5.0, 1.2, 0.1),
    (0.05, 3.0, 8.0, 0.2, 80.0, 8.0, 0.005),
)


def fit_plan_params(spec: ModelSpec, env: Environment, rows: Sequence[PlanMeasurement],
                    measured_fwd: bool = False) -> PlanParams:
    """Least-squares fit of the seven parameters to `rows` (>= 7) of one model type. `measured_fwd`: every row's
    T_fwd is its measured `fwd_s` (the artifact's protocol) and k_fwd is not fitted (returned as its start)."""
    from scipy.optimize import least_squares

    if len(rows) < MIN_POINTS:
        raise ValueError(f"fitting {spec.name} needs at least {MIN_POINTS} measurements, got {len(rows)}")
    if measured_fwd and any(r.fwd_s is None for r in rows):
        raise ValueError(f"fitting {spec.name} with measured forward times: a row has none")
    log_measured = [math.log(r.iter_time_s) for r in rows]
    free = list(range(1 if measured_fwd else 0, len(PARAM_NAMES)))  # k_fwd is index 0

    def params(x: Sequence[float], x0: Sequence[float]) -> PlanParams:
        full = list(x0)
        for i, v in zip(free, x):
            full[i] = float(v)
        return PlanParams(*full)

    lower, upper = zip(*BOUNDS)
    best, best_x0 = None, None
    for x0 in STARTS:
        start = [min(max(v, lo), hi) for v, lo, hi in zip(x0, lower, upper)]

        def residuals(x: Sequence[float], start=start) -> list[float]:
            prof = PlanProfile(spec, params(x, start))
            return [math.log(iteration_terms(prof, r.plan, r.resources, env, r.fwd_s if measured_fwd else None).total)
                    - lm for r, lm in zip(rows, log_measured)]

        res = least_squares(residuals, [start[i] for i in free], bounds=([lower[i] for i in free],
                            [upper[i] for i in free]), x_scale="jac", method="trf")
        if best is None or res.cost < best.cost:
            best, best_x0 = res, start
    assert best is not None and best_x0 is not None
    return params(best.x, best_x0)


def sample_fit_rows(rows: Sequence[PlanMeasurement], n: int, seed: int) -> list[int]:
    """Indices of `n` rows to fit on, seeded: plan families in turn, ZeRO-Offload first (so that every term is
    seen, as the paper samples "different resource allocations and execution plans"), and within a family a
    random row whose GPU count that family has not had yet while there is one (so that its scaling is seen)."""
    if n > len(rows):
        raise ValueError(f"asked for {n} fit points but only {len(rows)} measurements exist")
    rng = random.Random(seed)
    by_family: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_family.setdefault(r.family, []).append(i)
    families = sorted(by_family)
    rng.shuffle(families)
    # offload families first: only they see k_opt_off and k_off, which two GPU counts are needed to separate
    families.sort(key=lambda f: not f.startswith("ZeRO-Offload"))
    chosen: list[int] = []
    seen_gpus: dict[str, set[int]] = {f: set() for f in families}
    turn = 0
    while len(chosen) < n:
        fam = families[turn % len(families)]
        turn += 1
        left = [i for i in by_family[fam] if i not in chosen]
        if not left:
            continue
        fresh = [i for i in left if rows[i].resources.gpus not in seen_gpus[fam]]
        pick = rng.choice(fresh or left)
        chosen.append(pick)
        seen_gpus[fam].add(rows[pick].resources.gpus)
    return sorted(chosen)


def relative_error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured
