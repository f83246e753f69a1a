"""Regenerate meshsched/profiles/*.json from the raw data: least-squares fits of the iteration-time model.

    python -m meshsched.cli.fit --data /work/shared/data --out profiles

Per (model, GPU type) the parameters of Castor eq. 1-3 (see itermodel.py) are fitted by bounded least
squares on log(predicted / measured) (i.e. relative error) with a soft-L1 loss, so the noisy Gavel
multi-GPU points cannot drag the fit; the super-linear Gavel points are excluded beforehand (see
measurements.py). Bounds follow Pollux: all terms >= 0, inter-node alpha/beta >= local ones, 1 <= delta <= 10.
Output is deterministic: fixed key order, floats rounded to 6 significant digits. This is the only module
that imports scipy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from meshsched.perf.assumptions import CHECKPOINTS, GPUS, load_seconds, pause_seconds
from meshsched.perf.itermodel import IterParams, iter_time
from meshsched.cli.measurements import MeasuredPair, Measurement, read_gavel, read_pollux
from meshsched.perf.schema import params_to_json

SIG_DIGITS = 6
BETA_FLOOR = 1e-9  # s per sample: keeps t_comp strictly increasing in the batch
ALPHA_FLOOR = 1e-3  # s per micro-step: kernel-launch/framework floor, so accumulation is never free
DELTA_BOUNDS = (1.0, 10.0)
DELTA_STARTS = (1.0, 2.0, 4.0)
ZERO_BELOW = 1e-9  # seconds: fitted terms smaller than this are optimiser residue, written as 0
LOSS_SCALE = 0.1  # soft-L1 switches from quadratic to linear at ~10 % log error


def _round(x: float) -> float:
    return float(f"{x:.{SIG_DIGITS}g}")


def _predict(x: np.ndarray, gpus: np.ndarray, nodes: np.ndarray, batch: np.ndarray) -> np.ndarray:
    ac, bc, ar, br, dan, dbn, d = x
    tc = ac + bc * batch
    tm = np.where(gpus <= 1, 0.0, np.where(nodes <= 1, ar + br * (gpus - 2), ar + dan + (br + dbn) * (gpus - 2)))
    top = np.maximum(tc, tm)
    return top * ((tc / top) ** d + (tm / top) ** d) ** (1.0 / d)


def _compute_start(single: list[Measurement]) -> tuple[float, float]:
    t = np.array([m.iter_time for m in single])
    b = np.array([float(m.per_gpu_batch) for m in single])
    if len(set(b.tolist())) < 2:  # one batch size: only the floor is fixed, the rest scales with the batch
        return ALPHA_FLOOR, float(np.median((t - ALPHA_FLOOR) / b))
    (ac, bc), *_ = np.linalg.lstsq(np.stack([1.0 / t, b / t], axis=1), np.ones_like(t), rcond=None)
    bc = float(bc) if bc > BETA_FLOOR else float(np.median(t / b)) * 0.5
    return max(float(ac), ALPHA_FLOOR), bc


def fit_model(points: Sequence[Measurement]) -> IterParams:
    """Fit IterParams to the (non-excluded) measurements of one model on one GPU type."""
    used = [m for m in points if not m.excluded]
    single = [m for m in used if m.gpus == 1]
    ac0, bc0 = _compute_start(single)
    if len({m.per_gpu_batch for m in single}) < 2 and len(single) == len(used):
        return IterParams(alpha_comp=ac0, beta_comp=max(bc0, BETA_FLOOR))
    gpus = np.array([m.gpus for m in used], dtype=float)
    nodes = np.array([len(m.placement) for m in used], dtype=float)
    batch = np.array([m.per_gpu_batch for m in used], dtype=float)
    log_t = np.log(np.array([m.iter_time for m in used]))
    multi = bool((gpus > 1).any())
    # single-GPU points pin t_comp for every placement; weight them as much as all multi-GPU points together
    n_single = int((gpus == 1).sum())
    weight = np.where(gpus == 1, np.sqrt(max(1.0, (len(used) - n_single) / max(n_single, 1))), 1.0)

    def excess(mask: np.ndarray) -> float:
        if not mask.any():
            return 0.0
        return float(np.median(np.maximum(np.exp(log_t[mask]) - (ac0 + bc0 * batch[mask]), 0.05 * np.exp(log_t[mask]))))

    ar0 = excess((gpus > 1) & (nodes == 1))
    dan0 = max(excess((gpus > 1) & (nodes > 1)) - ar0, 0.0)
    lower = [ALPHA_FLOOR, BETA_FLOOR, 0.0, 0.0, 0.0, 0.0, DELTA_BOUNDS[0]]
    upper = [np.inf, np.inf, np.inf, np.inf, np.inf, np.inf, DELTA_BOUNDS[1]]
    free = slice(0, 7) if multi else slice(0, 2)
    best: tuple[float, np.ndarray] | None = None
    for d0 in DELTA_STARTS if multi else (1.0,):
        x0 = np.array([ac0, max(bc0, 2 * BETA_FLOOR), ar0, 0.0, dan0, 0.0, d0])

        def residual(free_x: np.ndarray, x0: np.ndarray = x0) -> np.ndarray:
            x = x0.copy()
            x[free] = free_x
            return weight * (np.log(_predict(x, gpus, nodes, batch)) - log_t)

        res = least_squares(
            residual, x0[free], bounds=(lower[free], upper[free]), loss="soft_l1",
            f_scale=LOSS_SCALE, x_scale="jac", method="trf", max_nfev=5000,
        )
        x = x0.copy()
        x[free] = res.x
        if best is None or res.cost < best[0] - 1e-12:
            best = (float(res.cost), x)
    assert best is not None
    ac, bc, ar, br, dan, dbn, d = (float(v) for v in best[1])
    if not multi:
        return IterParams(alpha_comp=ac, beta_comp=max(bc, BETA_FLOOR))
    return IterParams(ac, max(bc, BETA_FLOOR), ar, br, ar + dan, br + dbn, d)


def _rounded(p: IterParams) -> IterParams:
    """Round to SIG_DIGITS; terms the optimiser left at ~0 (below ZERO_BELOW seconds) become exactly 0."""
    fields = params_to_json(p)
    return IterParams(
        **{
            k: _round(v) if k in ("beta_comp", "delta") or v >= ZERO_BELOW else 0.0
            for k, v in fields.items()
            if v is not None
        }
    )


def _rel_errors(p: IterParams, points: Sequence[Measurement]) -> list[float]:
    return [
        abs(iter_time(p, m.gpus, len(m.placement), m.per_gpu_batch) / m.iter_time - 1.0)
        for m in points
        if not m.excluded
    ]


def _model_entry(p: IterParams, points: Sequence[Measurement]) -> dict[str, Any]:
    errs = _rel_errors(p, points)
    used = [m for m in points if not m.excluded]
    return {
        "fit": {
            "excluded": sum(m.excluded for m in points),
            "max_rel_err": _round(max(errs)),
            "median_rel_err": _round(statistics.median(errs)),
            "p90_rel_err": _round(float(np.percentile(errs, 90))),
            "points": len(used),
        },
        "max_gpus_measured": max(m.gpus for m in used),
        "params": params_to_json(p),
        "profiled_batches": sorted({m.per_gpu_batch for m in used if m.gpus == 1} or {m.per_gpu_batch for m in used}),
    }


def _source(gpu: str) -> str:
    if gpu == "t4":
        return "pollux/<model>/placements.csv + scalability.csv (Apache-2.0); see README.md"
    return "gavel/simulation_throughputs.json (MIT); see README.md"


def _encode(obj: Any, level: int = 0) -> str:
    """Stable JSON: sorted keys, one key per line, flat lists on one line, lists of rows one row per line."""
    pad, inner = " " * level, " " * (level + 1)
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = (f"{inner}{json.dumps(k)}: {_encode(obj[k], level + 1)}" for k in sorted(obj))
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and obj and all(isinstance(r, list) for r in obj):
        rows = (inner + json.dumps(r, separators=(", ", ": ")) for r in obj)
        return "[\n" + ",\n".join(rows) + "\n" + pad + "]"
    return json.dumps(obj, separators=(", ", ": "))


def _dump(path: Path, doc: Any) -> None:
    path.write_text(_encode(doc) + "\n", encoding="utf-8")


def _measurement_rows(points: Sequence[Measurement]) -> list[list[Any]]:
    rows = sorted(points, key=lambda m: (m.gpus, len(m.placement), m.placement, m.per_gpu_batch, m.iter_time))
    return [[list(m.placement), m.per_gpu_batch, _round(m.iter_time), m.excluded] for m in rows]


def _pair_rows(pairs: Sequence[MeasuredPair]) -> list[list[Any]]:
    rows = sorted(pairs, key=lambda c: (c.model_a, c.batch_a, c.model_b, c.batch_b))
    return [
        [c.model_a, c.batch_a, c.model_b, c.batch_b, *((None, None) if c.xi is None else map(_round, c.xi))]
        for c in rows
    ]


def _report(table: list[tuple[str, str, dict[str, Any]]], pairs: Sequence[MeasuredPair]) -> str:
    lines = [
        "| gpu | model | points | excluded | max GPUs | median rel. err | p90 rel. err | max rel. err | delta |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for gpu, model, e in table:
        f, p = e["fit"], e["params"]
        delta = f"{p['delta']:.3g}" if p["alpha_local"] is not None else "-"
        lines.append(
            f"| {gpu} | {model} | {f['points']} | {f['excluded']} | {e['max_gpus_measured']} "
            f"| {f['median_rel_err']:.1%} | {f['p90_rel_err']:.1%} | {f['max_rel_err']:.1%} | {delta} |"
        )
    by_gpu: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for c in pairs:
        by_gpu[c.gpu_type][0 if c.xi is not None else 1] += 1
    lines.append("")
    lines += [f"colocation {g}: {n[0]} feasible ordered pairs, {n[1]} infeasible" for g, n in sorted(by_gpu.items())]
    return "\n".join(lines) + "\n"


def fit_profiles(data_dir: Path, out_dir: Path) -> str:
    """Fit every (model, GPU type), write all profile JSON files into out_dir, return a readable report."""
    gavel, pairs = read_gavel(data_dir)
    points = gavel + read_pollux(data_dir)
    grouped: dict[str, dict[str, list[Measurement]]] = defaultdict(lambda: defaultdict(list))
    for m in points:
        grouped[m.gpu_type][m.model].append(m)
    out_dir.mkdir(parents=True, exist_ok=True)
    table: list[tuple[str, str, dict[str, Any]]] = []
    for gpu in sorted(grouped):
        models: dict[str, Any] = {}
        for model in sorted(grouped[gpu]):
            pts = grouped[gpu][model]
            models[model] = _model_entry(_rounded(fit_model(pts)), pts)
            table.append((gpu, model, models[model]))
        _dump(out_dir / f"iteration_{gpu}.json", {"gpu_type": gpu, "models": models, "source": _source(gpu)})
        _dump(
            out_dir / f"measurements_{gpu}.json",
            {
                "columns": ["placement", "per_gpu_batch", "iter_time_s", "excluded_from_fit"],
                "gpu_type": gpu,
                "models": {model: _measurement_rows(grouped[gpu][model]) for model in sorted(grouped[gpu])},
                "source": _source(gpu),
            },
        )
    for gpu in sorted({c.gpu_type for c in pairs}):
        _dump(
            out_dir / f"colocation_{gpu}.json",
            {
                "columns": ["model_a", "batch_a", "model_b", "batch_b", "xi_a", "xi_b"],
                "gpu_type": gpu,
                "pairs": _pair_rows([c for c in pairs if c.gpu_type == gpu]),
                "source": "gavel/simulation_throughputs.json, scale factor 1, xi = isolated / colocated",
            },
        )
    _dump(
        out_dir / "overheads.json",
        {
            "models": {
                c.model: {"load_s": _round(load_seconds(c)), "pause_s": _round(pause_seconds(c))}
                for c in CHECKPOINTS
            },
            "source": "derived from parameter counts and a storage bandwidth; see README.md and assumptions.py",
        },
    )
    _dump(out_dir / "gpus.json", {"gpus": {g.gpu_type: {"memory_mb": g.memory_mb, "source": g.source} for g in GPUS}})
    report = _report(table, pairs)
    (out_dir / "fit_report.md").write_text("# Fit quality (generated by meshsched.cli.fit)\n\n" + report, "utf-8")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meshsched.cli.fit", description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="the shared data folder (holds throughputs/)")
    parser.add_argument("--out", type=Path, required=True, help="folder to write the profile JSON files into")
    args = parser.parse_args(argv)
    sys.stdout.write(fit_profiles(args.data, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
