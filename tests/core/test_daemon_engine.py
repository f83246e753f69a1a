"""Engine events for the daemon: JobRestored, JobAdopted, CheckpointSaved, RecoveryDone (no I/O)."""

from meshsched import events as ev
from meshsched.actions import Launch
from meshsched.engine import Engine
from meshsched.policies.registry import make_policy
from meshsched.state import ExecConfig, JobSpec, JobState, NodeSpec
from tests.support.fakes import LinearPerf


class FixedEstimator:
    def step_time(self, spec, gpu_type, placement, exec=None):
        return 1.0


def _engine() -> Engine:
    eng = Engine(make_policy("sjf"), FixedEstimator())
    eng.handle(ev.NodeJoined("j", NodeSpec("n", 4, "fake", 1000)), 0.0)
    return eng


def spec(i: str, gpus: int, iters: int) -> JobSpec:
    return JobSpec(i, gpus, "m", 32, iters)


def test_recovery_rebuilds_running_and_queued_then_schedules_once():
    eng = _engine()
    assert eng.handle(ev.JobAdopted("a", spec("1", 2, 100), (2, 3), 40.0, 30.0, 1), 10.0) == []
    eng.state.validate()
    assert eng.handle(ev.JobRestored("r", spec("2", 2, 50), True, 20.0, 1), 10.0) == []
    assert eng.handle(ev.JobRestored("r", spec("3", 2, 10), False, 0.0, 0), 10.0) == []
    eng.state.validate()
    j1 = eng.state.jobs["1"]
    assert j1.state is JobState.RUNNING and j1.gpus == (2, 3) and j1.checkpoint_iterations == 30.0
    assert eng.state.jobs["2"].state is JobState.PREEMPTED and eng.state.jobs["3"].state is JobState.PENDING
    assert eng.pending_reason("2") in ("Resources", "Priority")
    actions = eng.handle(ev.RecoveryDone("done"), 11.0)
    eng.state.validate()
    launches = [a for a in actions if isinstance(a, Launch)]
    assert [(a.job_id, a.gpus) for a in launches] == [("3", (0, 1))]  # SJF: the shortest first
    # a restored job resumes from its checkpoint and keeps its restart count
    launches = [a for a in eng.handle(ev.JobFinished("f", "1"), 12.0) if isinstance(a, Launch)]
    assert launches == [Launch("2", (2, 3), 20.0, 1, ExecConfig(16))]
    eng.state.validate()


def test_checkpoint_saved_is_where_a_requeue_resumes():
    eng = _engine()
    eng.handle(ev.JobSubmitted("s", spec("1", 4, 100)), 0.0)
    eng.handle(ev.JobStarted("st", "1"), 1.0)
    eng.handle(ev.CheckpointSaved("c", "1", 25.0), 2.0)
    eng.handle(ev.CheckpointSaved("c", "1", 10.0), 3.0)  # never goes back
    eng.state.validate()
    assert eng.state.jobs["1"].checkpoint_iterations == 25.0
    actions = eng.handle(ev.JobFailed("x", "1", "meshd restarted", requeue=True), 4.0)
    eng.state.validate()
    assert actions[0] == Launch("1", (0, 1, 2, 3), 25.0, 1, ExecConfig(8))
    # a checkpoint for a job not holding GPUs is ignored and logged
    eng.handle(ev.JobFinished("f", "1"), 5.0)
    assert eng.handle(ev.CheckpointSaved("c", "1", 99.0), 6.0) == []
    assert "ignored CheckpointSaved" in eng.explain("1")[-1].message


def test_linear_perf_fake_still_imports():
    assert LinearPerf().models("fake") == ("m",)


def test_adoption_restores_the_exec_config():
    # A restart of meshd in the middle of a shared pair must not reset how the sharer trains.
    eng = _engine()
    shared = ExecConfig(8, 4, mps_percentage=50, memory_limit_mb=4000)
    eng.handle(ev.JobAdopted("a", spec("1", 2, 100), (0, 1), 10.0, 0.0, 1, shared), 1.0)
    eng.handle(ev.JobAdopted("b", spec("2", 2, 100), (0, 1), 10.0, 0.0, 1), 1.0)
    eng.state.validate()
    assert eng.state.jobs["1"].exec == shared
    assert eng.state.jobs["2"].exec == ExecConfig(16)  # no record: the job's default


def test_reconfigure_keeps_the_per_gpu_batch_and_waits_for_applied():
    from meshsched.actions import Reconfigure
    from meshsched.policies import base as pb

    eng = _engine()
    eng.handle(ev.JobSubmitted("s", spec("1", 2, 100)), 0.0)
    eng.handle(ev.JobStarted("st", "1"), 1.0)
    actions: list = []
    eng._reconfigure(pb.Reconfigure("1", ExecConfig(4, 4), "test"), 2.0, "t", actions)
    assert actions == [Reconfigure("1", ExecConfig(4, 4), restart=False)]
    job = eng.state.jobs["1"]
    assert job.exec == ExecConfig(16) and job.exec_pending == ExecConfig(4, 4)
    actions = []
    eng._reconfigure(pb.Reconfigure("1", ExecConfig(4, 4, mps_percentage=50), "t"), 2.0, "t", actions)
    assert actions[0].restart  # an MPS limit is fixed per CUDA context
    eng.handle(ev.ReconfigureApplied("ap", "1", ExecConfig(4, 4, mps_percentage=50)), 3.0)
    assert job.exec == ExecConfig(4, 4, mps_percentage=50) and job.exec_pending is None
    import pytest

    with pytest.raises(ValueError, match="global batch"):
        eng._reconfigure(pb.Reconfigure("1", ExecConfig(4, 2), "t"), 4.0, "t", [])
