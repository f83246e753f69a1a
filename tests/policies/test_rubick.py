"""Rubick's allocator (Algorithm 1) and its baselines on the shipped A800 plan model: allocation with plans,
guarantees and quotas, plan changes through Reconfigure, refusals of jobs that could never run, and a short
replay where Rubick beats the Sia-like and Synergy-like allocators with no guaranteed job below its guarantee."""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.actions import Launch, Preempt, Reconfigure
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import load_plan_catalog
from meshsched.perf.placement import ideal_placement
from meshsched.perf.plans import (
    ExecutionPlan,
    PlanPerfModel,
    Resources,
    best_plan,
    iteration_time,
)
from meshsched.policies.registry import UnknownPolicy, make_policy, parse_policy
from meshsched.policies.rubick import LEASE
from meshsched.policies.stack import PolicyHandle
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.loaders.traces import load_plan_trace
from meshsched.sim.rubick_trace import WorkloadOptions
from meshsched.state import (
    ClusterState,
    ExecConfig,
    InvariantViolation,
    JobSpec,
    JobState,
    NodeSpec,
)

PERF = PlanPerfModel(load_plan_catalog())
GPT2_BATCH = PERF.profile("gpt2").spec.global_batch


class Rig:
    """An engine under one allocator stack; the world's replies are sent by hand; validate() after each."""

    def __init__(self, policy: str, nodes=(("n0", 8, None),)) -> None:
        self.engine = Engine(make_policy(policy, PolicyHandle(PERF)), ProfileEstimator(PERF), ClusterState())
        for name, gpus, cpus in nodes:
            self(ev.NodeJoined(f"join-{name}", NodeSpec(name, gpus, "a800", 81920, cpus=cpus)), 0.0)

    def __call__(self, event, now):
        out = self.engine.handle(event, now)
        self.engine.state.validate()
        return out

    def job(self, job_id):
        return self.engine.state.jobs[job_id]

    def submit(self, spec: JobSpec, now=0.0):
        return self(ev.JobSubmitted(f"submit-{spec.job_id}", spec), now)

    def play(self, actions, now) -> list[str]:
        """Answer as the world would (at once) until nothing is asked; the jobs preempted on the way."""
        evicted, todo = [], list(actions)
        while todo:
            a = todo.pop(0)
            if isinstance(a, Launch):
                todo += self(ev.JobStarted(f"s-{a.job_id}-{a.restart}", a.job_id), now)
            elif isinstance(a, Preempt):
                evicted.append(a.job_id)
                todo += self(ev.JobPaused(f"p-{a.job_id}", a.job_id, self.job(a.job_id).done_iterations), now)
            elif isinstance(a, Reconfigure):
                todo += self(ev.ReconfigureApplied(f"r-{a.job_id}", a.job_id, a.exec), now)
            for job in self.engine.view().holding():
                if job.spec.guaranteed and job.state is JobState.RUNNING:
                    assert step_s(job, (len(job.gpus),)) <= asked_s(job.spec) * (1 + 1e-9), job.job_id
        return evicted


def spec(job_id, model="gpt2", gpus=1, plan="dp1-tp1-pp1-ga16-gc", tenant="B", guaranteed=False, iterations=100_000,
         **kw) -> JobSpec:
    batch = PERF.profile(model).spec.global_batch
    return JobSpec(job_id, gpus, model, batch, iterations, tenant=tenant, guaranteed=guaranteed, plan=plan, **kw)


def launches(actions):
    return {a.job_id: a for a in actions if isinstance(a, Launch)}


def step_s(job, shape):
    return PERF.plan_iteration_time(job.spec.model, job.exec, shape)


