"""The IR predictor: split without leakage, unknown model families, measured pairs answered as measured."""

from __future__ import annotations

import math
from importlib.resources import files
from pathlib import Path

import pytest

from meshsched.loaders.profiles import ir_predictor_from, load_perf_model
from meshsched.perf.interference import (
    FEATURE_NAMES,
    KNOWN_FAMILIES,
    N_PROFILE_FEATURES,
    Interference,
    pair_features,
)

pytest.importorskip("xgboost")

from meshsched.cli import train_ir as T  # noqa: E402

PERF = load_perf_model()


@pytest.fixture(scope="module")
def rows():
    return T.measured_rows(PERF)


@pytest.fixture(scope="module")
def predictor():
    p = ir_predictor_from(files("meshsched.profiles"))
    assert p is not None, "profiles/ir_model.json missing or stale: run `mesh profiles train-ir`"
    return p


def test_feature_layout():
    assert len(FEATURE_NAMES) == N_PROFILE_FEATURES + 2 * len(KNOWN_FAMILIES)
    f = pair_features(PERF, "resnet50", 32, "lm", 10, "v100")
    assert len(f) == len(FEATURE_NAMES)
    assert f[N_PROFILE_FEATURES + KNOWN_FAMILIES.index("resnet50")] == 1.0
    assert f[N_PROFILE_FEATURES + len(KNOWN_FAMILIES) + KNOWN_FAMILIES.index("lm")] == 1.0
    assert sum(f[N_PROFILE_FEATURES:]) == 2.0


def test_main_split_has_no_leakage(rows):
    test_keys = T.split_test_keys(rows)
    assert test_keys == T.split_test_keys(list(reversed(rows)))  # deterministic, order-independent
    train = {frozenset(r[0]) for r in rows if r[0] not in test_keys}
    test = {frozenset(r[0]) for r in rows if r[0] in test_keys}
    assert train and test and not train & test  # an unordered pair, in either order, on any GPU: one side only
    n = len({r[0] for r in rows})
    assert len(test_keys) == round(n * T.TEST_FRACTION)
    # both orders of a test pair are in the test part, on every GPU type where they were measured
    for (gpu, ma, ba, mb, bb), xi in PERF.measured_pairs().items():
        if xi is not None:
            key = tuple(sorted([(ma, ba), (mb, bb)]))
            assert (key in test_keys) == (tuple(sorted([(mb, bb), (ma, ba)])) in test_keys)


def test_model_pair_split_has_no_leakage(rows):
    held = T.split_test_model_pairs(rows)
    train = {T._model_pair(r) for r in rows if T._model_pair(r) not in held}  # noqa: SLF001
    test = {T._model_pair(r) for r in rows if T._model_pair(r) in held}  # noqa: SLF001
    assert train and test and not train & test


def test_unknown_family_gives_finite_xi(predictor):
    # the T4-only models are outside KNOWN_FAMILIES: all-zero identity features
    models = PERF.models("t4")
    unknown = [m for m in models if m not in KNOWN_FAMILIES]
    assert len(unknown) >= 2
    ma, mb = unknown[:2]
    ba, bb = PERF.profiled_batches(ma, "t4")[0], PERF.profiled_batches(mb, "t4")[0]
    f = pair_features(PERF, ma, ba, mb, bb, "t4")
    assert not any(f[N_PROFILE_FEATURES:])
    xi = Interference(PERF, predictor)
    assert xi.source(ma, ba, mb, bb, "t4") == "predicted"
    out = xi.xi(ma, ba, mb, bb, "t4")
    assert out is not None and all(math.isfinite(v) and v >= 1.0 for v in out)
    # a known model's profile with its identity hidden still predicts a finite xi >= 1
    g = pair_features(PERF, "resnet50", 32, "recommendation", 512, "v100")
    g[N_PROFILE_FEATURES:] = [0.0] * (len(g) - N_PROFILE_FEATURES)
    (v,) = predictor([g])
    assert math.isfinite(v) and v > 0


def test_prefill_covers_unknown_families(predictor):
    xi = Interference(PERF, predictor)
    xi.prefill("t4")
    assert xi._predicted  # noqa: SLF001
    assert all(math.isfinite(a) and math.isfinite(b) and a >= 1 and b >= 1 for a, b in xi._predicted.values())  # noqa: SLF001


def test_measured_pairs_answer_measured_values(predictor):
    xi = Interference(PERF, predictor)
    for (gpu, ma, ba, mb, bb), m in list(sorted(PERF.measured_pairs().items()))[::97]:
        assert xi.source(ma, ba, mb, bb, gpu) == "measured"
        got = xi.xi(ma, ba, mb, bb, gpu)
        if m is None:
            assert got is None
        else:
            assert got == (max(1.0, m[0]), max(1.0, m[1]))


def test_train_small_grid_is_deterministic_and_loadable(tmp_path):
    grid = {"max_depth": (3,), "min_child_weight": (2,), "rounds": (10,)}
    r1 = T.train_ir(PERF, Path(tmp_path / "a"), grid)
    r2 = T.train_ir(PERF, Path(tmp_path / "b"), grid)
    assert r1 == r2
    for k in ("rmse_job_a", "rmse_job_b", "rmse_all", "median_abs_err", "feature_importance_gain", "harder_splits"):
        assert k in r1
    assert set(r1["harder_splits"]) == {"leave_one_family_out", "by_model_pair"}
    assert (tmp_path / "a" / "ir_model.json").read_bytes() == (tmp_path / "b" / "ir_model.json").read_bytes()

    pred = ir_predictor_from(tmp_path / "a")  # a Path is a Traversable
    assert pred is not None
    (v,) = pred([pair_features(PERF, "resnet50", 32, "lm", 10, "v100")])
    assert math.isfinite(v) and v > 0
