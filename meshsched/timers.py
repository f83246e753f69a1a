"""When the engine next wants a Tick: the policy's own timer, the preemption layer's deferrals, and job control's
times (limits, begin times), folded into the one timer the engine arms with `ScheduleTimer(at, key)`. A Tick
whose key is not the latest was superseded."""

from __future__ import annotations

from meshsched.actions import ScheduleTimer


class Timers:
    __slots__ = ("at", "key", "policy_at", "deferred")

    def __init__(self) -> None:
        self.at: float | None = None  # when the armed timer fires (None: none armed)
        self.key = 0  # the armed timer's key
        self.policy_at: float | None = None  # when the policy's own timer is due
        self.deferred: dict[str, float] = {}  # queued job -> until when a preemption layer deferred it

    def fired(self, key: int) -> bool:
        """A Tick of `key` came: True if it is the armed timer's (which is then spent), False if superseded."""
        if key != self.key or self.at is None:
            return False
        self.at = None
        return True

    def policy_due(self, now: float) -> bool:
        """Whether the policy's own timer or a deferral is due (a Tick was not only for job control's times)."""
        return (self.policy_at is not None and self.policy_at <= now) or any(t <= now for t in self.deferred.values())

    def arm(self, policy_at: float | None, control_at: float | None, now: float, passed: bool) -> ScheduleTimer | None:
        """The timer to arm for the first of `policy_at`, `control_at` and the deferrals (None: the armed one
        stands, or none is needed). `passed`: a scheduling pass ran in this event, so deferrals that ran out
        were seen by it and are dropped (else their pass is still due)."""
        self.policy_at = policy_at
        at = policy_at
        if control_at is not None:
            at = control_at if at is None else min(at, control_at)
        if self.deferred:
            if passed:
                for job_id in [j for j, t in self.deferred.items() if t <= now]:
                    del self.deferred[job_id]
            if self.deferred:
                first = min(self.deferred.values())
                at = first if at is None else min(at, first)
        if at is None:
            self.at = None
            return None
        at = max(at, now)
        if at == self.at:
            return None
        self.key += 1
        self.at = at
        return ScheduleTimer(at, self.key)
