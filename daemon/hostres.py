"""The node's CPUs and host memory as meshd accounts them (read once, at startup).

A total is what the machine has unless configured: the CPUs this process may run on (its affinity mask, as
`taskset`/cgroup cpusets limit it; else os.cpu_count()) and /proc/meminfo's MemTotal in GiB. What is reserved
for the system (`reserved_cpus`, `reserved_memory_gb`) is taken off. The core gets the result as data: the
`cpus` and `memory_gb` of the node's NodeSpec, which a mesh carries in the node's NodeJoined entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from meshsched.daemon.config import ConfigError, DaemonConfig

MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True, slots=True)
class HostResources:
    cpus: int  # CPU cores for jobs
    memory_gb: float  # host memory for jobs, GiB
    detected_cpus: int  # what the machine has (0: a configured total, not read)
    detected_memory_gb: float


def machine_cpu_ids() -> list[int]:
    """The CPU ids this process may run on (its affinity mask; all of os.cpu_count() where there is none)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def machine_cpus() -> int:
    return len(machine_cpu_ids())


def machine_memory_gb(meminfo: Path = MEMINFO) -> float:
    """MemTotal in GiB; ConfigError when it cannot be read (set node_memory_gb instead)."""
    try:
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            if key == "MemTotal":
                kib = int(rest.split()[0])
                return round(kib / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    raise ConfigError(f"cannot read MemTotal from {meminfo}; set node_memory_gb")


def host_resources(cfg: DaemonConfig, meminfo: Path = MEMINFO) -> HostResources:
    """The node's CPUs and memory for jobs; ConfigError (one line) when the reserve leaves nothing."""
    cpus = cfg.node_cpus or machine_cpus()
    memory = cfg.node_memory_gb or machine_memory_gb(meminfo)
    left_cpus, left_mem = cpus - cfg.reserved_cpus, round(memory - cfg.reserved_memory_gb, 1)
    if left_cpus < 1:
        raise ConfigError(f"reserved_cpus {cfg.reserved_cpus} leaves no CPU for jobs (the node has {cpus})")
    if not left_mem > 0:
        raise ConfigError(f"reserved_memory_gb {cfg.reserved_memory_gb:g} leaves no memory for jobs "
                          f"(the node has {memory:g} GB)")
    return HostResources(left_cpus, left_mem, 0 if cfg.node_cpus else cpus, 0.0 if cfg.node_memory_gb else memory)
