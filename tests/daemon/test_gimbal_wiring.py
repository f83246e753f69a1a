"""Gimbal wired in: LISS in ExecConfig, the `gimbal` calibration layer in stacks, the engine's packing-set hook,
the memo kept in engine state, the simulator's MPS-share model, and meshd carrying out LISS and LGRR."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from meshsched import events as ev
from meshsched.actions import Reconfigure
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import load_mps_share, load_perf_model
from meshsched.loaders.traces import TraceOptions, load_trace
from meshsched.policies import base as pb
from meshsched.loaders.profiles import installed_handle
from meshsched.policies.registry import UnknownPolicy, make_policy, parse_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.state import ExecConfig, JobSpec, JobState, NodeSpec

PERF = load_perf_model()
V100 = NodeSpec("n0", 1, "v100", PERF.gpu_memory_mb("v100"))
# a3c next to transformer on one V100: a3c suffers xi 3.09, transformer 1.13 (measured pair); a3c's share
# curve (median u 0.60) is above transformer's (u 0.57), so the JCT objective (eq. 2: -utilisation) makes a3c
# the low-priority job, the one squeezed.
A3C = JobSpec("a", 1, "a3c", 1, 20_000, 0.0)
TRANSFORMER = JobSpec("b", 1, "transformer", 256, 20_000, 1.0)


# -- ExecConfig: LISS --------------------------------------------------------------------------------------


def test_local_batches_keep_the_per_step_batch_round_trip_and_need_no_restart():
    x = ExecConfig(4, 2)
    liss = ExecConfig(4, 2, local_batches=(6, 10))
    assert liss.samples(2) == (6, 10) and x.samples(2) == (8, 8)
    assert not x.needs_restart(liss) and x.needs_restart(ExecConfig(4, 2, mps_percentage=50))
    assert ExecConfig.from_dict(liss.to_dict()) == liss and ExecConfig.from_dict(x.to_dict()) == x
    assert ExecConfig.from_dict({"micro_batch": 4}) == ExecConfig(4)  # records journaled before LISS
    for bad in ((6, 9), (0, 16), ()):
        with pytest.raises(ValueError, match="local_batches"):
            ExecConfig(4, 2, local_batches=bad)
    with pytest.raises(ValueError, match="ranks"):
        liss.samples(3)


# -- the registry ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec,objective", [("castor+gimbal", "jct"), ("sjf-ffs+gimbal:objective=deadline", "deadline"),
                                            ("lucid+gimbal:objective=makespan", "makespan")])
def test_stacks_with_gimbal_build_with_its_objective(spec, objective):
    stack = make_policy(spec, installed_handle())
    assert stack.calibration.name == "gimbal" and stack.calibration.objective.name == objective
    assert stack.calibration.mps_share == load_mps_share()
    assert parse_policy(spec)["calibration"][0] == "gimbal"


@pytest.mark.parametrize("spec,why", [("gimbal", "needs a placement"), ("castor+gimbal:objective=fast", "one of"),
                                      ("castor+gimbal:switch=-1", "positive"), ("castor+gimbal+gimbal", "one per layer")])
def test_bad_gimbal_stacks_are_refused_in_one_line(spec, why):
    with pytest.raises(UnknownPolicy, match=why):
        parse_policy(spec)


# -- the engine: hook, decisions, memo ---------------------------------------------------------------------


def _pair_engine(policy: str = "sjf-ffs+gimbal") -> tuple[Engine, list]:
    eng = Engine(make_policy(policy, installed_handle()), ProfileEstimator(PERF))
    out = []
    out += eng.handle(ev.NodeJoined("j", V100), 0.0)
    out += eng.handle(ev.JobSubmitted("sa", A3C), 0.0)
    out += eng.handle(ev.JobSubmitted("sb", TRANSFORMER), 1.0)
    assert eng.state.gpus[0].jobs == ["a", "b"]  # sjf-ffs shares the one GPU
    out += eng.handle(ev.JobStarted("la", "a"), 20.0)
    return eng, out


def test_a_sharer_starting_triggers_calibration_that_squeezes_the_low_priority_job():
    eng, before = _pair_engine()
    assert not [a for a in before if isinstance(a, Reconfigure)]  # b still loading: a trains alone
    actions = eng.handle(ev.JobStarted("lb", "b"), 25.0)
    eng.state.validate()
    rec = {a.job_id: a for a in actions if isinstance(a, Reconfigure)}
    assert set(rec) == {"a"} and rec["a"].restart  # LGRR: a restart
    assert rec["a"].exec.mps_percentage < 100 and rec["a"].exec.mps_percentage % 10 == 0
    a, b = eng.state.jobs["a"], eng.state.jobs["b"]
    assert a.exec_pending == rec["a"].exec and b.exec.mps_percentage == 100
    assert a.calibration.searches == 1 and a.calibration.lgrr_changes == 1 and b.calibration.lgrr_changes == 0
    assert "gimbal jct" in eng.explain("a")[-1].message
    # the partner leaving sends a back to a full share
    eng.handle(ev.ReconfigureApplied("ap", "a", rec["a"].exec), 29.0)
    back = [x for x in eng.handle(ev.JobFinished("fb", "b"), 100.0) if isinstance(x, Reconfigure)]
    assert back == [Reconfigure("a", ExecConfig(1), restart=True)]


def test_without_a_calibration_layer_nothing_is_calibrated():
    eng, _ = _pair_engine("sjf-ffs")
    actions = eng.handle(ev.JobStarted("lb", "b"), 25.0)
    assert not [a for a in actions if isinstance(a, Reconfigure)] and eng._recalibrate == {}
    assert all(j.calibration is None for j in eng.state.jobs.values())


def test_the_calibration_survives_a_rebuild_from_adopted_jobs():
    eng, _ = _pair_engine()
    (rec,) = [a for a in eng.handle(ev.JobStarted("lb", "b"), 25.0) if isinstance(a, Reconfigure)]
    eng.handle(ev.ReconfigureApplied("ap", "a", rec.exec), 29.0)
    # meshd restarts: the engine is rebuilt from the journal, each job adopted with the exec it trained with
    new = Engine(make_policy("sjf-ffs+gimbal", installed_handle()), ProfileEstimator(PERF))
    new.handle(ev.NodeJoined("j", V100), 50.0)
    for job_id in ("a", "b"):
        old = eng.state.jobs[job_id]
        new.handle(ev.JobAdopted(f"ad{job_id}", old.spec, old.gpus, 1000.0, 0.0, 1, old.exec), 50.0)
    assert new.state.jobs["a"].exec == rec.exec
    actions = new.handle(ev.IterationReport("r", "a", 1100.0, 0.2), 60.0)
    new.state.validate()
    assert not [a for a in actions if isinstance(a, Reconfigure)]  # searched again from the adopted share: kept
    assert new.state.jobs["a"].calibration.searches == 1 and new.state.jobs["a"].exec == rec.exec


def test_a_sharer_starting_while_a_switch_is_under_way_is_still_calibrated():
    """Without reports nothing waits for a pending change: the set {a, b} got a Reconfigure, and c starting
    next to a before it was applied still gets its search (it used to be skipped until the next event)."""
    eng = Engine(make_policy("sjf-ffs+gimbal", installed_handle()), ProfileEstimator(PERF))
    eng.handle(ev.NodeJoined("j", NodeSpec("n0", 2, "v100", PERF.gpu_memory_mb("v100"))), 0.0)
    eng.handle(ev.JobSubmitted("sa", JobSpec("a", 2, "transformer", 256, 50_000)), 0.0)
    for j in ("b", "c"):
        eng.handle(ev.JobSubmitted(f"s{j}", JobSpec(j, 1, "a3c", 1, 20_000)), 0.0)
    for j in ("a", "b"):
        eng.handle(ev.JobStarted(f"l{j}", j), 10.0)
    assert any(eng.state.jobs[j].exec_pending is not None for j in ("a", "b"))
    eng.handle(ev.JobStarted("lc", "c"), 11.0)
    eng.state.validate()
    members = {job for job, _, _ in eng.state.jobs["c"].calibration.packing}
    assert members == {"a", "b", "c"}


def test_a_reported_straggler_gets_fewer_samples():
    """A 2-GPU job whose reports say rank 1 is 1.5x slower (a slow GPU, say): LISS moves samples off it, free."""
    eng = Engine(make_policy("sjf+gimbal", installed_handle()), ProfileEstimator(PERF))
    eng.handle(ev.NodeJoined("j", NodeSpec("n0", 2, "v100", PERF.gpu_memory_mb("v100"))), 0.0)
    eng.handle(ev.JobSubmitted("sa", JobSpec("a", 2, "resnet50", 128, 50_000)), 0.0)
    assert not eng.handle(ev.JobStarted("la", "a"), 10.0)  # alone, nothing reported: nothing to do
    actions = eng.handle(ev.RankReport("rr", "a", (0.4, 0.6)), 100.0)
    (rec,) = [a for a in actions if isinstance(a, Reconfigure)]
    lb = rec.exec.local_batches
    assert lb is not None and lb[1] < lb[0] and sum(lb) == 128 and not rec.restart
    assert rec.exec.mps_percentage == 100
    # a report within the collection window (60 s) does not search again
    assert not eng.handle(ev.RankReport("rr2", "a", (0.4, 0.6)), 130.0)


def test_a_straggler_reported_right_after_a_search_is_calibrated_after_five_steps():
    """The collection window is 60 s or 5 steps, whichever comes first (section 5.2). Fails before: meshd's first
    progress report ran a search without per-rank figures, and the straggler they then showed waited 60 s."""
    eng = Engine(make_policy("sjf+gimbal", installed_handle()), ProfileEstimator(PERF))
    eng.handle(ev.NodeJoined("j", NodeSpec("n0", 2, "v100", PERF.gpu_memory_mb("v100"))), 0.0)
    eng.handle(ev.JobSubmitted("sa", JobSpec("a", 2, "resnet50", 128, 50_000)), 0.0)
    eng.handle(ev.JobStarted("la", "a"), 10.0)
    assert not [a for a in eng.handle(ev.IterationReport("r1", "a", 1.0, 0.5), 11.0) if isinstance(a, Reconfigure)]
    assert eng.state.jobs["a"].calibration.searches == 0  # alone, nothing measured: searched, nothing to change
    assert not eng.handle(ev.RankReport("rr1", "a", (0.4, 0.6)), 11.5)  # no step since: still collecting
    assert not eng.handle(ev.IterationReport("r2", "a", 5.0, 0.5), 13.0)  # 4 steps
    (rec,) = [a for a in eng.handle(ev.IterationReport("r3", "a", 6.0, 0.5), 13.5) if isinstance(a, Reconfigure)]
    lb = rec.exec.local_batches
    assert lb is not None and lb[1] < lb[0] and not rec.restart  # 5 steps, 2.5 s after the first search


# -- the simulator ---------------------------------------------------------------------------------------


def _pair_run(policy: str, **kw):
    r = simulate([A3C, TRANSFORMER], make_policy(policy, installed_handle()), PERF, ClusterSpec(1, 1, "v100", PERF.gpu_memory_mb("v100")),
                 after_event=lambda e: e.state.validate(), **kw)
    jobs = r.engine.state.jobs
    return {k: jobs[k].acct.finish_time - jobs[k].spec.submit_time for k in "ab"}, r


def test_a_calibrated_pair_finishes_as_the_model_predicts():
    plain, _ = _pair_run("sjf-ffs")
    tuned, r = _pair_run("sjf-ffs+gimbal")
    a, b = r.engine.state.jobs["a"], r.engine.state.jobs["b"]
    assert a.calibration.lgrr_changes == 1 and a.exec.mps_percentage < 100  # squeezed, and finished so
    assert b.calibration.lgrr_changes == 0 and b.exec.mps_percentage == 100
    # a's share stays above its saturation (no loss of its own) while the MPS partitions overlap less, so
    # both jobs suffer less interference (assumption 3 of perf/mps_share.py): both finish sooner
    assert tuned["b"] < plain["b"] and tuned["a"] < plain["a"]


def test_a_model_handed_to_the_world_moves_nothing_without_calibration():
    tr = load_trace("philly", PERF, TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, load=2.0, first_n=80))
    cluster = ClusterSpec(2, 8, "v100", PERF.gpu_memory_mb("v100"))
    runs = [simulate(tr.jobs, make_policy("sjf-ffs", installed_handle()), PERF, cluster, mps_share=m) for m in (None, load_mps_share())]
    finish = [{k: j.acct.finish_time for k, j in r.engine.state.jobs.items()} for r in runs]
    assert finish[0] == finish[1]
    assert any("sharing with" in e.message for e in runs[0].engine.log)  # the slice does share GPUs


def test_lgrr_costs_the_switch_and_liss_is_free_in_the_simulator():
    from meshsched.actions import Launch
    from meshsched.policies.gimbal import LGRR_SWITCH_S
    from meshsched.sim.world import SimWorld

    w = SimWorld(PERF, [V100], None, load_mps_share())
    spec = JobSpec("a", 1, "resnet50", 64, 1000)
    w.submit(spec)
    w.execute([Launch("a", (0,), 0.0, 0, ExecConfig(64))], 0.0)
    w.pop()
    w.started("a", 10.0)
    w.execute([Reconfigure("a", ExecConfig(64, mps_percentage=50), restart=True)], 20.0)
    at, applied = w.pop()
    assert isinstance(applied, ev.ReconfigureApplied) and at == pytest.approx(20.0 + LGRR_SWITCH_S)
    assert w.lgrr_switches == 1
    w.execute([Reconfigure("a", ExecConfig(32, 2, mps_percentage=50), restart=False)], 30.0)
    at, applied = w.pop()
    assert isinstance(applied, ev.ReconfigureApplied) and at == 30.0


def test_stacks_with_gimbal_replay_a_philly_slice():
    tr = load_trace("philly", PERF, TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, load=2.0, first_n=60))
    cluster = ClusterSpec(2, 8, "v100", PERF.gpu_memory_mb("v100"))
    for policy in ("castor+gimbal", "lucid+gimbal:objective=makespan", "sjf-ffs+gimbal:objective=deadline"):
        r = simulate(tr.jobs, make_policy(policy, installed_handle()), PERF, cluster, after_event=lambda e: e.state.validate())
        jobs = r.engine.state.jobs.values()
        assert all(j.state is JobState.COMPLETED for j in jobs if j.spec.gpus <= 16), policy
        assert all(j.exec_pending is None for j in jobs)


# -- meshd -----------------------------------------------------------------------------------------------

LISS_JOB = '''
import os, time
import torch.distributed as dist
from meshsched import job
dist.init_process_group("gloo")
from meshsched.job.sampler import ElasticSampler
s = ElasticSampler(10_000, 8, world_size=int(os.environ["WORLD_SIZE"]), shuffle=False)
sess = job.attach(sampler=s, rng=False)
print("mps", os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), "restart", os.environ["MESH_RESTART_COUNT"], flush=True)
sess.resume()
last = None
while sess.step < 100_000:
    time.sleep(0.02)
    if sess.end_step():
        sess.exit()
    if s.local_batches != last:
        last = list(s.local_batches)
        print("local", last, flush=True)
'''


def _reconfigure(d, job_id: str, x: ExecConfig) -> list:
    """What the engine does with a calibration decision, carried out by meshd's handlers."""
    from meshsched.executor import dispatch

    actions: list = []
    with d.journal.batch():
        d.engine._reconfigure(pb.Reconfigure(job_id, x, "test"), time.time(), "test", actions)
        for a in actions:
            dispatch("meshd", d._handlers, a)
    return actions


