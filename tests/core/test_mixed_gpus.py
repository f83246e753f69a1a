"""A cluster of mixed GPU types: every job's GPUs are of one type, and sharing judges each host on its own type."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from meshsched import events as ev
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import load_perf_model
from meshsched.loaders.traces import TraceOptions, load_trace
from meshsched.loaders.profiles import installed_handle
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.state import ClusterState, JobSpec, NodeSpec

PERF = load_perf_model()


def _types(state, job) -> set[str]:
    return {state.gpus[g].gpu_type for g in job.gpus}


def test_a_multi_node_job_never_spans_gpu_types():
    eng = Engine(make_policy("sjf"), ProfileEstimator(PERF), ClusterState())
    for name, t in (("a", "v100"), ("b", "k80"), ("c", "k80")):
        eng.handle(ev.NodeJoined(f"j-{name}", NodeSpec(name, 4, t, 16384 if t == "v100" else 12288)), 0.0)
    eng.handle(ev.JobSubmitted("s1", JobSpec("1", 6, "resnet18", 64 * 6, 100)), 1.0)
    job = eng.state.jobs["1"]
    assert job.state.holds_gpus and _types(eng.state, job) == {"k80"}  # 4 + 2 would mix v100 and k80
    eng.handle(ev.JobSubmitted("s2", JobSpec("2", 3, "resnet18", 64 * 3, 100)), 2.0)
    eng.state.validate()
    assert len(_types(eng.state, eng.state.jobs["2"])) == 1


def test_the_fastest_type_sets_a_jobs_ideal_step_time():
    eng = Engine(make_policy("sjf"), ProfileEstimator(PERF), ClusterState())
    eng.handle(ev.NodeJoined("j1", NodeSpec("k", 4, "k80", 12288)), 0.0)
    eng.handle(ev.NodeJoined("j2", NodeSpec("v", 4, "v100", 16384)), 0.0)
    eng.handle(ev.JobSubmitted("s", JobSpec("1", 1, "resnet50", 64, 100)), 0.0)
    assert eng.state.jobs["1"].ideal_step_time == pytest.approx(PERF.iteration_time("resnet50", "v100", (1,), 64))


@pytest.mark.parametrize("policy", ["sjf", "srtf", "castor", "sjf-ffs", "lucid"])
def test_mixed_cluster_replay_is_valid(policy):
    cluster = ClusterSpec.parse("v100:1x4,p100:1x4,k80:1x4", 4, PERF.gpu_memory_mb)
    tr = load_trace("philly", PERF, TraceOptions(gpu_type="v100", gpus_per_node=4, seed=1, first_n=120))
    seen: list = []

    def check(engine):
        engine.state.validate()
        for j in engine.state.jobs.values():
            if j.gpus:
                assert len(_types(engine.state, j)) == 1, (j.job_id, j.gpus)
                seen.append(next(iter(_types(engine.state, j))))

    r = simulate(tr.jobs, make_policy(policy, installed_handle()), PERF, cluster, after_event=check)
    done = sum(1 for j in r.engine.state.jobs.values() if j.state.is_terminal)
    assert done == sum(1 for j in tr.jobs if j.gpus <= 4)  # jobs larger than one node of a type never run
    assert {"v100", "p100", "k80"} <= set(seen)  # every type was used


def test_cluster_parse_errors_are_clear():
    with pytest.raises(ValueError, match="TYPE:NODES"):
        ClusterSpec.parse("v100=16", 8, PERF.gpu_memory_mb)
    with pytest.raises(ValueError, match="each GPU type once"):
        ClusterSpec.parse("v100:1,v100:2", 8, PERF.gpu_memory_mb)


def test_simulate_cli_takes_a_mixed_cluster():
    from meshsched.cli.main import app

    r = CliRunner().invoke(app, ["simulate", "--cluster", "v100:2,p100:2,k80:2", "--jobs", "60", "--policy", "sjf,castor", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [g["gpu_type"] for g in data["cluster"]] == ["v100", "p100", "k80"]
    assert all(p["completed"] > 0 for p in data["policies"])
    bad = CliRunner().invoke(app, ["simulate", "--cluster", "v100:2,h900:2", "--jobs", "5"])
    assert bad.exit_code != 0 and "h900" in bad.output
