"""An engine on a bare ClusterState with LinearPerf, validated after every event (the core tests' harness)."""

from __future__ import annotations

from meshsched import events as ev
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import installed_handle
from meshsched.policies.registry import make_policy
from meshsched.state import ClusterState, JobSpec, NodeSpec
from tests.support.fakes import LinearPerf


class Harness:
    """An engine plus a counter for stimulus ids; validates the state after every event."""

    def __init__(self, policy: str = "fifo", nodes=(("n0", 4),), log_size: int = 100_000) -> None:
        self.engine = Engine(make_policy(policy, installed_handle()), ProfileEstimator(LinearPerf()), ClusterState(), log_size=log_size)
        self.n = 0
        for name, gpus in nodes:
            self.join(name, gpus, 0.0)

    @property
    def state(self) -> ClusterState:
        return self.engine.state

    def job(self, job_id: str):
        return self.state.jobs[job_id]

    def __call__(self, event: ev.Event, now: float) -> list:
        actions = self.engine.handle(event, now)
        self.state.validate()
        return actions

    def sid(self, what: str) -> str:
        self.n += 1
        return f"{what}-{self.n}"

    def submit(self, job_id: str, gpus: int, iterations: int, now: float, model: str = "m") -> list:
        spec = JobSpec(job_id, gpus, model, 100 * gpus, iterations, submit_time=now)
        return self(ev.JobSubmitted(self.sid(f"submit-{job_id}"), spec), now)

    def started(self, job_id: str, now: float) -> list:
        return self(ev.JobStarted(self.sid(f"started-{job_id}"), job_id), now)

    def paused(self, job_id: str, iterations: float, now: float) -> list:
        return self(ev.JobPaused(self.sid(f"paused-{job_id}"), job_id, iterations), now)

    def finished(self, job_id: str, now: float) -> list:
        return self(ev.JobFinished(self.sid(f"finished-{job_id}"), job_id), now)

    def failed(self, job_id: str, now: float, reason: str = "boom", requeue: bool = False) -> list:
        return self(ev.JobFailed(self.sid(f"failed-{job_id}"), job_id, reason, requeue), now)

    def cancel(self, job_id: str, now: float) -> list:
        return self(ev.CancelRequested(self.sid(f"cancel-{job_id}"), job_id), now)

    def join(self, name: str, gpus: int, now: float) -> list:
        return self(ev.NodeJoined(self.sid(f"join-{name}"), NodeSpec(name, gpus, "fake", 16384)), now)

    def lose(self, name: str, now: float) -> list:
        return self(ev.NodeLost(self.sid(f"lost-{name}"), name), now)

    def report(self, job_id: str, iterations: float, step_time: float, now: float) -> list:
        return self(ev.IterationReport(self.sid(f"report-{job_id}"), job_id, iterations, step_time), now)