@pytest.mark.slow
async def test_meshd_carries_out_liss_by_directive_and_lgrr_by_restart(tmp_path, fake_control):
    from meshsched.wire.protocol import SubmitRequest
    from tests.support.daemon import daemon_with_mps, py, wait_for

    async with daemon_with_mps(tmp_path / "state", 2) as d:  # fake MPS: a recording control tool on PATH
        rec = d.submit(SubmitRequest(command=py(LISS_JOB), cwd="/tmp", gpus=2, batch_size=8,
                                     env={"MESH_REPORT_INTERVAL": "0.05"}), "u")
        log0, log1 = (d.config.jobs_dir / rec.job_id / "logs" / f"rank{r}.log" for r in (0, 1))
        await wait_for(lambda: rec.job_id in d.sdk_jobs and log0.exists() and "local" in log0.read_text(),
                       timeout=60, what="job up")  # two ranks import torch: slow on a loaded machine
        assert "mps 100 restart 0" in log0.read_text()
        job = d.engine.state.jobs[rec.job_id]
        # LISS: the straggling rank 1 gets fewer samples, in-process
        liss = ExecConfig(4, local_batches=(5, 3))
        assert _reconfigure(d, rec.job_id, liss) == [Reconfigure(rec.job_id, liss, restart=False)]
        await wait_for(lambda: "local [5, 3]" in log0.read_text() and "local [5, 3]" in log1.read_text(),
                       what="samples moved on both ranks")
        await wait_for(lambda: job.exec == liss and job.exec_pending is None, what="ReconfigureApplied (LISS)")
        assert d.records[rec.job_id].exec["local_batches"] == [5, 3]
        # LGRR: checkpoint, relaunch on the same GPUs with the new thread percentage
        lgrr = ExecConfig(4, mps_percentage=60, local_batches=(5, 3))
        gpus = job.gpus
        assert _reconfigure(d, rec.job_id, lgrr) == [Reconfigure(rec.job_id, lgrr, restart=True)]
        await wait_for(lambda: "mps 60 restart" in log0.read_text(), timeout=60, what="relaunched at 60%")
        await wait_for(lambda: job.exec == lgrr and job.exec_pending is None, what="ReconfigureApplied (LGRR)")
        assert job.gpus == gpus and job.state is JobState.RUNNING and job.acct.preemptions == 0
        await wait_for(lambda: "mps 60" in log1.read_text(), what="rank 1 at 60%")


