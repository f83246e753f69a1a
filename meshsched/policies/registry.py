"""Policies by name: `fifo`, `sjf`, `srtf`, `las`, and `NAME@SECONDS` for periodic activation."""

from __future__ import annotations

from collections.abc import Callable

from meshsched.policies.base import SchedulingPolicy
from meshsched.policies.queue import Fifo, LeastAttained, QueueScheduler, ShortestJob, ShortestRemaining


MIN_INTERVAL = 1.0  # seconds; a shorter activation interval is a busy loop, not a policy


class UnknownPolicy(ValueError):
    pass


def _fifo(interval: float | None) -> SchedulingPolicy:
    return QueueScheduler("fifo", Fifo(), strict=True, interval=interval)


def _sjf(interval: float | None) -> SchedulingPolicy:
    return QueueScheduler("sjf", ShortestJob(), interval=interval)


def _srtf(interval: float | None) -> SchedulingPolicy:
    return QueueScheduler("srtf", ShortestRemaining(), preemptive=True, interval=interval)


def _las(interval: float | None) -> SchedulingPolicy:
    return QueueScheduler("las", LeastAttained(), preemptive=True, interval=interval)


POLICIES: dict[str, tuple[Callable[[float | None], SchedulingPolicy], str]] = {
    "fifo": (_fifo, "first come first served, head-of-line blocking, non-preemptive"),
    "sjf": (_sjf, "shortest expected duration first, backfills, non-preemptive"),
    "srtf": (_srtf, "shortest remaining time first, preempts on every arrival and release"),
    "las": (_las, "Tiresias-style 2D-LAS: least attained GPU-time first, preemptive, needs no duration"),
}


def make_policy(spec: str) -> SchedulingPolicy:
    """Build a fresh policy from its name, e.g. `srtf` or `srtf@360` (periodic, every 360 s)."""
    name, _, every = spec.strip().partition("@")
    entry = POLICIES.get(name)
    if entry is None:
        raise UnknownPolicy(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))} (add @SECONDS for periodic)")
    interval = None
    if every:
        try:
            interval = float(every)
        except ValueError:
            raise UnknownPolicy(f"policy {spec!r}: the interval after @ must be seconds, got {every!r}") from None
        if not MIN_INTERVAL <= interval < float("inf"):
            raise UnknownPolicy(f"policy {spec!r}: the interval must be a finite number of seconds >= {MIN_INTERVAL:g}")
    policy = entry[0](interval)
    if interval is not None:
        policy.name = f"{name}@{every}"
    return policy


def _castor(interval: float | None) -> SchedulingPolicy:
    from meshsched.policies.castor import Castor

    return Castor()


def _sjf_ffs(interval: float | None) -> SchedulingPolicy:
    from meshsched.policies.castor import SjfFfs

    return SjfFfs()


def _lucid(interval: float | None) -> SchedulingPolicy:
    from meshsched.policies.castor import Lucid

    return Lucid()


POLICIES.update({
    "castor": (_castor, "Castor SJF-BSBF: SJF; shares a single-job GPU only when the pair's mean JCT beats waiting"),
    "sjf-ffs": (_sjf_ffs, "SJF with first-fit GPU sharing whenever free GPUs are short"),
    "lucid": (_lucid, "Lucid-like: shares only equal-size jobs whose combined profiled utilisation stays <= 1"),
})
