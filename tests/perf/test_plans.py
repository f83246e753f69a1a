"""Execution plans (Rubick): plan strings, the iteration-time model's terms, the memory estimator, the fit,
and the shipped A800 profile (profiles/plans_a800.json)."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

import pytest
from meshsched.cli import profiles as profiles_cli
from typer.testing import CliRunner

from meshsched.loaders.profiles import load_plan_catalog
from meshsched.perf.plan_fit import fit_plan_params, relative_error, sample_fit_rows
from meshsched.perf.plans import (
    Environment,
    ExecutionPlan,
    InvalidPlan,
    ModelSpec,
    PlanMeasurement,
    PlanParams,
    PlanProfile,
    Resources,
    best_plan,
    catalog_from_json,
    fits,
    gpu_memory_gb,
    iteration_terms,
    iteration_time,
    plan_family,
)

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_data = pytest.mark.skipif(
    not (DATA / "throughputs" / "morphling").is_dir(), reason=f"raw data not at {DATA}"
)

# hand-checkable numbers: 1e9 parameters, global batch 8, 10 layers, 1000 tokens x 1000 hidden (2 MB/sample)
SPEC = ModelSpec("toy", 1_000_000_000, 8, 1000, 10, 1000)
ENV = Environment(nvlink_gbs=100.0, internode_gbs=10.0, pcie_gbs=10.0, gpu_memory_gb=80.0, gpus_per_nic=2)
K = PlanParams(k_fwd=0.01, k_bwd=2.0, k_sync=1.0, k_opt=0.1, k_opt_off=1.0, k_off=1.0, k_const=0.01)
TOY = PlanProfile(SPEC, K)


# -- plan strings ----------------------------------------------------------------------------------------


def test_plan_string_round_trip_and_defaults() -> None:
    p = ExecutionPlan.parse("dp4-tp2-pp1-ga2-gc-z2-off")
    assert p == ExecutionPlan(dp=4, tp=2, pp=1, ga=2, gc=True, zero=2, offload=True)
    assert str(p) == "dp4-tp2-pp1-ga2-gc-z2-off"
    assert ExecutionPlan.parse(str(p)) == p
    assert ExecutionPlan.parse("z1-dp8") == ExecutionPlan(dp=8, zero=1)  # any order; tp/pp/ga default to 1
    assert str(ExecutionPlan(dp=2)) == "dp2-tp1-pp1-ga1"
    assert ExecutionPlan(dp=2, tp=2, pp=2).gpus == 8


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("dp2--tp2", "empty token"),
        ("dp2-xx3", "unknown token"),
        ("dp2-dp4", "twice"),
        ("tp2-pp2", "no dpN"),
        ("dp0", ">= 1"),
        ("dp2-z4", "ZeRO stage"),
        ("dp2-off", "needs a ZeRO stage"),
        ("dp2-pp2-z2", "pipeline"),
    ],
)
def test_bad_plan_strings_give_one_clear_line(text: str, says: str) -> None:
    with pytest.raises(InvalidPlan, match=says) as e:
        ExecutionPlan.parse(text)
    assert "\n" not in str(e.value)


def test_plan_must_match_the_allocation_and_batch() -> None:
    with pytest.raises(InvalidPlan, match="uses 4 GPUs"):
        iteration_time(TOY, ExecutionPlan(dp=4), Resources((2,)), ENV)
    with pytest.raises(InvalidPlan, match="does not split"):
        iteration_time(TOY, ExecutionPlan(dp=2, ga=3), Resources((2,)), ENV)
    with pytest.raises(InvalidPlan, match="placement"):
        Resources.parse("2x")
    assert Resources.parse("233").placement == (2, 3, 3) and Resources.parse("233").gpus == 8


def test_plan_families_follow_table_2() -> None:
    assert plan_family(ExecutionPlan(dp=8)) == "DP"
    assert plan_family(ExecutionPlan(dp=8, gc=True)) == "GC"
    assert plan_family(ExecutionPlan(dp=8, ga=2, zero=2)) == "ZeRO-DP+GA"
    assert plan_family(ExecutionPlan(dp=1, zero=2, offload=True, gc=True)) == "ZeRO-Offload+GC"
    assert plan_family(ExecutionPlan(dp=1, tp=4, pp=2)) == "TP+PP"
    assert plan_family(ExecutionPlan(dp=2, tp=4, pp=2)) == "DP+TP+PP"


# -- the model's terms on hand-checkable numbers ---------------------------------------------------------


def test_one_gpu_data_parallel_is_fwd_bwd_opt_const() -> None:
    t = iteration_terms(TOY, ExecutionPlan(dp=1), Resources((1,)), ENV)
    # fwd = 0.01 s x 8 samples x 1e9 params; bwd = 2 x fwd; opt = 0.1 x 1e9; const = 0.01 x 1 step
    assert (t.fwd, t.bwd, t.opt, t.const) == pytest.approx((0.08, 0.16, 0.1, 0.01))
    assert t.dp_comm == 0 and t.total == pytest.approx(0.35)


def test_data_parallel_sync_on_one_node_and_across_nodes() -> None:
    one_node = iteration_terms(TOY, ExecutionPlan(dp=2), Resources((2,)), ENV)
    # gradient all-reduce over NVLink: 2 (q-1)/q x 2 B x 1e9 / 100 GB/s = 0.02 s; k_sync = 1 adds it serially
    assert one_node.dp_comm == pytest.approx(0.02)
    assert one_node.total == pytest.approx(0.04 + 0.08 + 0.02 + 0.1 + 0.01)
    two_nodes = iteration_terms(TOY, ExecutionPlan(dp=2), Resources((1, 1)), ENV)
    # one GPU per node -> one NIC: 2 x 2 GB / 10 GB/s = 0.4 s
    assert two_nodes.dp_comm == pytest.approx(0.4)
    assert two_nodes.total == pytest.approx(0.04 + 0.08 + 0.4 + 0.1 + 0.01)
    # a large overlap exponent hides the smaller of backward and sync (max)
    hidden = PlanProfile(SPEC, PlanParams(0.01, 2.0, 50.0, 0.1, 1.0, 1.0, 0.01))
    assert iteration_terms(hidden, ExecutionPlan(dp=2), Resources((2,)), ENV).sync == pytest.approx(0.08, rel=1e-3)


def test_more_gpus_per_node_share_more_nics() -> None:
    # 4+4: two NICs per node for the DP group -> half the inter-node time of 2+6 (its 2-GPU node has one NIC)
    even = iteration_terms(TOY, ExecutionPlan(dp=8), Resources((4, 4)), ENV).dp_comm
    skew = iteration_terms(TOY, ExecutionPlan(dp=8), Resources((2, 6)), ENV).dp_comm
    intra = 2 * 3 / 4 * 2e9 / 100e9, 2 * 5 / 6 * 2e9 / 100e9
    assert even == pytest.approx(intra[0] + 2 * 2e9 / 20e9)
    assert skew == pytest.approx(intra[1] + 2 * 2e9 / 10e9)


def test_gc_ga_pp_tp_terms() -> None:
    gc = iteration_terms(TOY, ExecutionPlan(dp=1, gc=True), Resources((1,)), ENV)
    assert gc.recompute == pytest.approx(0.08) and gc.total == pytest.approx(0.35 + 0.08)
    ga = iteration_terms(TOY, ExecutionPlan(dp=1, ga=2), Resources((1,)), ENV)
    assert ga.total == pytest.approx(0.35 + 0.01)  # one more fixed-cost step, same compute
    pp = iteration_terms(TOY, ExecutionPlan(dp=1, pp=2), Resources((2,)), ENV)
    # one micro-batch through 2 stages: bubble 2 x (fwd/2); sync after the flush; 2 steps of const
    assert pp.bubble == 2 and pp.fwd == pytest.approx(0.04) and pp.sync == pytest.approx(0.16)
    assert pp.pp_comm == pytest.approx(2 * 2 * 8 * 2e6 / 100e9)
    assert pp.total == pytest.approx(0.08 + 0.16 + pp.pp_comm + 0.05 + 0.02)
    tp = iteration_terms(TOY, ExecutionPlan(dp=1, tp=2), Resources((2,)), ENV)
    # 4 activation all-reduces per layer x 10 layers x (2 (q-1)/q x 8 x 2 MB / 100 GB/s)
    assert tp.tp_comm == pytest.approx(4 * 10 * 16e6 / 100e9)


def test_offload_cpu_step_and_host_copies() -> None:
    t = iteration_terms(TOY, ExecutionPlan(dp=1, zero=2, offload=True), Resources((1,), cpus_per_gpu=4), ENV)
    # CPU Adam: 1.0 s x 1e9 / 4 threads; copies: 4 B x 1e9 / 10 GB/s; k_off = 1 adds them
    assert (t.cpu_opt, t.pcie, t.offload) == pytest.approx((0.25, 0.4, 0.65))
    assert t.total == pytest.approx(0.08 + 0.16 + 0.65 + 0.01)
    more_cpus = iteration_time(TOY, ExecutionPlan(dp=1, zero=2, offload=True), Resources((1,), cpus_per_gpu=8), ENV)
    assert more_cpus == pytest.approx(t.total - 0.125)


# -- memory ----------------------------------------------------------------------------------------------


def test_memory_estimator_excludes_over_memory_plans() -> None:
    llama7 = ModelSpec("llama7", 6_738_423_808, 8, 4096, 32, 2048)
    # 16 B/parameter of model states alone is 108 GB > 80 GB: plain data parallelism cannot run on 1 GPU
    assert gpu_memory_gb(llama7, ExecutionPlan(dp=1), ENV) > 108
    assert not fits(llama7, ExecutionPlan(dp=1), ENV)
    assert not fits(llama7, ExecutionPlan(dp=1, zero=2, offload=True), ENV)  # 8 samples of activations: too many
    assert fits(llama7, ExecutionPlan(dp=1, zero=2, offload=True, gc=True), ENV)
    assert fits(llama7, ExecutionPlan(dp=1, tp=8), ENV)


def test_best_plan_on_one_gpu_is_offload_as_in_the_paper() -> None:
    cat = load_plan_catalog()
    best = best_plan(cat.profile("llama7"), Resources((1,)), cat.env)
    assert best is not None
    plan, seconds = best
    assert plan.offload and plan.gpus == 1 and seconds > 0  # Fig. 7: "the only feasible plan" on one GPU
    huge = PlanProfile(ModelSpec("huge", 10**12, 8, 8192, 80, 4096), K)
    assert best_plan(huge, Resources((1,)), ENV) is None


# -- fitting ---------------------------------------------------------------------------------------------


def test_fit_recovers_known_parameters_from_synthetic_data() -> None:
    truth = PlanParams(k_fwd=0.02, k_bwd=1.8, k_sync=1.5, k_opt=0.05, k_opt_off=6.0, k_off=2.0, k_const=0.03)
    prof = PlanProfile(SPEC, truth)
    cases = [
        ("dp1", "1", 4), ("dp2", "2", 4), ("dp4", "4", 4), ("dp8", "8", 4), ("dp2", "11", 4), ("dp8", "44", 4),
        ("dp4-gc", "4", 4), ("dp4-ga2", "4", 4), ("dp8-z2", "8", 4), ("dp2-z2", "11", 4),
        ("dp1-z2-off", "1", 2), ("dp1-z2-off", "1", 8), ("dp4-z2-off", "4", 4), ("dp8-z2-off", "8", 16),
        ("dp1-tp4", "4", 4), ("dp1-tp2-pp2", "22", 4),
    ]
    rows = [
        PlanMeasurement(p, r, iteration_time(prof, p, r, ENV))
        for p, r in ((ExecutionPlan.parse(a), Resources.parse(b, c)) for a, b, c in cases)
    ]
    got = fit_plan_params(SPEC, ENV, rows)
    for name in ("k_fwd", "k_bwd", "k_sync", "k_opt", "k_opt_off", "k_off", "k_const"):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=0.02), name
    with pytest.raises(ValueError, match="at least 7"):
        fit_plan_params(SPEC, ENV, rows[:6])


def test_fit_sample_covers_every_family_and_is_seeded() -> None:
    rows = load_plan_catalog().measurements["gpt2"]
    a, b = sample_fit_rows(rows, 8, 0), sample_fit_rows(rows, 8, 0)
    assert a == b and len(set(a)) == 8
    assert {rows[i].family for i in a} == {r.family for r in rows}
    assert sample_fit_rows(rows, 8, 1) != a


# -- the shipped profile ---------------------------------------------------------------------------------

# From `python benchmarks/plan_model.py` (shipped fit: 8 points, seed 0; see profiles/README.md): held-out mean
# error 6.7% BERT, 8.0% RoBERTa, 8.4% GPT-2, 8.1% LLaMA-2-7B, 9.5% LLaMA-30B; largest fitted-point residual
# 6-15%. The bounds leave room for a refit, not for a broken model (a wrong unit or term gives errors of 2x
# and more). ViT (held-out mean 52%: its multi-node times depend on the placement in ways no bandwidth term
# explains) and T5 (20%: its Megatron 3D runs are ~2.5x slower per sample than its DeepSpeed runs) are known
# misfits, checked only for sane output.
KNOWN_MISFITS = frozenset({"vit", "t5"})
HELD_OUT_MEAN_BOUND = 0.15
FIT_POINT_BOUND = 0.20


def test_shipped_profile_predicts_its_measurements() -> None:
    cat = load_plan_catalog("a800")
    assert set(cat.profiles) == {"vit", "roberta", "bert", "t5", "gpt2", "llama7", "llama30"}
    for name, rows in cat.measurements.items():
        prof = cat.profile(name)
        errs = [(m.in_fit, relative_error(iteration_time(prof, m.plan, m.resources, cat.env), m.iter_time_s)) for m in rows]
        assert sum(f for f, _ in errs) == 8, name
        assert all(math.isfinite(e) for _, e in errs), name
        if name in KNOWN_MISFITS:
            continue
        assert max(e for f, e in errs if f) < FIT_POINT_BOUND, name
        assert statistics.fmean(e for f, e in errs if not f) < HELD_OUT_MEAN_BOUND, name


def test_every_measured_plan_fits_in_memory() -> None:
    cat = load_plan_catalog()
    for name, rows in cat.measurements.items():
        spec = cat.profile(name).spec
        for m in rows:
            assert fits(spec, m.plan, cat.env), (name, str(m.plan))


def test_cli_lists_plans_with_errors_and_rejects_unknown_models() -> None:
    runner = CliRunner()
    res = runner.invoke(profiles_cli.app, ["plans", "llama30", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert len(rows) == 11 and {r["model"] for r in rows} == {"llama30"}
    r = rows[0]
    assert math.isclose(r["rel_err"], abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"], rel_tol=1e-3)
    table = runner.invoke(profiles_cli.app, ["plans", "llama30"])
    assert "held-out plans" in table.output and "dp2-tp4-pp4-ga1" in table.output
    bad = runner.invoke(profiles_cli.app, ["plans", "gpt5"])
    assert bad.exit_code == 2 and "no plan profile for model 'gpt5'" in bad.output and "Traceback" not in bad.output


@needs_data
def test_conversion_matches_the_shipped_profile_in_everything_it_can_identify(tmp_path: Path) -> None:
    """The raw data converts to the shipped file: spec, measurements and fit points exactly, and every measured
    plan's predicted iteration time within 1 %. The fitted parameters themselves are not compared: the fit is
    not identifiable (on an AMD EPYC the same data gave k_sync 3.62 and k_bwd 2.29 where the shipped file,
    fitted on another CPU, has 13.55 and 2.83, with the same predictions to 0.06 %), so they pin one CPU's
    floating point, not the conversion."""
    from importlib.resources import files

    from meshsched.cli.plans_convert import convert

    convert(DATA, tmp_path)
    got = json.loads((tmp_path / "plans_a800.json").read_text(encoding="utf-8"))
    shipped = json.loads((files("meshsched.profiles") / "plans_a800.json").read_text(encoding="utf-8"))
    params_of = {name: (got["models"][name].pop("params"), shipped["models"][name].pop("params"))
                 for name in shipped["models"]}
    assert got == shipped
    assert sorted(params_of) == sorted(got["models"])
    ours, theirs = catalog_from_json(json.loads((tmp_path / "plans_a800.json").read_text(encoding="utf-8"))), \
        load_plan_catalog()
    for name, rows in theirs.measurements.items():
        for m in rows:
            predicted = iteration_time(ours.profile(name), m.plan, m.resources, ours.env)
            assert predicted == pytest.approx(iteration_time(theirs.profile(name), m.plan, m.resources, theirs.env),
                                              rel=0.01), (name, str(m.plan))


def test_with_measured_forward_times_the_other_six_are_fitted_and_k_fwd_is_unused() -> None:
    """The artifact's protocol (benchmarks/plan_model.py --protocol artifact): T_fwd is each row's measured
    forward time; a forward rate 3x the truth's is what the rows say, and the other parameters still come out."""
    truth = PlanParams(k_fwd=0.02, k_bwd=1.8, k_sync=1.5, k_opt=0.05, k_opt_off=6.0, k_off=2.0, k_const=0.03)
    fast = PlanProfile(SPEC, dataclasses.replace(truth, k_fwd=0.06))
    cases = [("dp1", "1", 4), ("dp2", "2", 4), ("dp8", "44", 4), ("dp4-gc", "4", 4), ("dp4-ga2", "4", 4),
             ("dp8-z2", "8", 4), ("dp1-z2-off", "1", 2), ("dp1-z2-off", "1", 8), ("dp4-z2-off", "4", 4),
             ("dp1-tp2-pp2", "22", 4)]
    rows = []
    for a, b, c in cases:
        plan, res = ExecutionPlan.parse(a), Resources.parse(b, c)
        terms = iteration_terms(fast, plan, res, ENV)
        rows.append(PlanMeasurement(plan, res, terms.total, fwd_s=terms.fwd))
    got = fit_plan_params(SPEC, ENV, rows, measured_fwd=True)
    for name in ("k_bwd", "k_sync", "k_opt", "k_opt_off", "k_off", "k_const"):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=0.02), name
    prof = PlanProfile(SPEC, got)
    r = rows[3]
    assert iteration_terms(prof, r.plan, r.resources, ENV, r.fwd_s).total == pytest.approx(r.iter_time_s, rel=0.01)
    assert iteration_terms(prof, r.plan, r.resources, ENV, 2 * r.fwd_s).fwd == 2 * r.fwd_s
    with pytest.raises(ValueError, match="a row has none"):
        fit_plan_params(SPEC, ENV, [dataclasses.replace(r, fwd_s=None) for r in rows], measured_fwd=True)