@pytest.mark.slow
async def test_an_lgrr_restart_of_a_job_not_yet_on_the_socket_relaunches_it(tmp_path, fake_control):
    """A squeeze decided the moment a partner starts reaches a job that has not said hello yet: meshd stops it by
    signal (no SDK to checkpoint-and-exit), and the relaunch must follow; before, the supervisor's 'terminated'
    outcome failed the job (seen with gpu_meshd.py's rehearsal: two jobs submitted together under sjf-ffs+gimbal)."""
    from meshsched.wire.protocol import SubmitRequest
    from tests.support.daemon import daemon_with_mps, py, wait_for

    async with daemon_with_mps(tmp_path / "state", 1) as d:
        code = "import os, time; print('mps', os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE'), flush=True); time.sleep(60)"
        rec = d.submit(SubmitRequest(command=py(code), cwd="/tmp", gpus=1, batch_size=20, model="lm"), "u")
        log = d.config.jobs_dir / rec.job_id / "logs" / "rank0.log"
        await wait_for(lambda: log.exists() and "mps 100" in log.read_text(), what="job up")
        job = d.engine.state.jobs[rec.job_id]
        lgrr = ExecConfig(20, mps_percentage=60)
        assert _reconfigure(d, rec.job_id, lgrr) == [Reconfigure(rec.job_id, lgrr, restart=True)]
        await wait_for(lambda: "mps 60" in log.read_text(), timeout=30, what="relaunched at 60%")
        await wait_for(lambda: job.exec == lgrr and job.exec_pending is None, what="ReconfigureApplied (LGRR)")
        assert job.state is JobState.RUNNING and d.records[rec.job_id].state == "RUNNING"


