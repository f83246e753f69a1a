"""Load/pause-time regimes (issue 12 item 3): `measured` (profiles/overheads.json, from our checkpoint sizes) and
`lazer` (profiles/overheads_lazer.json, scaled to Lazer section 3.2's means), selected by name."""

from __future__ import annotations

import json
import statistics

import pytest
from meshsched.cli.main import app
from typer.testing import CliRunner

from meshsched.loaders.profiles import OVERHEAD_REGIMES, load_perf_model
from meshsched.loaders.traces import TraceOptions, load_trace
from meshsched.perf import UnknownProfile
from meshsched.perf.assumptions import CHECKPOINTS, load_seconds, pause_seconds
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.sim.metrics import summarise

MODELS = [c.model for c in CHECKPOINTS]
LAZER_MEAN_LOAD_S = 113.0  # Lazer section 3.2 (Fig. 3): SRTF adds 113 s of load time per job
LAZER_MEAN_PAUSE_S = 8.0  # Lazer section 3.2: pause-and-save averages 8 s across all policies


def test_regimes_are_named_and_an_unknown_one_is_refused():
    assert set(OVERHEAD_REGIMES) == {"measured", "lazer"}
    assert load_perf_model() is load_perf_model()  # cached per regime
    with pytest.raises(UnknownProfile, match="unknown overhead regime 'huge'; known: lazer, measured"):
        load_perf_model("huge")


def test_measured_regime_follows_the_checkpoint_size_model():
    pm = load_perf_model("measured")
    for c in CHECKPOINTS:
        assert pm.load_time(c.model) == pytest.approx(load_seconds(c), rel=1e-5)
        assert pm.pause_time(c.model) == pytest.approx(pause_seconds(c), rel=1e-5)
    assert all(20.0 <= pm.load_time(m) <= 31.0 and 5.0 <= pm.pause_time(m) <= 16.0 for m in MODELS)


def test_lazer_regime_matches_the_papers_means_and_keeps_the_relative_sizes():
    measured, lazer = load_perf_model("measured"), load_perf_model("lazer")
    loads = [lazer.load_time(m) for m in MODELS]
    pauses = [lazer.pause_time(m) for m in MODELS]
    assert statistics.fmean(loads) == pytest.approx(LAZER_MEAN_LOAD_S, abs=0.01)
    assert statistics.fmean(pauses) == pytest.approx(LAZER_MEAN_PAUSE_S, abs=0.01)
    assert min(loads) > 100.0  # loads of minutes, pauses of seconds
    load_ratio = LAZER_MEAN_LOAD_S / statistics.fmean(measured.load_time(m) for m in MODELS)
    pause_ratio = LAZER_MEAN_PAUSE_S / statistics.fmean(measured.pause_time(m) for m in MODELS)
    for m in MODELS:  # one scale factor per quantity: the model with the bigger checkpoint still loads slower
        assert lazer.load_time(m) == pytest.approx(measured.load_time(m) * load_ratio, rel=1e-5)
        assert lazer.pause_time(m) == pytest.approx(measured.pause_time(m) * pause_ratio, rel=1e-5)
    # only the overheads differ
    assert lazer.iteration_time("bert", "t4", (2, 2), 8) == measured.iteration_time("bert", "t4", (2, 2), 8)
    assert lazer.gpu_types == measured.gpu_types


def _srtf_philly(overheads: str):
    perf = load_perf_model(overheads)
    tr = load_trace("philly", perf, TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, first_n=300))
    r = simulate(tr.jobs, make_policy("srtf"), perf, ClusterSpec(2, 8, "v100", perf.gpu_memory_mb("v100")))
    return summarise(r, "srtf")


def test_srtf_wastes_more_load_time_in_the_lazer_regime():
    measured, lazer = _srtf_philly("measured"), _srtf_philly("lazer")
    assert measured.completed == lazer.completed == 300
    assert lazer.load_gpu_h > 3 * measured.load_gpu_h
    assert lazer.futile_gpu_h > 2 * measured.futile_gpu_h > 0.0


def test_simulate_option_selects_the_regime():
    def run(*extra: str) -> dict:
        r = CliRunner().invoke(app, ["simulate", "--jobs", "150", "--nodes", "2", "--policy", "srtf", "--json", *extra])
        assert r.exit_code == 0, (r.stdout, r.stderr)
        return json.loads(r.stdout)["policies"][0]

    default, measured, lazer = run(), run("--overheads", "measured"), run("--overheads", "lazer")
    assert default == {**measured, "sim_seconds": default["sim_seconds"]}
    assert lazer["load_gpu_h"] > 3 * measured["load_gpu_h"]

    bad = CliRunner().invoke(app, ["simulate", "--jobs", "5", "--overheads", "paper"])
    assert bad.exit_code != 0 and isinstance(bad.exception, SystemExit)
    assert bad.stderr.strip() == "mesh: error: unknown overhead regime 'paper'; known: lazer, measured"
