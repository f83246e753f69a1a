"""Confining a job to the CPUs and memory meshd allocated it (config `confine`, docs/daemon.md "Confinement").

CPUs: each run of a job gets concrete CPU ids from the node's usable set (the CPUs meshd may run on, the first
`reserved_cpus` of them left to the system), as many as it was allocated: the allocator's CPUs per GPU (Rubick),
else `--cpus` over its GPUs, else the node's share per GPU -- each times its GPUs on this node. `pick_cpus`
takes the CPUs the fewest running jobs hold, so jobs get disjoint sets while the node's CPUs allow and share the
least-used ones past that. The supervisor sets that affinity before it starts a rank (every rank and thread
inherits it); under systemd the scope also gets AllowedCPUs. The ids are journaled with the job, so a restarted
meshd that re-adopts a running job does not hand them out again.

Memory: the job's allocation (Rubick's per GPU, else `--mem`, else the node's share per GPU) becomes a limit
where meshd can set one: a systemd scope's MemoryMax, else a cgroup of its own per run (`mesh-job-ID-RUN`) under
a writable cgroup v2 hierarchy (memory.max, swap off) or cgroup v1 memory hierarchy (memory.limit_in_bytes and
memsw) that the supervisor moves itself into before it starts a rank. The kernel OOM-kills a job past its
limit; the supervisor reads the cgroup's oom_kill count and reports the job FAILED "exceeded its memory limit
of X GiB". Where no mechanism is usable meshd logs it once at start, `mesh nodes` and `mesh show` say so, and
jobs run unconfined: confinement never fails a job.
"""

from __future__ import annotations

import errno
import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from meshsched.daemon.hostres import machine_cpu_ids

LOG = logging.getLogger("meshd")
CGROUP_FS = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
JOBS_CGROUP = "mesh-jobs-"  # meshd's job cgroups live under mesh-jobs-<tag of its state dir>
GIB = 2**30
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True, slots=True)
class Limits:
    """What one run of a job is confined to on this node."""

    cpus: tuple[int, ...] = ()  # CPU ids (empty: not pinned)
    memory_gb: float | None = None  # GiB it was allocated here (None: none)
    memory_by: str = ""  # what enforces the memory limit: systemd | cgroup v2 | cgroup v1 ("": nothing)