def test_a_length_declared_after_the_start_calibrates_the_shared_set_again():
    """Jobs whose scripts declare their length at hello (no --iters) start at the default 100 iterations: Gimbal
    judged the pair on that and, the memo unchanged, never again until reports had piled up (seen with
    benchmarks/gpu_meshd.py: the pair was never squeezed). The declared length now searches the set again."""
    eng = Engine(make_policy("sjf-ffs+gimbal", installed_handle()), ProfileEstimator(PERF))
    eng.handle(ev.NodeJoined("j", V100), 0.0)
    eng.handle(ev.JobSubmitted("sa", replace(A3C, iterations=100)), 0.0)
    eng.handle(ev.JobSubmitted("sb", replace(TRANSFORMER, iterations=100)), 1.0)
    eng.handle(ev.JobStarted("la", "a"), 20.0)
    assert not [a for a in eng.handle(ev.JobStarted("lb", "b"), 25.0) if isinstance(a, Reconfigure)]
    actions = eng.handle(ev.TotalDeclared("ta", "a", 20_000), 26.0) + eng.handle(ev.TotalDeclared("tb", "b", 20_000), 26.5)
    rec = [a for a in actions if isinstance(a, Reconfigure) and a.exec.mps_percentage < 100]
    assert [r.job_id for r in rec] == ["a"] and rec[0].restart
