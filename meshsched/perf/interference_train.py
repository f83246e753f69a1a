"""Train the XGBoost interference-ratio (IR) predictor on the measured colocation pairs.

    mesh profiles train-ir            (writes profiles/ir_model.json and profiles/ir_report.json)

Samples: every feasible measured ordered pair (model_a, batch_a, model_b, batch_b) on every GPU type with
colocation data gives one row, features `interference.pair_features(a, b)` (both jobs' solo profiles) and
target log(xi_a) (xi is a ratio: errors are relative, and the few xi of 4-11 do not dominate the fit);
the reverse order, measured too, gives xi_b. Split: by unordered pair {(model, batch),
(model, batch)}, 80 % train / 20 % test with a fixed seed, so a pair (in both orders, on every GPU type) is
never on both sides. The report gives the test RMSE of xi for the first and the second job of each test
pair (Castor reports 0.06 and 0.07) and the features' gain importances. The shipped model is then refit on
all pairs with the same hyper-parameters. Deterministic (fixed seeds, one thread).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from meshsched.perf.interference import FEATURE_NAMES, pair_features

SEED = 0
TEST_FRACTION = 0.2
ROUNDS = 400
PARAMS = dict(
    objective="reg:squarederror", max_depth=5, eta=0.05, subsample=0.8, colsample_bytree=0.8,
    min_child_weight=2, seed=SEED, nthread=1, tree_method="hist",
)  # fmt: skip


def measured_rows(perf) -> list[tuple[tuple, list[float], float, str]]:
    """(unordered pair key, features, xi of the ordered pair's first job, gpu, that job) for every feasible measured ordered pair."""
    rows = []
    for (gpu, ma, ba, mb, bb), xi in sorted(perf._pairs.items()):  # noqa: SLF001 - the measured table itself
        if xi is None:
            continue
        key = tuple(sorted([(ma, ba), (mb, bb)]))
        rows.append((key, pair_features(perf, ma, ba, mb, bb, gpu), float(xi[0]), gpu, (ma, ba)))
    return rows


def _fit(x: np.ndarray, y: np.ndarray):
    import xgboost as xgb

    booster = xgb.train(PARAMS, xgb.DMatrix(x, label=np.log(y), feature_names=list(FEATURE_NAMES)), num_boost_round=ROUNDS)
    booster.set_attr(target="log_xi")  # the loader exponentiates
    return booster


def train_ir(perf, out_dir: Path) -> dict:
    rows = measured_rows(perf)
    keys = sorted({r[0] for r in rows})
    rng = random.Random(SEED)
    rng.shuffle(keys)
    test_keys = set(keys[: round(len(keys) * TEST_FRACTION)])
    tr = [r for r in rows if r[0] not in test_keys]
    te = [r for r in rows if r[0] in test_keys]
    model = _fit(np.array([r[1] for r in tr]), np.array([r[2] for r in tr]))
    pred = np.exp(model.inplace_predict(np.array([r[1] for r in te], dtype=np.float32)))
    # "first job" of a test pair: the lexicographically smaller (model, batch); the second: the other one
    first = np.array([r[4] == r[0][0] for r in te], dtype=bool)
    y = np.array([r[2] for r in te])
    err = pred - y

    def rmse(mask: np.ndarray) -> float:
        return float(np.sqrt(np.mean(err[mask] ** 2))) if mask.any() else float("nan")

    full = _fit(np.array([r[1] for r in rows]), np.array([r[2] for r in rows]))
    gain = full.get_score(importance_type="gain")
    total = sum(gain.values()) or 1.0
    importances = {k: round(v / total, 4) for k, v in gain.items()}
    report = {
        "samples": len(rows),
        "pairs": len(keys),
        "train_pairs": len(keys) - len(test_keys),
        "test_pairs": len(test_keys),
        "test_rows": len(te),
        "rmse_job_a": round(rmse(first), 4),
        "rmse_job_b": round(rmse(~first), 4),
        "rmse_all": round(rmse(np.ones_like(first)), 4),
        "mean_abs_err": round(float(np.mean(np.abs(err))), 4),
        "median_abs_err": round(float(np.median(np.abs(err))), 4),
        "median_rel_err": round(float(np.median(np.abs(err) / y)), 4),
        "xi_test_mean": round(float(y.mean()), 4),
        "baseline_rmse_predict_train_mean": round(float(np.sqrt(np.mean((y - np.mean([r[2] for r in tr])) ** 2))), 4),
        "feature_importance_gain": dict(sorted(importances.items(), key=lambda kv: -kv[1])),
        "params": dict(PARAMS, rounds=ROUNDS),
        "features": list(FEATURE_NAMES),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    full.save_model(str(out_dir / "ir_model.json"))
    (out_dir / "ir_report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report

