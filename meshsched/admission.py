"""Admission: why a job could never run here, in one line (None: it may be queued). Pure functions over the
cluster state and the policy stack, shared by meshd's API, the mesh and the simulator through the engine.

Two doors: `refusal` is what the engine fails a submitted job for (CPUs or host memory per node, what the
policy stack refuses); `admission_error` adds the GPU count, checked before a job is given an id (meshd). A job
larger than the live cluster that got past the door is queued, not failed: it waits for nodes to join
(pending reason Unschedulable), as the engine and the simulator always did.
"""

from __future__ import annotations

from meshsched.policies.abilities import Admits, can
from meshsched.policies.base import ClusterView
from meshsched.policies.stack import PolicyStack
from meshsched.state import ClusterState, JobSpec


def admission_error(state: ClusterState, policy: PolicyStack, view: ClusterView, spec: JobSpec) -> str | None:
    """Why `spec` could never run (one line), or None: more GPUs than the live nodes have (unchecked while no
    node is alive), then `refusal`."""
    return gpu_error(state, spec) or refusal(state, policy, view, spec)


def gpu_error(state: ClusterState, spec: JobSpec) -> str | None:
    """More GPUs than the live nodes have in total (None while no node is alive: nothing to compare with)."""
    total = state.total_gpus
    if total and spec.gpus > total:
        return f"--gpus {spec.gpus}: the live nodes have only {total} GPU(s)"
    return None


def refusal(state: ClusterState, policy: PolicyStack, view: ClusterView, spec: JobSpec) -> str | None:
    """More CPUs or host memory per node than any live node has, or what the policy stack refuses (an
    infeasible plan, a guarantee over the tenant's quota)."""
    return resource_error(state, spec) or (policy.admission_error(view, spec) if admits(policy) else None)


def admits(policy: PolicyStack) -> bool:
    """Whether the stack's placement layer has an admission check (a stand-in stack without layers, as benchmarks
    build, admits through its own `admission_error`)."""
    placement = getattr(policy, "placement", None)
    return placement is None or can(placement, Admits)


def resource_error(state: ClusterState, spec: JobSpec) -> str | None:
    """More CPUs or host memory for a node's share of the job than any live node has (None: no node is alive)."""
    if spec.cpus is None and spec.memory_gb is None:
        return None  # asks for its GPUs' share: nothing to compare (most jobs; every arrival asks)
    nodes = [n for n in state.nodes.values() if n.alive]
    if not nodes:
        return None
    for what, asked, have in (("CPUs", spec.cpus, lambda n: n.cpus),
                              ("GB of memory", spec.memory_gb, lambda n: n.host_memory_gb)):
        if asked is None:
            continue
        per_gpu = asked / spec.gpus
        if not any(per_gpu * min(spec.gpus, n.size) <= have(n) + 1e-9 for n in nodes):
            most = max(have(n) for n in nodes)
            return (f"asks for {asked:g} {what} over {spec.gpus} GPU(s) ({per_gpu:g} per GPU); no node has "
                    f"that many for its share (the most a node has is {most:g})")
    return None
