"""Largest job first, on free GPUs: an example of a meshsched policy from outside the repository.

A policy class is built as `cls(handle)` (meshsched.policies.stack.PolicyHandle: models, seed, RNG) and is
checked against its layer's Protocol (meshsched.policies.base); this one is a placement policy built on the
queue scheduler the baselines use, with its own queue order.
"""

from __future__ import annotations

from meshsched.policies.queue import QueueScheduler
from meshsched.policies.stack import PolicyHandle
from meshsched.state import Job


class LargestJob:
    """Queue order: the job asking for the most GPUs first, then the earliest submitted."""

    name = "largest-first"

    def priority(self, job: Job, now: float) -> tuple:
        return (-job.spec.gpus, job.spec.submit_time)


class LargestFirst(QueueScheduler):
    """Largest job first: starts the queued job asking for the most GPUs that fits (backfills, never preempts)."""

    def __init__(self, handle: PolicyHandle) -> None:
        super().__init__("largest-first", LargestJob())