def format_cpus(cpus: Iterable[int]) -> str:
    """CPU ids as a list with ranges, as Cpus_allowed_list and AllowedCPUs= write them: 0-3,8."""
    out: list[str] = []
    ids = sorted(set(cpus))
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def parse_cpus(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out += range(int(lo), int(hi or lo) + 1)
    return tuple(out)


def usable_cpus(node_cpus: int, reserved: int) -> tuple[int, ...]:
    """The CPU ids jobs may get: the ones meshd may run on (at most `node_cpus` of them when set), less the
    first `reserved` (kept for the system) while that leaves one."""
    ids = machine_cpu_ids()
    if node_cpus:
        ids = ids[:node_cpus]
    return tuple(ids[reserved:] if reserved < len(ids) else ids)


def pick_cpus(pool: Sequence[int], count: int, in_use: Iterable[Sequence[int]]) -> tuple[int, ...]:
    """`count` CPU ids from `pool` (at most all of it): those the fewest running jobs hold, lowest id first."""
    load = {c: 0 for c in pool}
    for cpus in in_use:
        for c in cpus:
            if c in load:
                load[c] += 1
    return tuple(sorted(sorted(pool, key=lambda c: (load[c], c))[: max(1, min(count, len(pool)))]))


def allocated(per_gpu: float | None, asked: float | None, asked_gpus: int, share: float, local: int) -> float:
    """A job's CPUs or memory on this node: the allocator's per GPU, else what it asked over its GPUs, else
    the node's share per GPU; each times its `local` GPUs here."""
    if per_gpu:
        return per_gpu * local
    if asked:
        return asked * local / max(1, asked_gpus)
    return share * local


def thread_env(cpus: int, ranks: int, user_env: dict[str, str]) -> dict[str, str]:
    """OMP/MKL/OpenBLAS threads per rank: its share of the job's CPUs (unless the submitter set them)."""
    n = str(max(1, cpus // max(1, ranks)))
    return {k: n for k in THREAD_VARS if k not in user_env}


def oom_kills(proc_cgroup: Path = PROC_SELF_CGROUP, root: Path = CGROUP_FS) -> int:
    """How many processes the kernel OOM-killed in the memory cgroup of the process whose /proc/PID/cgroup is
    `proc_cgroup` (v2 memory.events, else v1 memory.oom_control); 0 when it cannot tell."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            where, name = root / path.lstrip("/") / "memory.events", "oom_kill"
        elif "memory" in controllers.split(","):
            where, name = root / "memory" / path.lstrip("/") / "memory.oom_control", "oom_kill"
        else:
            continue
        try:
            for row in where.read_text().splitlines():
                key, _, value = row.partition(" ")
                if key == name and int(value) > 0:
                    return int(value)
        except (OSError, ValueError):
            pass
    return 0


def join_cgroup(path: str) -> None:
    """Move the calling process into the cgroup directory `path` (its children follow it)."""
    with open(Path(path) / "cgroup.procs", "w") as fh:
        fh.write(str(os.getpid()))


class Confiner:
    """How this node confines jobs; built once at start (`open_confiner`)."""

    def __init__(self, pool: tuple[int, ...], pin: bool, memory_by: str = "", why_not: str = "",
                 parent: Path | None = None) -> None:
        self.pool = pool  # CPU ids jobs may get
        self.pin = pin  # CPU affinity is set
        self.memory_by = memory_by  # systemd | cgroup v2 | cgroup v1 | "" (memory limits not enforced)
        self.why_not = why_not  # why memory limits are not enforced
        self.parent = parent  # (cgroup v2 / v1) the cgroup job cgroups are made under

    def view(self) -> dict:
        """`mesh nodes --json`'s "confinement"."""
        return {"cpus": "affinity" if self.pin else "not pinned", "memory": self.memory_by or "not enforced",
                **({"why": self.why_not} if self.why_not else {})}

    def limits(self, cpus: float, memory_gb: float, in_use: Iterable[Sequence[int]]) -> Limits:
        """A run's CPU ids and memory limit from what it was allocated here (`cpus` from `allocated`)."""
        ids = pick_cpus(self.pool, int(cpus), in_use) if self.pin and self.pool else ()
        return Limits(ids, round(memory_gb, 3) if memory_gb > 0 else None, self.memory_by if memory_gb > 0 else "")

    def systemd_properties(self, limits: Limits) -> list[str]:
        """systemd-run options putting the limits on the job's scope."""
        out = []
        if limits.cpus:
            out += ["-p", f"AllowedCPUs={format_cpus(limits.cpus)}"]
        if limits.memory_gb is not None and self.memory_by == "systemd":
            out += ["-p", f"MemoryMax={int(limits.memory_gb * GIB)}"]
        return out

    def make_cgroup(self, job_id: str, run: int, limits: Limits) -> str | None:
        """(cgroup v2 / v1) The run's cgroup with its memory limit; None (logged) when it cannot be made."""
        if self.parent is None or limits.memory_gb is None or self.memory_by not in ("cgroup v2", "cgroup v1"):
            return None
        path = self.parent / f"mesh-job-{job_id}-{run}"  # "/mesh-job-" is how daemon/procs.py tells it
        limit = str(int(limits.memory_gb * GIB))
        try:
            path.mkdir(exist_ok=True)
            if self.memory_by == "cgroup v2":
                (path / "memory.max").write_text(limit)
                _write_if_present(path / "memory.swap.max", "0")
            else:
                (path / "memory.limit_in_bytes").write_text(limit)
                _write_if_present(path / "memory.memsw.limit_in_bytes", limit)  # swap counts: no escape by it
        except OSError as exc:
            LOG.warning("job %s: its memory limit is not enforced: cannot set up cgroup %s: %s", job_id, path,
                        exc.strerror)
            self.remove(job_id)
            return None
        return str(path)

    def remove(self, job_id: str = "") -> bool:
        """Remove the job's (empty) cgroups, every run's ("": every job's); True when none is left."""
        if self.parent is None:
            return True
        try:
            entries = list(self.parent.glob(f"mesh-job-{job_id}-*" if job_id else "mesh-job-*"))
        except OSError:
            return True
        left = False
        for path in entries:
            if not job_id or path.name.rpartition("-")[0] == f"mesh-job-{job_id}":
                try:
                    path.rmdir()
                except OSError:
                    left = True  # a process is still in it (it is removed with the job's next exit)
        return not left

    def close(self) -> None:
        """(meshd stops) Remove the parent of its job cgroups when no job's is left in it (running jobs keep
        theirs, and the next meshd finds them there)."""
        if self.parent is not None and self.parent.name.startswith(JOBS_CGROUP):
            try:
                self.parent.rmdir()
            except OSError:
                pass


def _write_if_present(path: Path, text: str) -> None:
    if path.exists():
        path.write_text(text)


def open_confiner(mode: str, pool: tuple[int, ...], systemd: bool, cgroup_root: Path | None = None,
                  tag: str = "", fs: Path = CGROUP_FS, proc_cgroup: Path = PROC_SELF_CGROUP) -> Confiner:
    """The node's confinement: CPU affinity unless `mode` is no; memory limits (mode auto) through systemd
    scopes, else a writable cgroup v2, else cgroup v1 memory hierarchy. Logs once when memory is not limited.
    `tag` names this meshd's job cgroups apart from another's on the machine (its state dir's)."""
    if mode == "no":
        return Confiner(pool, False, why_not="confine = no")
    if mode == "cpus":
        return Confiner(pool, True, why_not="confine = cpus")
    if systemd:
        return Confiner(pool, True, "systemd")
    kind, parent, why = _cgroup_parent(cgroup_root, JOBS_CGROUP + (tag or "meshd"), fs, proc_cgroup)
    if parent is None:
        LOG.warning("memory limits are not enforced on this node: %s (jobs still run, each pinned to its CPUs)", why)
        return Confiner(pool, True, why_not=why)
    LOG.info("jobs' memory limits: %s, job cgroups under %s", kind, parent)
    return Confiner(pool, True, kind, parent=parent)


def _cgroup_parent(root: Path | None, name: str, fs: Path, proc_cgroup: Path) -> tuple[str, Path | None, str]:
    """(kind, the cgroup job cgroups go under, "") or ("", None, why not)."""
    if root is not None:
        kind = "cgroup v2" if (root / "cgroup.subtree_control").exists() else "cgroup v1"
        if not os.access(root, os.W_OK):
            return "", None, f"cgroup_root {root} is not writable"
        return kind, root, ""
    try:
        own = proc_cgroup.read_text().splitlines()
    except OSError as exc:
        return "", None, f"cannot read {proc_cgroup}: {exc.strerror}"
    v2 = fs / "cgroup.controllers"
    if v2.exists():  # a unified (v2-only) hierarchy
        if "memory" not in v2.read_text().split():
            return "", None, "the cgroup v2 hierarchy has no memory controller"
        path = next((line[3:] for line in own if line.startswith("0::")), None)
        if path is None:
            return "", None, "meshd's cgroup v2 path is unknown"
        try:
            return "cgroup v2", _v2_parent(fs / path.lstrip("/"), name), ""
        except OSError as exc:
            return "", None, f"no writable cgroup v2 subtree ({exc.strerror or exc})"
    for line in own:  # a hybrid or v1 hierarchy: the memory controller's own mount
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and (fs / "memory" / "memory.limit_in_bytes").exists():
            parent = fs / "memory" / path.lstrip("/") / name
            try:
                parent.mkdir(exist_ok=True)
            except OSError as exc:
                return "", None, f"cannot make {parent} (cgroup v1 memory): {exc.strerror}"
            return "cgroup v1", parent, ""
    return "", None, "no cgroup v2 hierarchy with a memory controller and no cgroup v1 memory hierarchy"


def _v2_parent(own: Path, name: str) -> Path:
    """`own`/`name` with the memory controller on for its children. cgroup v2 hands controllers down only
    from a cgroup without processes of its own (the root aside): in a delegated subtree (systemd Delegate=yes)
    or a container's cgroup namespace meshd first moves itself into a leaf, `own`/meshd. Raises OSError when
    that is not possible (other processes share meshd's cgroup)."""
    parent = own / name
    parent.mkdir(exist_ok=True)
    try:
        _enable_memory(own)
    except OSError as exc:
        if exc.errno != errno.EBUSY:  # busy: processes in `own` (a namespace's root counts, the real one not)
            raise
        leaf = own / "meshd"
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(str(os.getpid()))
        _enable_memory(own)  # EBUSY again: other processes share meshd's cgroup
    _enable_memory(parent)
    return parent


def _enable_memory(cgroup: Path) -> None:
    control = cgroup / "cgroup.subtree_control"
    if "memory" not in control.read_text().split():
        control.write_text("+memory")


def job_limits(confiner: Confiner, asked: tuple[int | None, float | None, int], per_gpu: tuple[int | None, float | None],
               local: int, node: tuple[int, float, int], in_use: Iterable[Sequence[int]]) -> Limits:
    """A run's limits on this node: `asked` (cpus, memory_gb, gpus) of the submit, `per_gpu` (cpus, memory_gb) of
    an allocator (ExecConfig), `local` ranks here, `node` (cpus, memory_gb, gpus) for jobs here."""
    node_cpus, node_memory, node_gpus = node
    cpus = allocated(per_gpu[0], asked[0], asked[2], max(1, node_cpus // max(1, node_gpus)), local)
    memory = allocated(per_gpu[1], asked[1], asked[2], node_memory / max(1, node_gpus), local)
    return confiner.limits(math.ceil(cpus), memory, in_use)
