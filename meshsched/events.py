"""What happened: frozen event records the engine consumes. Each carries the stimulus_id it is logged under."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshsched.state import ExecConfig, JobSpec, NodeSpec


@dataclass(frozen=True, slots=True)
class Event:
    stimulus_id: str


@dataclass(frozen=True, slots=True)
class JobSubmitted(Event):
    spec: JobSpec
    held: bool = False  # submitted on hold (`mesh submit --hold`): not queued until released


@dataclass(frozen=True, slots=True)
class JobStarted(Event):
    """The job finished loading (process up, checkpoint restored) and began training."""

    job_id: str


@dataclass(frozen=True, slots=True)
class IterationReport(Event):
    job_id: str
    iterations: float  # optimizer steps done in total
    step_time: float  # recent seconds per step
    measured_for: float = 0.0  # seconds of training that step time was measured over, up to now (0: exact)


@dataclass(frozen=True, slots=True)
class JobPaused(Event):
    """The job saved a checkpoint at `iterations` and gave back its GPUs."""

    job_id: str
    iterations: float


@dataclass(frozen=True, slots=True)
class JobFinished(Event):
    job_id: str


@dataclass(frozen=True, slots=True)
class JobFailed(Event):
    """The job died. `requeue` is for an innocent neighbour of a fault (same MPS server): no failure charged."""

    job_id: str
    reason: str
    requeue: bool = False


@dataclass(frozen=True, slots=True)
class CancelRequested(Event):
    job_id: str


@dataclass(frozen=True, slots=True)
class NodeJoined(Event):
    node: NodeSpec


@dataclass(frozen=True, slots=True)
class NodeLost(Event):
    node: str


@dataclass(frozen=True, slots=True)
class Tick(Event):
    """A timer the engine asked for (ScheduleTimer) fired."""

    key: int


@dataclass(frozen=True, slots=True)
class JobRestored(Event):
    """Rebuild a queued job from a durable record (daemon restart); no scheduling pass until RecoveryDone."""

    spec: JobSpec
    preempted: bool  # it ran before: PREEMPTED, else PENDING
    checkpoint_iterations: float
    restarts: int  # launches so far
    held: bool = False  # it was on hold


@dataclass(frozen=True, slots=True)
class JobAdopted(Event):
    """Rebuild a running job whose processes survived a daemon restart, on the GPUs it holds."""

    spec: JobSpec
    gpus: tuple[int, ...]
    done_iterations: float
    checkpoint_iterations: float
    restarts: int
    exec: ExecConfig | None = None  # how it trained when meshd went down (None: the job's default)
    time_limit_at: float | None = None  # when its run exceeds its time limit (None: the spec's limit from now)


@dataclass(frozen=True, slots=True)
class CheckpointSaved(Event):
    """The running job saved a checkpoint at `iterations`: a later requeue resumes from there."""

    job_id: str
    iterations: float


@dataclass(frozen=True, slots=True)
class RecoveryDone(Event):
    """Every durable record was restored: run one scheduling pass."""


@dataclass(frozen=True, slots=True)
class ReconfigureApplied(Event):
    """The job now trains as `exec` says (a Reconfigure took effect, at a step boundary or after a restart)."""

    job_id: str
    exec: ExecConfig


@dataclass(frozen=True, slots=True)
class RankReport(Event):
    """Per-rank step times of a running job (rank order), for calibration policies."""

    job_id: str
    step_times: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class TotalDeclared(Event):
    """The job's script declared its total iterations (meshsched.job's hello): the estimate follows it."""

    job_id: str
    iterations: int


@dataclass(frozen=True, slots=True)
class ModelFitted(Event):
    """A FitModel finished: `model` is what its fit returned (policies read it as `view.model`)."""

    model: Any


@dataclass(frozen=True, slots=True)
class HoldRequested(Event):
    """Keep a queued job out of the queue until ReleaseRequested (a running job is not affected)."""

    job_id: str


@dataclass(frozen=True, slots=True)
class ReleaseRequested(Event):
    """Lift a user hold: the job is queued again once its dependencies allow."""

    job_id: str


@dataclass(frozen=True, slots=True)
class RequeueRequested(Event):
    """Checkpoint a running job and queue it again (Slurm's requeue); it resumes from the checkpoint."""

    job_id: str


@dataclass(frozen=True, slots=True)
class JobsForgotten(Event):
    """Retention: ended jobs leave the engine's state (job control's `on_forget`; only ended ones, others are
    ignored). A queued job's dependency on one that it satisfied is dropped first; one that it never will stays,
    naming a job the engine no longer knows, which never satisfies it (DependencyNeverSatisfied)."""

    job_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DrainChanged(Event):
    """An operator took GPUs of `node` out of service (`drain`), or gave them back: running jobs there finish,
    nothing new starts there while drained (meshsched.drain). `gpus`: local indices, () for the whole node."""

    node: str
    gpus: tuple[int, ...] = ()
    drain: bool = True
    reason: str = ""
    by: str = ""  # who said so
    since: float | None = None  # when the drain was said (None: the event's time); kept across restarts


@dataclass(frozen=True, slots=True)
class GpuFault(Event):
    """One GPU's fault domain went down: under MPS a fatal fault in one client (`culprit`), or the GPU's MPS server
    dying (`culprit` None), ended every client on that GPU. Sent once the processes of the jobs on it are gone.
    The culprit fails as any failing job does; every other job on the GPU is requeued from its checkpoint,
    uncharged, and none of them is paired with another of them again (meshsched.faults)."""

    gpu: int  # global GPU index
    culprit: str | None = None
    reason: str = ""  # what happened (the culprit's failure reason; "" says it in general words)