def asked_s(s: JobSpec) -> float:
    cpus = float(-(-s.cpus // s.gpus)) if s.cpus else 4.0
    return iteration_time(PERF.profile(s.model), ExecutionPlan.parse(s.plan), Resources(ideal_placement(s.gpus, 8), cpus),
                          PERF.env)


def test_a_job_alone_gets_the_gpus_its_curve_uses_well_and_the_best_plan_for_them():
    rig = Rig("rubick")
    out = launches(rig.submit(spec("a")))
    launch = out["a"]
    assert len(launch.gpus) == 8  # gpt2 scales well to a node (asked 1 GPU with a poor plan)
    want, _ = best_plan(PERF.profile("gpt2"), Resources((8,), float(launch.exec.cpus_per_gpu)), PERF.env)
    assert launch.exec.plan == str(want)
    assert launch.exec.gpus == 8 and launch.exec.accumulation == want.ga
    assert launch.exec.micro_batch * want.dp * want.ga == GPT2_BATCH  # the global batch is unchanged


def test_a_node_short_of_cpus_or_memory_for_all_its_gpus_still_runs_jobs_on_what_it_can_hold():
    """meshd gives a node its real CPUs and memory (a small machine with fake GPUs: 2 CPUs, 23.5 GB for 4 GPUs).
    Before: every GPU's CPU share was reserved though the node had fewer CPUs than GPUs, and a job's GPUs were
    taken without regard to memory and then the whole allocation dropped, so nothing ever started."""
    for cpus, memory_gb in ((2, 800.0), (48, 23.5), (2, 23.5)):
        engine = Engine(make_policy("rubick", PolicyHandle(PERF)), ProfileEstimator(PERF), ClusterState())
        engine.handle(ev.NodeJoined("j", NodeSpec("small", 4, "a800", 81920, cpus=cpus, memory_gb=memory_gb)), 0.0)
        out = launches(engine.handle(ev.JobSubmitted("s", spec("a", model="bert", plan="dp1")), 0.0))
        engine.state.validate()
        x = out["a"].exec
        assert x.cpus_per_gpu * x.gpus <= cpus and x.memory_gb_per_gpu * x.gpus <= memory_gb, (cpus, memory_gb, x)


def test_a_guaranteed_job_takes_gpus_from_a_best_effort_one_and_runs_at_least_as_fast_as_asked():
    rig = Rig("rubick:quotas=A=8")
    rig.submit(spec("be"))
    rig(ev.JobStarted("s-be", "be"), 1.0)
    g = spec("g", gpus=4, plan="dp4-tp1-pp1-ga1", tenant="A", guaranteed=True)
    out = rig.submit(g, 10.0)
    assert [a.job_id for a in out if isinstance(a, Preempt)] == ["be"]  # shrunk: it restarts on fewer GPUs
    assert "g" not in launches(out)  # its GPUs come free once `be` has checkpointed
    out = launches(rig(ev.JobPaused("p-be", "be", 10.0), 20.0))
    assert set(out) == {"g", "be"}
    assert len(out["g"].gpus) + len(out["be"].gpus) <= 8
    rig(ev.JobStarted("s-g", "g"), 30.0)
    job = rig.job("g")
    assert step_s(job, (len(job.gpus),)) <= asked_s(g) * (1 + 1e-9)


def test_guaranteed_jobs_are_not_shrunk_below_their_guarantee_for_a_best_effort_arrival():
    rig = Rig("rubick:quotas=A=8")
    for t, name in enumerate(("g1", "g2")):  # each asks 4 GPUs; the first grows to 8, the second shrinks it
        rig.play(rig.submit(spec(name, gpus=4, plan="dp4-tp1-pp1-ga1", tenant="A", guaranteed=True), t), t)
    assert {len(rig.job(n).gpus) for n in ("g1", "g2")} == {4}
    held = {n: rig.job(n).gpus for n in ("g1", "g2")}
    evicted = rig.play(rig.submit(spec("be", model="bert", plan="dp1-tp1-pp1-ga1"), 5.0), 5.0)
    assert not evicted  # both hold their minimum: the best-effort job waits
    assert {n: rig.job(n).gpus for n in ("g1", "g2")} == held
    assert rig.job("be").state is JobState.PENDING


def test_a_guaranteed_job_over_its_tenants_remaining_quota_waits_with_reason_quota():
    rig = Rig("rubick:quotas=A=4", nodes=(("n0", 8, None), ("n1", 8, None)))
    first = spec("g1", gpus=4, plan="dp4-tp1-pp1-ga1", tenant="A", guaranteed=True)
    assert "g1" in launches(rig.submit(first))
    rig.submit(spec("g2", gpus=4, plan="dp4-tp1-pp1-ga1", tenant="A", guaranteed=True), 1.0)
    assert rig.job("g2").state is JobState.PENDING
    assert rig.job("g2").reason.startswith("Quota (tenant A")


def test_rubick_e_replans_a_running_job_in_place_through_reconfigure():
    rig = Rig("rubick:variant=e")
    s = spec("a", gpus=4, plan="dp4-tp1-pp1-ga4-gc")
    poor = ExecConfig(1, 4, plan="dp4-tp1-pp1-ga4-gc", gpus=4, cpus_per_gpu=4, memory_gb_per_gpu=8.0)
    rig(ev.JobAdopted("adopt-a", s, (0, 1, 2, 3), 0.0, 0.0, 1, poor), 0.0)
    lease = LEASE * (PERF.pause_time("gpt2") + PERF.load_time("gpt2"))
    assert not rig(ev.RecoveryDone("recovered"), lease - 1)  # (re)started too recently to restart it again
    out = rig(ev.RecoveryDone("recovered-2"), lease)
    (rc,) = [a for a in out if isinstance(a, Reconfigure)]
    assert rc.restart and rc.exec.plan != poor.plan and rc.exec.gpus == 4
    assert PERF.plan_iteration_time("gpt2", rc.exec, (4,)) < PERF.plan_iteration_time("gpt2", poor, (4,))
    rig(ev.ReconfigureApplied("applied-a", "a", rc.exec), lease + 78)
    assert rig.job("a").exec == rc.exec


# -- jobs that could never run: one line each, nothing queued ------------------------------------------------


@pytest.mark.parametrize("job, words", [
    (spec("oom", model="llama30", gpus=1, plan="dp1-tp1-pp1-ga1"), "out of memory"),
    (spec("badplan", plan="dp2-xx3"), "unknown token"),
    (spec("wrongcount", gpus=2, plan="dp4-tp1-pp1-ga1"), "uses 4 GPUs"),
    (spec("quota", gpus=4, plan="dp4-tp1-pp1-ga1", tenant="B", guaranteed=True), "tenant B's quota, which is 0"),
    (spec("cpus", cpus=500), "CPUs"),
    (spec("mem", gpus=2, plan="dp2-tp1-pp1-ga8", memory_gb=4000.0), "GB of memory"),
])
def test_a_job_that_could_never_run_is_refused_in_one_line_and_not_queued(job, words):
    rig = Rig("rubick:quotas=A=8")
    assert rig.engine.admission_error(job) is not None
    out = rig.submit(job)
    j = rig.job(job.job_id)
    assert j.state is JobState.FAILED and not out
    assert words in j.reason and "\n" not in j.reason and j.reason.startswith("refused: ")
    assert rig.engine.queue_length == 0


def test_cpu_and_memory_requests_are_checked_for_every_policy_but_absent_ones_change_nothing():
    rig = Rig("fifo", nodes=(("n0", 8, 16),))
    rig.submit(JobSpec("big", 1, "gpt2", 16, 10, cpus=17))
    assert rig.job("big").state is JobState.FAILED and "no node has" in rig.job("big").reason
    rig.submit(JobSpec("ok", 2, "gpt2", 16, 10, cpus=4))
    assert rig.job("ok").state is not JobState.FAILED


def test_bad_rubick_parameters_are_one_line_at_parse_time():
    for text, words in (("rubick:quotas=A", "TENANT=GPUS"), ("rubick:variant=x", "variant must be one of")):
        with pytest.raises(UnknownPolicy, match=words):
            parse_policy(text)


# -- state: CPUs and memory ---------------------------------------------------------------------------------


def test_nodes_default_to_the_papers_testbed_share_and_validate_catches_cpu_overcommit():
    n = NodeSpec("n", 8, "a800", 81920)
    assert (n.cpu_count, n.host_memory_gb) == (96, 1600.0)
    state = ClusterState()
    state.add_node(NodeSpec("n", 2, "a800", 81920, cpus=8))
    from meshsched.state import Job

    for jid, g in (("a", 0), ("b", 1)):
        job = Job(JobSpec(jid, 1, "gpt2", 16, 10), 1.0, state=JobState.RUNNING, gpus=(g,))
        job.exec = ExecConfig(16, cpus_per_gpu=5, gpus=1)
        state.jobs[jid] = job
        state.assign(jid, (g,))
    with pytest.raises(InvariantViolation, match="10 CPUs"):
        state.validate()


def test_exec_config_round_trips_its_allocation_and_leaves_old_records_unchanged():
    x = ExecConfig(2, 4, plan="dp2-tp1-pp1-ga4", gpus=2, cpus_per_gpu=6, memory_gb_per_gpu=9.5)
    assert ExecConfig.from_dict(x.to_dict()) == x
    plain = ExecConfig(4)
    assert set(plain.to_dict()) == {"micro_batch", "accumulation", "mps_percentage", "memory_limit_mb", "plan",
                                    "local_batches"}
    assert plain.needs_restart(ExecConfig(4, cpus_per_gpu=2))


# -- a short replay -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_rubick_beats_the_baselines_on_mean_jct_and_never_runs_a_guaranteed_job_below_its_guarantee():
    cluster = ClusterSpec(2, 8, "a800", 81920)
    jobs = load_plan_trace("philly", PERF, WorkloadOptions(jobs=60, max_gpus=16, seed=3))
    seen: set = set()
    below: list[str] = []

    def watch(engine):
        engine.state.validate()
        for job in engine.view().holding():
            if job.state is JobState.RUNNING and job.spec.guaranteed and (job.job_id, job.exec, job.gpus) not in seen:
                seen.add((job.job_id, job.exec, job.gpus))
                nodes: dict[str, int] = {}
                for g in job.gpus:
                    nodes[engine.state.gpus[g].node] = nodes.get(engine.state.gpus[g].node, 0) + 1
                shape = tuple(sorted(nodes.values(), reverse=True))
                if step_s(job, shape) > asked_s(job.spec) * (1 + 1e-9):
                    below.append(job.job_id)

    jct = {}
    for policy in ("rubick:quotas=A=16", "sia", "synergy"):
        r = simulate(jobs, make_policy(policy, PolicyHandle(PERF)), PERF, cluster,
                     after_event=watch if policy.startswith("rubick") else lambda e: e.state.validate())
        done = [j for j in r.engine.state.jobs.values() if j.state is JobState.COMPLETED]
        assert len(done) == len(jobs)
        jct[policy.split(":")[0]] = sum(j.acct.finish_time - j.spec.submit_time for j in done) / len(done)
    assert seen and not below
    assert jct["rubick"] < jct["sia"] and jct["rubick"] < jct["synergy"], jct


# -- mesh simulate ----------------------------------------------------------------------------------------------


def _mesh(*args):
    from meshsched.cli.main import app
    from typer.testing import CliRunner

    return CliRunner().invoke(app, list(args))


@pytest.mark.slow
def test_mesh_simulate_replays_plan_allocators_on_the_plan_workload_and_refuses_mixing_them():
    r = _mesh("simulate", "--policy", "rubick:quotas=A=16,synergy", "--nodes", "2", "--jobs", "12", "--json")
    assert r.exit_code == 0, r.output
    import json

    doc = json.loads(r.output)
    assert doc["cluster"][0]["gpu_type"] == "a800" and doc["jobs"] == 12
    assert [p["completed"] for p in doc["policies"]] == [12, 12]
    r = _mesh("simulate", "--policy", "rubick,fifo", "--nodes", "2", "--jobs", "12")
    assert r.exit_code != 0 and "compare them with each other" in r.output and "Traceback" not in r.output
    r = _mesh("simulate", "--policy", "rubick", "--nodes", "2", "--jobs", "12")
    assert r.exit_code == 0 and "refused at submit" in r.output  # guaranteed jobs of a tenant without quota


# -- the baselines --------------------------------------------------------------------------------------------


def test_sia_like_scales_only_the_data_parallel_size_of_the_asked_plan_with_the_asked_cpus():
    rig = Rig("sia")
    out = launches(rig.submit(spec("a", model="t5", gpus=2, plan="dp1-tp2-pp1-ga2-gc", cpus=8)))
    plan = ExecutionPlan.parse(out["a"].exec.plan)
    assert (plan.tp, plan.pp, plan.gc, plan.zero, plan.offload) == (2, 1, True, 0, False)
    assert plan.dp * 2 == len(out["a"].gpus) > 2  # grown along DP
    assert out["a"].exec.cpus_per_gpu == 4


def test_synergy_like_keeps_the_asked_gpus_and_plan_and_gives_an_offload_plan_more_cpus():
    rig = Rig("synergy")
    asked = "dp1-tp1-pp1-ga2-z1-off"
    out = launches(rig.submit(spec("off", model="llama7", gpus=1, plan=asked, cpus=2)))
    assert len(out["off"].gpus) == 1 and out["off"].exec.plan == asked
    assert out["off"].exec.cpus_per_gpu > 2  # its CPU step speeds up with more cores
    out = launches(rig.submit(spec("dp", gpus=2, plan="dp2-tp1-pp1-ga1", cpus=8), 1.0))
    assert len(out["dp"].gpus) == 2 and out["dp"].exec.cpus_per_gpu == 1  # insensitive to CPUs: the fewest


def test_a_simulated_cluster_takes_cpus_and_memory_per_node_or_the_papers_share_by_default():
    default = ClusterSpec(2, 8, "a800", 81920).node_specs()
    assert [(n.cpu_count, n.host_memory_gb) for n in default] == [(96, 1600.0)] * 2
    small = ClusterSpec(2, 8, "a800", 81920, cpus_per_node=16, memory_gb_per_node=256.0).node_specs()
    assert [(n.cpu_count, n.host_memory_gb) for n in small] == [(16, 256.0)] * 2
