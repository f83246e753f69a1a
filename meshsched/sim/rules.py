"""Simulator rules: the small conventions a replay follows, meshsched's own or a published simulator's.

`SimRules` says whether a start pays the model's load time, what a restart after a preemption costs, and
whether events are delivered one by one (a scheduling pass after each) or once per time step (one pass for
all events of a step). `RULES` names the presets; docs/simulator-rules.md says which place in Lucid's
simulator each rule of the `lucid` preset follows. `SteppedStack` is the policy stack of a time-stepped
replay: it holds back the passes of all but the last event of a step and runs one pass for them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshsched.policies.abilities import Periodic
from meshsched.policies.base import ClusterView, Decision, Trigger
from meshsched.policies.stack import PolicyStack


@dataclass(frozen=True)
class SimRules:
    """load_time: a start (and, with no restart charge, a restart) pays the model's load time before training.
    restart_charge_s: fixed seconds a restart after a preemption costs (checkpoint and cold start together,
    paid while the restarted job holds its GPUs; the preemption itself frees them at once); None: the model's
    pause time at the preemption plus its load time at the restart. restart_charge_large_s: the same for jobs
    of more than `large_job_gpus` GPUs (None: restart_charge_s). time_step_s: deliver events at the nearest
    multiple of the step and run one scheduling pass per step; None: a pass per event.
    preemptive_end_lag_s: under a preemptive policy a job gives its GPUs back this long after its last
    iteration (Lucid's srtf counts the remaining seconds down and notices zero one step later).
    trace_durations: a job runs for exactly its trace duration wherever it runs, and SJF ranks it by exactly that
    duration (meshsched.sim.durations: a whole-second duration d is replayed as d iterations of 1 s)."""

    load_time: bool = True
    restart_charge_s: float | None = None
    restart_charge_large_s: float | None = None
    large_job_gpus: int = 8
    time_step_s: float | None = None
    preemptive_end_lag_s: float = 0.0
    trace_durations: bool = False

    def __post_init__(self) -> None:
        for name in ("restart_charge_s", "restart_charge_large_s"):
            v = getattr(self, name)
            if v is not None and not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {v!r}")
        if self.time_step_s is not None and not (self.time_step_s > 0 and math.isfinite(self.time_step_s)):
            raise ValueError(f"time_step_s must be a positive number of seconds, got {self.time_step_s!r}")
        if not (self.preemptive_end_lag_s >= 0 and math.isfinite(self.preemptive_end_lag_s)):
            raise ValueError(f"preemptive_end_lag_s must be a finite number of seconds >= 0, got {self.preemptive_end_lag_s!r}")

    def restart_charge(self, gpus: int) -> float | None:
        """Seconds a restart of a job of `gpus` GPUs costs under a fixed charge; None: model-based."""
        if self.restart_charge_s is None:
            return None
        if gpus > self.large_job_gpus and self.restart_charge_large_s is not None:
            return self.restart_charge_large_s
        return self.restart_charge_s

    def step_of(self, at: float) -> float:
        """The step boundary an event at `at` is delivered at: the nearest (halves go up). Lucid's times are whole
        seconds; ours carry the rounding of a trace duration to whole iterations (under half a step on the
        reference GPU type), which the nearest boundary undoes. An event pushed at or after a boundary `now`
        is never delivered before `now`."""
        s = self.time_step_s
        return at if s is None else math.floor(at / s + 0.5) * s

    def step_after(self, at: float) -> float:
        """The first step boundary at or after `at`: where a timer goes, since a policy
        woken before its time would only ask for the same time again."""
        s = self.time_step_s
        return at if s is None else math.ceil(at / s) * s


RULES: dict[str, SimRules] = {
    "meshsched": SimRules(),
    # Lucid's simulation/: no load time, 40 s per restart (60 s over 8 GPUs), one pass per 1 s step, srtf's end
    # lag, and each job runs (and sjf ranks it) by the trace's own duration
    "lucid": SimRules(load_time=False, restart_charge_s=40.0, restart_charge_large_s=60.0, time_step_s=1.0,
                      preemptive_end_lag_s=1.0, trace_durations=True),
}


def rules_named(name: str) -> SimRules:
    try:
        return RULES[name.strip()]
    except KeyError:
        raise ValueError(f"unknown simulator rules {name!r}; known: {', '.join(RULES)}") from None


def check_policy(rules: SimRules, stack: PolicyStack) -> None:
    """Refuse a periodic policy under a time step: it already decides once per interval, and holding back its
    passes would lose the releases its activation needs to see (ValueError, one line)."""
    owner = stack.preemption if stack.preemption is not None else stack.placement
    if rules.time_step_s is not None and isinstance(owner, Periodic) and owner.interval is not None:
        raise ValueError(f"policy {stack.name}: a periodic policy does not combine with time-stepped rules "
                         "(it already decides once per interval)")


class SteppedStack(PolicyStack):
    """A stack whose passes are held while `hold` is set (the replay sets it while more events of the same
    step follow); the pass of the step's last event stands for them all. Its trigger: TICK if a timer fired
    in the step, ARRIVAL if the step's only trigger was one arrival, else RELEASE (a full pass)."""

    def __init__(self, stack: PolicyStack) -> None:
        super().__init__(stack.name, stack.placement, stack.preemption, stack.calibration, stack.plan)
        self.hold = False
        self._held: list[Trigger] = []

    @property
    def pending(self) -> bool:
        """A held pass has not run yet."""
        return bool(self._held)

    def schedule(self, view: ClusterView, now: float, trigger: Trigger) -> list[Decision]:
        if self.hold:
            self._held.append(trigger)
            return []
        held, self._held = self._held + [trigger], []
        if Trigger.TICK in held:
            trigger = Trigger.TICK
        elif held != [Trigger.ARRIVAL]:
            trigger = Trigger.RELEASE
        return super().schedule(view, now, trigger)
