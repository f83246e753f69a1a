"""Settings follow partners: a job squeezed to fit beside a partner goes back to its solo settings once it trains
alone (issue 26, "settings follow partners").

A sharing placement layer (Castor) starts a job next to a partner with a smaller micro-batch and gradient
accumulation so both fit in memory; a calibration layer (Gimbal) gives each job of a packing set an MPS share.
Those settings are about the partner: when the last partner leaves (finishes, is preempted, moves), the job would
otherwise keep them for the rest of its run (the issue's example: micro-batch 2 x 133 steps, 8.6x slower than
solo, for 110 h). `PolicyStack.schedule` asks `solo_reconfigures` after every pass but an arrival's (GPUs came
free, or a timer fired): each running job whose GPUs now hold no other job (and get none in this pass) and whose
settings are not solo gets a `Reconfigure` to its whole per-GPU batch in one step (accumulation 1), a full MPS
share and no memory limit, as the placement layer gives a job that starts alone (`ExecConfig.default_for`). The
per-GPU batch, the per-rank samples (Gimbal's LISS, its own business alone) and anything an execution plan decides
are kept: a job under a plan is the plan layer's (Rubick replans when partners change). The simulator and meshd
drive the same stack, so both get it; a micro-batch change is applied in-process at a step boundary, an MPS
change by a restart. A stack that never squeezes a job never looks (`PolicyStack` keeps a flag).

A job still LOADING when its partner left is left as it is until a later pass finds it RUNNING alone.
"""

from __future__ import annotations

from dataclasses import replace

from meshsched.policies.base import ClusterView, Decision, Evict, Reconfigure, Start
from meshsched.state import ExecConfig, JobState

MPS_FULL = 100


def is_solo(x: ExecConfig | None) -> bool:
    """Whether `x` is what a job gets alone (None: the default, which is): one step per optimizer step, a full
    MPS share, no memory limit. A job under an execution plan counts as solo (the plan layer's settings)."""
    return x is None or x.plan is not None or (
        x.accumulation == 1 and x.mps_percentage == MPS_FULL and x.memory_limit_mb is None)


def solo_exec(x: ExecConfig) -> ExecConfig:
    """`x` with the settings a partner imposed undone: the whole per-GPU batch in one micro-batch, a full MPS
    share, no memory limit (the per-GPU batch, hence the global batch, stays the same)."""
    return replace(x, micro_batch=x.per_gpu_batch, accumulation=1, mps_percentage=MPS_FULL, memory_limit_mb=None)


def solo_reconfigures(view: ClusterView, out: list[Decision]) -> tuple[list[Reconfigure], bool]:
    """Reconfigures for the running jobs that train alone with a partner's settings, after the pass's decisions
    `out` (the GPUs its Starts take count as shared; a job it evicts or reconfigures is left to it), and whether
    any job holding GPUs still has non-solo settings (a job still sharing, loading or pausing)."""
    taken: set[int] = set()
    busy: set[str] = set()
    for d in out:
        kind = type(d)
        if kind is Start:
            taken.update(d.gpus)
        elif kind is Evict or kind is Reconfigure:
            busy.add(d.job_id)
    gpus = view.cluster_state().gpus
    found: list[Reconfigure] = []
    left = False
    for j in view.holding():
        x = j.exec_pending or j.exec
        if is_solo(x):
            continue
        me = j.job_id
        if (j.state is not JobState.RUNNING or me in busy
                or any(g in taken or len(gpus[g].jobs) > 1 for g in j.gpus)):
            left = True
            continue
        to = solo_exec(x)
        found.append(Reconfigure(me, to, f"trains alone now (its partners left): back to {to.describe()}"))
    return found, left
