"""Issue 26, point 1: every stack the registry accepts runs; every one it refuses is one line, alone or in a
comma list; `rubick+gimbal` no longer crashes; Rubick composes as the plan layer of any stack."""

from __future__ import annotations

import itertools
from functools import cache

import pytest
import typer
from typer.testing import CliRunner

from meshsched.cli import simulate as simulate_cli
from meshsched.loaders.profiles import installed_handle, load_perf_model, load_plan_catalog
from meshsched.loaders.traces import TraceOptions, load_plan_trace, load_trace
from meshsched.perf.mixed import MixedPerfModel
from meshsched.perf.plans import PlanPerfModel
from meshsched.policies.registry import POLICIES, UnknownPolicy, make_policy, needs_plan_models, parse_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.sim.mixed_trace import with_plan_jobs
from meshsched.sim.rubick_trace import WorkloadOptions
from meshsched.state import JobSpec, JobState

LAYERS = ("placement", "preemption", "calibration")
NAMES = {layer: [n for n, e in POLICIES.items() if e.layer == layer] for layer in LAYERS}
PLAN_LAYERS = [n for n, e in POLICIES.items() if e.plan_build is not None]


def _combinations() -> list[str]:
    out = []
    for place, pre, cal, plan in itertools.product([None, *NAMES["placement"]], [None, *NAMES["preemption"]],
                                                   [None, *NAMES["calibration"]], [None, *PLAN_LAYERS]):
        items = [x for x in (place, pre, cal, plan) if x is not None]
        if items and "+".join(items) not in out:
            out.append("+".join(items))
    return out


def _accepted(spec: str) -> bool:
    try:
        parse_policy(spec)
    except UnknownPolicy:
        return False
    return True


COMBOS = _combinations()
ACCEPTED = [s for s in COMBOS if _accepted(s)]
REFUSED = [s for s in COMBOS if not _accepted(s)]


@cache
def _plan_workload():
    perf = PlanPerfModel(load_plan_catalog())
    return perf, tuple(load_plan_trace("philly", perf, WorkloadOptions(jobs=6, max_gpus=16, seed=3)))


@cache
def _mixed_workload():
    perf = MixedPerfModel(load_perf_model(), PlanPerfModel(load_plan_catalog()))
    tr = load_trace("philly", perf, TraceOptions(gpu_type="v100", gpus_per_node=8, seed=2, first_n=10))
    return perf, tuple(with_plan_jobs(tr.jobs, perf, 0.5, "v100", 8, 16, seed=2))


def _cluster(perf) -> ClusterSpec:
    gpu_type = perf.gpu_types[0] if isinstance(perf, PlanPerfModel) else "v100"
    return ClusterSpec(2, 8, gpu_type, perf.gpu_memory_mb(gpu_type))


def _app() -> typer.Typer:
    app = typer.Typer()
    simulate_cli.register(app)
    app.command("noop")(lambda: None)  # two commands: typer keeps `simulate` as a subcommand
    return app


def _simulate(*args: str):
    return CliRunner().invoke(_app(), ["simulate", *args])


def test_the_combinations_cover_every_layer():
    assert {"castor+lazer+gimbal+rubick", "rubick+gimbal", "castor+rubick", "rubick"} <= set(ACCEPTED)
    assert REFUSED and len(ACCEPTED) > 20


@pytest.mark.parametrize("spec", ACCEPTED)
def test_every_accepted_stack_runs(spec):
    perf, jobs = _plan_workload() if needs_plan_models(spec) else _mixed_workload()
    stack = make_policy(spec, installed_handle(1, True, False, perf))
    r = simulate(jobs, stack, perf, _cluster(perf))
    states = {j.state for j in r.engine.state.jobs.values()}
    assert states <= {JobState.COMPLETED, JobState.FAILED}, (spec, states)
    assert any(j.state is JobState.COMPLETED for j in r.engine.state.jobs.values()), spec


@pytest.mark.parametrize("spec", REFUSED)
def test_every_refused_stack_is_one_line_alone_and_in_a_list(spec):
    with pytest.raises(UnknownPolicy) as alone:
        parse_policy(spec)
    assert "\n" not in str(alone.value)
    r = _simulate("--policy", f"castor+lazer+gimbal,{spec}", "--jobs", "5", "--json")
    assert r.exit_code == 2 and isinstance(r.exception, SystemExit), (spec, r.exit_code, repr(r.exception))
    assert r.stderr == f"mesh: error: {alone.value}\n", (spec, r.stderr)


def test_a_refused_stack_in_a_list_gives_the_line_it_gives_alone():
    alone = _simulate("--policy", "castor+sjf", "--jobs", "5").stderr
    listed = _simulate("--policy", "castor+lazer+gimbal,castor+sjf", "--jobs", "5").stderr
    assert alone == listed and alone.count("\n") == 1, (alone, listed)


