"""Optional abilities of a policy, as named Protocols (Kubernetes' `EnqueueExtensions`): a caller asks
`can(policy, Admits)` (or `isinstance`), never probes attributes by name. The layers' own Protocols are in
meshsched.policies.base; `members` lists what a Protocol asks for (the registry checks outside policies with it).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from meshsched.state import Job, JobSpec


@runtime_checkable
class RemembersState(Protocol):
    """A preemption layer whose memory (`Remember`) a single server journals as text and reads back at a
    restart (Lazer: deferrals and observations)."""

    def encode_memory(self, memory: object) -> str:
        """The memory as text; `decode_memory` gives back an equal value."""
        ...

    def decode_memory(self, text: str) -> object:
        """The memory from `encode_memory`'s text (ValueError, KeyError or TypeError when unreadable)."""
        ...


@runtime_checkable
class Admits(Protocol):
    """A placement layer that refuses at submission a job it could never run (Rubick: no feasible plan)."""

    def admission_error(self, view, spec: JobSpec) -> str | None:
        """Why `spec` could never run here (one line), or None."""
        ...


@runtime_checkable
class Preempts(Protocol):
    """A queue policy that may evict (`QueueScheduler`): when `preemptive`, alone it owns the pass over a
    greedy placement in its own `order`."""

    name: str
    order: object
    preemptive: bool


@runtime_checkable
class RanksVictims(Protocol):
    """A queue ordering with its own (faster) ranking of the jobs that may be preempted, worst first."""

    def worst_first(self, jobs, now: float) -> list[tuple[tuple, Job]]: ...


@runtime_checkable
class Prefills(Protocol):
    """An interference predictor that answers a whole GPU type's pairs in one batch ahead of a pass."""

    def prefill(self, gpu_type: str) -> None: ...


@runtime_checkable
class PredictsInterference(Protocol):
    """A layer that judges pairs with an interference model: the simulated world slows shared jobs by the same one."""

    interference: object


@runtime_checkable
class ModelsMpsShare(Protocol):
    """A calibration layer with an MPS-share model: the simulated world runs squeezed jobs at the same rates."""

    mps_share: object


@runtime_checkable
class KeepsShareLog(Protocol):
    """A placement layer that records every shared start (job -> what sharing was predicted to gain)."""

    share_log: dict


@runtime_checkable
class PlansStarts(Protocol):
    """A plan layer that sets the plan and CPUs of each job the pass starts (the Start's exec)."""

    def plan_start(self, view, start): ...


@runtime_checkable
class Periodic(Protocol):
    """A layer that decides once per `interval` seconds (None: on every event)."""

    interval: float | None


def members(protocol: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(methods, data members) a Protocol class declares, each sorted by name."""
    methods = sorted(k for k, v in vars(protocol).items() if not k.startswith("_") and callable(v))
    data = sorted(k for k in getattr(protocol, "__annotations__", {}) if not k.startswith("_"))
    return tuple(methods), tuple(data)


_CAN: dict[tuple[type, type], bool] = {}


def can(obj: object, protocol: type) -> bool:
    """isinstance(obj, protocol) for a Protocol of methods only, remembered per class: a runtime Protocol check costs
    ~40 us, and passes ask on every event. (A Protocol with data members is an instance's matter: TypeError.)"""
    key = (type(obj), protocol)
    got = _CAN.get(key)
    if got is None:
        if members(protocol)[1]:
            raise TypeError(f"{protocol.__name__} has data members: ask isinstance")
        got = _CAN[key] = isinstance(obj, protocol)
    return got
