"""Every environment variable the training side reads, in one place (AdaptDL's `env` module habit).

meshd's supervisor sets the MESH_* variables and torchrun's contract (RANK, WORLD_SIZE, ...); a script run
standalone sees none of the MESH_* ones and gets defaults that turn the SDK's meshd features off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshsched.perf.plans import ExecutionPlan

DEFAULT_GRACE = 60.0  # seconds from a checkpoint-and-exit request to the hard stop
DEFAULT_KEEP = 2  # checkpoints kept on disk
DEFAULT_REPORT_INTERVAL = 1.0  # seconds between report frames (and directive polls)


@dataclass(frozen=True, slots=True)
class MeshEnv:
    """The job's view of its environment (read once, at attach time)."""

    job_id: str | None
    socket: str | None
    checkpoint_dir: str | None
    restart_count: int
    rank: int
    world_size: int
    local_rank: int
    grace: float
    keep: int
    report_interval: float
    micro_batch: int | None = None  # MESH_MICRO_BATCH: per-GPU micro-batch meshd chose (its ExecConfig)
    accum_steps: int | None = None  # MESH_ACCUM_STEPS: accumulation steps; micro_batch x accum_steps = local batch
    plan: str | None = None  # MESH_PLAN: the execution plan to train with (`dp2-tp1-pp1-ga2-gc`), None: none given

    def execution_plan(self) -> ExecutionPlan | None:
        """MESH_PLAN parsed (meshsched.perf.plans.ExecutionPlan: dp, tp, pp, ga, gc, zero, offload), or None."""
        if self.plan is None:
            return None
        from meshsched.perf.plans import ExecutionPlan

        return ExecutionPlan.parse(self.plan)

    @property
    def under_meshd(self) -> bool:
        return self.job_id is not None

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> MeshEnv:
        e = os.environ if environ is None else environ
        return cls(
            job_id=e.get("MESH_JOB_ID") or None,
            socket=e.get("MESH_SOCKET") or None,
            checkpoint_dir=e.get("MESH_CHECKPOINT_DIR") or None,
            restart_count=int(e.get("MESH_RESTART_COUNT", "0")),
            rank=int(e.get("RANK", "0")),
            world_size=int(e.get("WORLD_SIZE", "1")),
            local_rank=int(e.get("LOCAL_RANK", "0")),
            grace=float(e.get("MESH_GRACE_PERIOD", DEFAULT_GRACE)),
            keep=max(1, int(e.get("MESH_CHECKPOINT_KEEP", DEFAULT_KEEP))),
            report_interval=float(e.get("MESH_REPORT_INTERVAL", DEFAULT_REPORT_INTERVAL)),
            micro_batch=_positive(e, "MESH_MICRO_BATCH"),
            accum_steps=_positive(e, "MESH_ACCUM_STEPS"),
            plan=_plan(e),
        )


def _plan(e: Mapping[str, str]) -> str | None:
    """MESH_PLAN in its canonical form (unset or empty: None); a malformed plan is a clear error."""
    text = e.get("MESH_PLAN") or None
    if text is None:
        return None
    from meshsched.perf.plans import ExecutionPlan, InvalidPlan

    try:
        return str(ExecutionPlan.parse(text))
    except InvalidPlan as exc:
        raise ValueError(f"MESH_PLAN={text!r}: {exc}") from None


def _positive(e: Mapping[str, str], name: str) -> int | None:
    """An optional integer >= 1 (unset or empty: None); anything else is a clear error."""
    text = e.get(name) or None
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name}={text!r}: must be an integer >= 1")
    return value
