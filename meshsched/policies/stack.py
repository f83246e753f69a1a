"""A stack of policies, one per layer, and the handle every policy is built with.

The engine talks to a `PolicyStack` only: its queue order, its pass (the preemption layer owns the pass when
there is one, asking the placement layer to start each job; otherwise the placement layer runs it), its
calibration after per-rank reports, and its timer. `PolicyHandle` is what a factory hands a policy: the
performance model, the interference predictor, the MPS-share model and a seeded RNG, so no policy loads anything
itself, and what the cluster allows (whether GPUs serve one user at a time). A model the handle leaves out comes
from its `Profiles`, a provider the caller passes in (meshsched.loaders.profiles.INSTALLED): the core reads no file.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol

from meshsched.perf.interference import Interference
from meshsched.perf.model import PerfModel
from meshsched.perf.mps_share import MpsShareModel
from meshsched.perf.plans import PlanCatalog, PlanPerfModel
from meshsched.policies.abilities import Admits, PlansStarts, RemembersState, can
from meshsched.policies.base import (
    CalibrationPolicy, ClusterView, Cycle, Decision, Evict, PlacementPolicy, PlanPolicy, PreemptionPolicy, Reconfigure,
    Start, Trigger,
)
from meshsched.policies.solo import is_solo, solo_reconfigures
from meshsched.state import Job


class Profiles(Protocol):
    """Where the models a handle leaves out come from (each read once, when a policy needing it is built)."""

    def perf(self) -> PerfModel: ...

    def interference(self) -> Interference: ...

    def mps_share(self) -> MpsShareModel: ...

    def plan_catalog(self, gpu_type: str = "a800") -> PlanCatalog: ...


@dataclass(frozen=True)
class PolicyHandle:
    """Models handed to policies at build time (the Kubernetes scheduler framework's `Handle`)."""

    perf: PerfModel | PlanPerfModel | None = None
    interference: Interference | None = None
    seed: int = 1
    rng: random.Random = field(default=None, compare=False)  # type: ignore[assignment]
    mps_share: MpsShareModel | None = None
    # A property of the cluster: GPUs are shared through MPS by jobs of several users, and an MPS server serves
    # one user at a time, so a sharing policy pairs only jobs of the same user (meshd: MPS on and submit_users).
    one_user_per_gpu: bool = False
    profiles: Profiles | None = None  # the models left out above (None: a policy needing one is refused)

    def __post_init__(self) -> None:
        if self.rng is None:
            object.__setattr__(self, "rng", random.Random(self.seed))


@dataclass
class PolicyStack:
    name: str
    placement: PlacementPolicy
    preemption: PreemptionPolicy | None = None
    calibration: CalibrationPolicy | None = None
    plan: PlanPolicy | None = None
    # Whether a job may hold a partner's settings (`meshsched.policies.solo`): True until a pass finds none, then
    # set again by a decision that squeezes one; so a stack that never shares never looks.
    _squeezed: bool = field(default=True, init=False, repr=False, compare=False)

    @property
    def may_hold_partner_settings(self) -> bool:
        """Whether a job may still hold a partner's settings (`meshsched.policies.solo`: a release's pass looks)."""
        return self._squeezed

    def queue_key(self, job: Job) -> tuple:
        owner = self.preemption if self.preemption is not None else self.placement
        return owner.queue_key(job)

    def schedule(self, view: ClusterView, now: float, trigger: Trigger) -> list[Decision]:
        cycle = Cycle(view, now, trigger)
        if self.preemption is not None:
            out = self.preemption.schedule(view, cycle, self.placement)
        else:
            out = self.placement.place(view, cycle)
        cycle.scratch.clear()  # (a policy's scratch may name the cycle: freed now, not by the cyclic collector)
        if self.plan is not None:
            out = self._with_plans(view, now, list(out))
        if self._squeezed and trigger is not Trigger.ARRIVAL:  # GPUs came free (or a timer): partners may have left
            solo, self._squeezed = solo_reconfigures(view, out)
            if solo:
                out = [*out, *solo]
        if not self._squeezed and out:
            for d in out:  # (a loop, not any(): once per pass)
                if type(d) in (Start, Reconfigure) and d.exec is not None and not is_solo(d.exec):
                    self._squeezed = True
                    break
        return out

    def _with_plans(self, view: ClusterView, now: float, out: list[Decision]) -> list[Decision]:
        """The plan layer's plans for the jobs the pass starts (`PlansStarts`), then its changes to running jobs
        the pass leaves alone (not those it evicts or reconfigures)."""
        if can(self.plan, PlansStarts):
            out = [self.plan.plan_start(view, d) if type(d) is Start else d for d in out]
        busy = {d.job_id for d in out if type(d) in (Evict, Reconfigure)}
        return out + [d for d in self.plan.replan(view, now) if d.job_id not in busy]

    def admission_error(self, view: ClusterView, spec) -> str | None:
        """Why the placement layer could never run `spec` (one line), or None (a layer without the check: None)."""
        return self.placement.admission_error(view, spec) if can(self.placement, Admits) else None

    def remembers(self) -> RemembersState | None:
        """The preemption layer when it can journal its memory as text (`RemembersState`), else None."""
        return self.preemption if can(self.preemption, RemembersState) else None

    def calibrate(self, view: ClusterView, job: Job, now: float) -> list[Reconfigure]:
        if self.calibration is None:
            return []
        out = self.calibration.calibrate(view, job, now)
        if not self._squeezed:
            self._squeezed = any(not is_solo(d.exec) for d in out)
        return out

    def next_timer(self, view: ClusterView, now: float) -> float | None:
        owner = self.preemption if self.preemption is not None else self.placement
        return owner.next_timer(view, now)
