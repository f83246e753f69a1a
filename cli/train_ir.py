"""Train the XGBoost interference-ratio (IR) predictor on the measured colocation pairs.

    mesh profiles train-ir            (writes profiles/ir_model.json and profiles/ir_report.json)

Samples: every feasible measured ordered pair (model_a, batch_a, model_b, batch_b) on every GPU type with
colocation data gives one row, features `interference.pair_features(a, b)` (both jobs' solo profiles, the GPU's
memory and a one-hot of both jobs' model family) and target log(xi_a) (xi is a ratio: errors are relative, and
the few xi of 4-11 do not dominate the fit); the reverse order, measured too, gives xi_b.

Main split: by unordered pair {(model, batch), (model, batch)}, 80 % train / 20 % test with a fixed seed, so a
pair (in both orders, on every GPU type) is never on both sides. The family one-hots are legitimate there: a
test pair's model families appear in train at *other* batches (or next to other partners), which is exactly the
runtime case of predicting an unmeasured batch of a profiled model. They say nothing about an unseen model, so
the report also gives two harder splits with the same hyper-parameters:
- leave one model family out: for each family F, train on the rows involving no job of F and test on the rows
  involving F, with F's one-hot zeroed (F is "unknown", as at runtime); pooled over the families;
- by unordered model pair {model_a, model_b}: 20 % of the family pairs (every batch, order and GPU type) held out.

Unknown families: every training row is also added once more with its family one-hots zeroed (same target), so
the trees learn what to answer from the profile features alone when the family is unknown (a user's own model,
or the T4-only models): `Interference` feeds all-zero one-hots for any family outside KNOWN_FAMILIES.

Hyper-parameters (max_depth, min_child_weight, rounds) are chosen by 5-fold cross-validation grouped by
unordered pair on the TRAIN part of the main split only; the test split is never used to choose anything. The
report gives the test RMSE of xi for the first and the second job of each test pair (Castor reports 0.06 and
0.07 on its own data), the harder splits, the CV table and the features' gain importances. The shipped model is
then refit on all pairs with the chosen hyper-parameters. Deterministic (fixed seeds, one thread).
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np

from meshsched.perf.interference import FEATURE_NAMES, KNOWN_FAMILIES, N_PROFILE_FEATURES, pair_features

SEED = 0
TEST_FRACTION = 0.2
CV_FOLDS = 5
BASE_PARAMS = dict(
    objective="reg:squarederror", eta=0.05, subsample=0.8, colsample_bytree=0.8,
    seed=SEED, nthread=1, tree_method="hist",
)  # fmt: skip
# the CV grid: (max_depth, min_child_weight) x rounds (rounds are read off one fit with iteration_range)
GRID = {"max_depth": (4, 5, 6), "min_child_weight": (1, 2), "rounds": (400, 800, 1200)}


def measured_rows(perf) -> list[tuple[tuple, list[float], float, str, tuple]]:
    """(unordered pair key, features, xi of the ordered pair's first job, gpu, that job) for every feasible measured ordered pair."""
    rows = []
    for (gpu, ma, ba, mb, bb), xi in sorted(perf.measured_pairs().items()):
        if xi is None:
            continue
        key = tuple(sorted([(ma, ba), (mb, bb)]))
        rows.append((key, pair_features(perf, ma, ba, mb, bb, gpu), float(xi[0]), gpu, (ma, ba)))
    return rows


def split_test_keys(rows) -> set[tuple]:
    """The unordered (model, batch) pairs of the 20 % test split (fixed seed)."""
    keys = sorted({r[0] for r in rows})
    random.Random(SEED).shuffle(keys)
    return set(keys[: round(len(keys) * TEST_FRACTION)])


def split_test_model_pairs(rows) -> set[tuple[str, str]]:
    """The unordered model-family pairs held out by the harder split (fixed seed)."""
    pairs = sorted({_model_pair(r) for r in rows})
    random.Random(SEED).shuffle(pairs)
    return set(pairs[: round(len(pairs) * TEST_FRACTION)])


def _model_pair(row) -> tuple[str, str]:
    return tuple(sorted((row[0][0][0], row[0][1][0])))


def _zero_family(x: np.ndarray, families=None) -> np.ndarray:
    """Copy of x with the family one-hots zeroed: all of them (families=None) or those of `families`."""
    z = np.array(x, dtype=np.float64, copy=True)
    if families is None:
        z[:, N_PROFILE_FEATURES:] = 0.0
    else:
        for f in families:
            i = KNOWN_FAMILIES.index(f)
            z[:, N_PROFILE_FEATURES + i] = 0.0
            z[:, N_PROFILE_FEATURES + len(KNOWN_FAMILIES) + i] = 0.0
    return z


def _fit(x: np.ndarray, y: np.ndarray, params: dict, rounds: int):
    import xgboost as xgb

    x = np.vstack([x, _zero_family(x)])  # the same rows as "unknown family": see the module docstring
    y = np.concatenate([y, y])
    booster = xgb.train(params, xgb.DMatrix(x, label=np.log(y), feature_names=list(FEATURE_NAMES)), num_boost_round=rounds)
    booster.set_attr(target="log_xi")  # the loader exponentiates
    return booster


def _predict(booster, x: np.ndarray, rounds: int | None = None) -> np.ndarray:
    kw = {} if rounds is None else {"iteration_range": (0, rounds)}
    return np.exp(booster.inplace_predict(np.asarray(x, dtype=np.float32), **kw))


def _rmse(err: np.ndarray) -> float:
    return float(np.sqrt(np.mean(err**2))) if len(err) else float("nan")


def select_params(rows, grid: dict = GRID) -> tuple[dict, int, list[dict]]:
    """Grid search by CV_FOLDS-fold CV grouped by unordered pair, on `rows` only (the train part)."""
    keys = sorted({r[0] for r in rows})
    random.Random(SEED + 1).shuffle(keys)
    fold_of = {k: i % CV_FOLDS for i, k in enumerate(keys)}
    x = np.array([r[1] for r in rows])
    y = np.array([r[2] for r in rows])
    fold = np.array([fold_of[r[0]] for r in rows])
    table = []
    for depth, mcw in itertools.product(grid["max_depth"], grid["min_child_weight"]):
        params = dict(BASE_PARAMS, max_depth=depth, min_child_weight=mcw)
        errs: dict[int, list[np.ndarray]] = {n: [] for n in grid["rounds"]}
        for f in range(CV_FOLDS):
            booster = _fit(x[fold != f], y[fold != f], params, max(grid["rounds"]))
            for n in grid["rounds"]:
                errs[n].append(_predict(booster, x[fold == f], n) - y[fold == f])
        for n in grid["rounds"]:
            table.append({"max_depth": depth, "min_child_weight": mcw, "rounds": n, "cv_rmse": round(_rmse(np.concatenate(errs[n])), 4)})
    best = min(table, key=lambda t: (t["cv_rmse"], t["rounds"], t["max_depth"]))
    return dict(BASE_PARAMS, max_depth=best["max_depth"], min_child_weight=best["min_child_weight"]), best["rounds"], table


def _harder_splits(rows, params: dict, rounds: int) -> dict:
    x = np.array([r[1] for r in rows])
    y = np.array([r[2] for r in rows])
    out = {}
    # leave one model family out (the held-out family's one-hots zeroed: "unknown" as at runtime)
    errs, per_family = [], {}
    for fam in KNOWN_FAMILIES:
        te = np.array([fam in (r[0][0][0], r[0][1][0]) for r in rows])
        if not te.any() or te.all():
            continue
        booster = _fit(x[~te], y[~te], params, rounds)
        e = _predict(booster, _zero_family(x[te], [fam])) - y[te]
        errs.append(e)
        per_family[fam] = {"test_rows": int(te.sum()), "rmse": round(_rmse(e), 4), "median_abs_err": round(float(np.median(np.abs(e))), 4)}
    e = np.concatenate(errs)
    out["leave_one_family_out"] = {
        "rmse_all": round(_rmse(e), 4),
        "median_abs_err": round(float(np.median(np.abs(e))), 4),
        "per_family": per_family,
    }
    # by unordered model-family pair
    held = split_test_model_pairs(rows)
    te = np.array([_model_pair(r) in held for r in rows])
    booster = _fit(x[~te], y[~te], params, rounds)
    e = _predict(booster, x[te]) - y[te]
    out["by_model_pair"] = {
        "test_model_pairs": sorted("+".join(p) for p in held),
        "test_rows": int(te.sum()),
        "rmse_all": round(_rmse(e), 4),
        "median_abs_err": round(float(np.median(np.abs(e))), 4),
    }
    return out


def train_ir(perf, out_dir: Path, grid: dict = GRID) -> dict:
    rows = measured_rows(perf)
    keys = sorted({r[0] for r in rows})
    test_keys = split_test_keys(rows)
    tr = [r for r in rows if r[0] not in test_keys]
    te = [r for r in rows if r[0] in test_keys]
    params, rounds, cv_table = select_params(tr, grid)
    model = _fit(np.array([r[1] for r in tr]), np.array([r[2] for r in tr]), params, rounds)
    x_te = np.array([r[1] for r in te])
    pred = _predict(model, x_te)
    # "first job" of a test pair: the lexicographically smaller (model, batch); the second: the other one
    first = np.array([r[4] == r[0][0] for r in te], dtype=bool)
    y = np.array([r[2] for r in te])
    err = pred - y
    err_unknown = _predict(model, _zero_family(x_te)) - y  # the same test rows, both families treated as unknown

    def rmse(mask: np.ndarray) -> float:
        return _rmse(err[mask]) if mask.any() else float("nan")

    full = _fit(np.array([r[1] for r in rows]), np.array([r[2] for r in rows]), params, rounds)
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
        "test_split_family_unknown": {
            "note": "main test split, family one-hots zeroed (as for a model outside KNOWN_FAMILIES)",
            "rmse_all": round(_rmse(err_unknown), 4),
            "median_abs_err": round(float(np.median(np.abs(err_unknown))), 4),
        },
        "harder_splits": _harder_splits(rows, params, rounds),
        "feature_importance_gain": dict(sorted(importances.items(), key=lambda kv: -kv[1])),
        "params": dict(params, rounds=rounds),
        "cv": {"folds": CV_FOLDS, "on": "train part of the main split only", "grid": cv_table},
        "features": list(FEATURE_NAMES),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    full.save_model(str(out_dir / "ir_model.json"))
    (out_dir / "ir_report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report