@pytest.mark.slow
def test_rubick_with_gimbal_runs_in_mesh_simulate():
    r = _simulate("--policy", "rubick+gimbal", "--jobs", "20", "--nodes", "2", "--json")  # crashed on a report
    assert r.exit_code == 0, (r.output, r.exception)
    assert "Traceback" not in r.stderr


def test_rubick_is_the_plan_layer_beside_another_placement():
    layers = parse_policy("castor+lazer+gimbal+rubick")
    assert layers["placement"][0] == "castor" and layers["plan"][0] == "rubick"
    assert parse_policy("rubick+castor")["plan"][0] == "rubick"  # either order
    assert "plan" not in parse_policy("rubick")  # alone it is the placement layer, as before
    for bad in ("rubick+sia", "rubick+rubick"):
        with pytest.raises(UnknownPolicy, match="picks execution plans itself"):
            parse_policy(bad)


def test_the_plan_layer_starts_plan_jobs_on_a_plan_and_leaves_the_others():
    perf, jobs = _mixed_workload()
    planned = {j.job_id for j in jobs if perf.is_planned(j.model)}
    assert planned and len(planned) < len(jobs)
    stack = make_policy("castor+rubick", installed_handle(1, True, False, perf))
    starts: dict[str, object] = {}

    def watch(engine):
        for job in engine.state.jobs.values():
            if job.exec is not None and job.job_id not in starts:
                starts[job.job_id] = job.exec

    simulate(jobs, stack, perf, _cluster(perf), after_event=watch)
    for job_id, x in starts.items():
        if job_id in planned:
            assert x.plan is not None and x.cpus_per_gpu >= 1, (job_id, x)
        else:
            assert x.plan is None, (job_id, x)
    assert planned & set(starts)


def test_without_a_plan_layer_a_plan_job_trains_on_its_asked_plan():
    """The baseline the plan layer is measured against: the asked plan at the asked CPUs, not the best plan."""
    perf, jobs = _mixed_workload()
    job = next(j for j in jobs if perf.is_planned(j.model))
    alone = simulate([job], make_policy("sjf", installed_handle(1, False, False, perf)), perf, _cluster(perf))
    planned = simulate([job], make_policy("sjf+rubick", installed_handle(1, False, False, perf)), perf, _cluster(perf))
    a, b = alone.engine.state.jobs[job.job_id], planned.engine.state.jobs[job.job_id]
    assert a.state is b.state is JobState.COMPLETED
    assert b.exec.plan is not None and (a.exec is None or a.exec.plan is None)
    assert b.acct.run_time <= a.acct.run_time * (1 + 1e-9), (b.exec, a.acct.run_time, b.acct.run_time)


@pytest.mark.slow
def test_a_calibrated_set_beside_a_plan_job_replays():
    """A data-parallel job Gimbal calibrated, sharing GPUs with a plan-profile job: the simulator steps the set
    by interference (no MPS-share model of a plan job) instead of failing with UnknownProfile."""
    perf = MixedPerfModel(load_perf_model(), PlanPerfModel(load_plan_catalog()))
    tr = load_trace("philly", perf, TraceOptions(gpu_type="v100", gpus_per_node=8, seed=2, first_n=120, load=3.0))
    jobs = with_plan_jobs(tr.jobs, perf, 0.4, "v100", 8, 16, seed=2)
    r = simulate(jobs, make_policy("castor+gimbal", installed_handle(1, True, False, perf)), perf, _cluster(perf))
    assert all(j.state is JobState.COMPLETED for j in r.engine.state.jobs.values())


def test_a_plan_job_placed_beside_a_partner_keeps_the_micro_batch_that_fits_there():
    """Fails before: Castor sized roberta's micro-batch (16 x 4) to fit beside a resnet50 on one V100, and the plan
    layer then started it on dp1-ga1 (micro-batch 64): the simulator failed it as out of memory next to its
    partner (two such jobs in the busy window under castor+lazer+gimbal+rubick)."""
    perf = MixedPerfModel(load_perf_model(), PlanPerfModel(load_plan_catalog()))
    cluster = ClusterSpec(1, 1, "v100", perf.gpu_memory_mb("v100"))
    jobs = [JobSpec("r50", 1, "resnet50", 128, 20_000, 0.0), JobSpec("rob", 1, "roberta", 64, 2_700, 100.0)]
    r = simulate(jobs, make_policy("castor+rubick", installed_handle(1, True, False, perf)), perf, cluster)
    rob = r.engine.state.jobs["rob"]
    assert {j.job_id: j.state for j in r.engine.state.jobs.values()} == {"r50": JobState.COMPLETED,
                                                                           "rob": JobState.COMPLETED}
    assert rob.exec is not None and rob.exec.plan is not None and rob.exec.micro_batch * rob.exec.accumulation == 64
