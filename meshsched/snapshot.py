"""The engine's state at a log position as plain JSON-able data (`encode`), and back into a fresh engine (`decode`).

A mesh's leader writes one every so many log entries so that a node that joins or restarts loads it and replays
only the entries after it (`meshsched.daemon.mesh`). Everything a decision after it depends on is in it: the jobs
(every field, their accounting, exec configs and calibration memos), the queue in its order, the nodes and GPUs
(who holds which, in order), drains, job control (blocked jobs, dependencies, throttled arrays, begin times, time
limits, --signal warnings), the one timer, the jobs holding GPUs in start order, and the preemption layer's memory
where it `RemembersState`. Not in it: the engine's explain log (`mesh explain` on a node that loaded a snapshot
knows only what came after it), a fitted model (derived: Lazer asks for a fit again, as after a single server's
restart), and the policy objects' caches (rebuilt from the state). A stack that keeps decision state of its own
outside the engine (periodic activation, `NAME@SECONDS`) is refused in one line (`refusal`).

Pure: no I/O, no clock. Decoding checks the version and the shape and raises `SnapshotError` (one line) when the
data is not a snapshot this version wrote; the engine it fills must be fresh and built with the same stack.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import fields

from meshsched.drain import DrainRecord
from meshsched.engine import Engine
from meshsched.policies.abilities import RemembersState
from meshsched.state import (
    CalibrationMemo,
    Dependency,
    DependencyKind,
    ExecConfig,
    Gpu,
    Job,
    JobAccounting,
    JobSpec,
    JobState,
    Node,
)

VERSION = 1


class SnapshotError(ValueError):
    """A snapshot this version cannot read (or an engine it cannot write), in one line."""


def refusal(engine: Engine) -> str | None:
    """Why this engine's stack cannot be snapshotted (one line), or None."""
    policy = engine.policy
    for layer in (policy.placement, policy.preemption):
        if layer is not None and getattr(layer, "interval", None) is not None:
            return (f"policy {policy.name}: periodic activation keeps state outside the engine; it cannot be "
                    f"snapshotted (the full log is kept)")
    if engine.memory is not None and not isinstance(policy.preemption, RemembersState):
        return f"policy {policy.name}: its memory cannot be written as text; it cannot be snapshotted"
    return None


# ---------------------------------------------------------------- encode


def encode(engine: Engine) -> dict:
    """The engine's state as JSON-able data (SnapshotError when `refusal` names a reason)."""
    why = refusal(engine)
    if why is not None:
        raise SnapshotError(why)
    st, w = engine.state, engine.waiting
    layer = engine.policy.preemption
    return {
        "version": VERSION,
        "policy": engine.policy.name,
        "nodes": [_node_out(n) for n in st.nodes.values()],
        "gpus": [[g.node, g.local_index, g.gpu_type, g.memory_mb, list(g.jobs)] for g in st.gpus],
        "drained": sorted(st.drained),
        "version_counter": st.version,
        "jobs": [_job_out(j) for j in st.jobs.values()],
        "queue": [[job_id, _plain(key)] for job_id, (key, _) in sorted(w.keys.items(), key=lambda kv: kv[1][1])],
        "active": list(engine.active),
        "timers": {"at": engine.timers.at, "key": engine.timers.key, "policy_at": engine.timers.policy_at,
                   "deferred": [[j, t] for j, t in engine.timers.deferred.items()]},
        "control": _control_out(engine),
        "drains": [r.to_dict() for r in engine.drains.records.values()],
        "memory": None if engine.memory is None else layer.encode_memory(engine.memory),
    }


def _node_out(n: Node) -> dict:
    return {"name": n.name, "gpus": list(n.gpus), "alive": n.alive, "gpu_type": n.gpu_type,
            "memory_mb": n.memory_mb, "cpus": n.cpus, "host_memory_gb": n.host_memory_gb}


def _spec_out(spec: JobSpec) -> dict:
    out = _fields(spec)
    out["dependencies"] = [[d.kind.value, d.job_id] for d in spec.dependencies]
    return out


def _job_out(j: Job) -> dict:
    return {
        "spec": _spec_out(j.spec), "ideal_step_time": j.ideal_step_time, "state": j.state.value,
        "gpus": list(j.gpus), "since": j.since, "done_iterations": j.done_iterations,
        "checkpoint_iterations": j.checkpoint_iterations, "progress_time": j.progress_time,
        "step_time": j.step_time, "rate_since": j.rate_since, "restarts": j.restarts, "reason": j.reason,
        "acct": _fields(j.acct), "exec": None if j.exec is None else j.exec.to_dict(),
        "exec_pending": None if j.exec_pending is None else j.exec_pending.to_dict(),
        "deferred_until": j.deferred_until, "rank_step_times": list(j.rank_step_times),
        "reported": None if j.reported is None else list(j.reported),
        "calibration": None if j.calibration is None else _plain(_memo_out(j.calibration)),
        "held": j.held, "time_limit_at": j.time_limit_at, "timing_out": j.timing_out, "avoid": sorted(j.avoid),
    }


def _memo_out(m: CalibrationMemo) -> dict:
    return _fields(m)


def _fields(obj) -> dict:
    """A flat dataclass's fields (`dataclasses.asdict` deep-copies: many times slower on 10,000 jobs)."""
    return {name: getattr(obj, name) for name in _names(type(obj))}


@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _control_out(engine: Engine) -> dict:
    c = engine.control
    if c.ended:
        raise SnapshotError("job control is settling an event; snapshot between events")
    return {
        "blocked": [[j, r] for j, r in c.blocked.items()],
        "dependents": [[j, sorted(s)] for j, s in c.dependents.items()],
        "array_play": [[a, sorted(s)] for a, s in c.array_play.items()],
        "array_waiting": [[a, list(q)] for a, q in c.array_waiting.items()],
        "limits": [[j, t] for j, t in c.limits.items()],
        "begins": [[j, t] for j, t in c.begins.items()],
        "warnings": [[j, t] for j, t in c.warnings.items()],
    }


def _plain(value):
    """Tuples (queue keys, calibration signatures) as lists, recursively."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _tupled(value):
    """Lists back as tuples, recursively (the inverse of `_plain` for data that held no lists)."""
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


# ---------------------------------------------------------------- decode


def decode(data: object, engine: Engine) -> Engine:
    """Fill `engine` (fresh: no node, no job; built with the same stack) with the state `data` holds; returns it.
    SnapshotError (one line) when `data` is not a snapshot this version wrote or names another stack."""
    if not isinstance(data, dict) or data.get("version") != VERSION:
        version = data.get("version") if isinstance(data, dict) else None
        raise SnapshotError(f"snapshot version {version!r} is not {VERSION}")
    if engine.state.nodes or engine.state.jobs:
        raise SnapshotError("a snapshot decodes only into a fresh engine")
    if data.get("policy") != engine.policy.name:
        raise SnapshotError(f"snapshot of policy {data.get('policy')!r}, this engine runs {engine.policy.name!r}")
    try:
        _fill(data, engine)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise SnapshotError(f"unreadable snapshot: {type(exc).__name__}: {exc}") from None
    return engine


def _fill(data: dict, engine: Engine) -> None:
    st = engine.state
    for d in data["nodes"]:
        st.nodes[d["name"]] = Node(str(d["name"]), [int(g) for g in d["gpus"]], bool(d["alive"]), d["gpu_type"],
                                   int(d["memory_mb"]), int(d["cpus"]), float(d["host_memory_gb"]))
    st.gpus = [Gpu(i, node, int(local), kind, int(mem), [str(j) for j in jobs])
               for i, (node, local, kind, mem, jobs) in enumerate(data["gpus"])]
    st.drained = {int(g) for g in data["drained"]}
    st.shared_gpus = sum(len(g.jobs) > 1 for g in st.gpus)
    st.free_by_node = {name: (sum(1 for g in n.gpus if not st.gpus[g].jobs and g not in st.drained)
                              if n.alive else 0) for name, n in st.nodes.items()}
    alive = [n for n in st.nodes.values() if n.alive]
    st.total_gpus = sum(n.size for n in alive)
    st.largest_node = max((n.size for n in alive), default=0)
    st.gpu_types = tuple(sorted({n.gpu_type for n in alive}))
    st.version = int(data["version_counter"])
    for d in data["jobs"]:
        job = _job_in(d)
        st.jobs[job.job_id] = job
    for job_id, key in data["queue"]:
        engine.waiting.add(job_id, _tupled(key), st.jobs[job_id].spec.gpus)
    for job_id in data["active"]:
        engine.active[job_id] = st.jobs[job_id]
    t = data["timers"]
    engine.timers.at, engine.timers.key, engine.timers.policy_at = t["at"], int(t["key"]), t["policy_at"]
    engine.timers.deferred.update((str(j), float(u)) for j, u in t["deferred"])
    _control_in(data["control"], engine)
    for r in data["drains"]:
        engine.drains.records[r["node"]] = DrainRecord(r["node"], tuple(int(g) for g in r["gpus"]), r["reason"],
                                                       r["by"], float(r["since"]))
    if data["memory"] is not None:
        layer = engine.policy.preemption
        if not isinstance(layer, RemembersState):
            raise ValueError("the snapshot holds a memory this stack cannot read")
        engine.memory = layer.decode_memory(data["memory"])
    st.validate()


def _spec_in(d: dict) -> JobSpec:
    deps = tuple(Dependency(DependencyKind(kind), str(job_id)) for kind, job_id in d["dependencies"])
    return JobSpec(**dict(d, dependencies=deps))


def _job_in(d: dict) -> Job:
    memo = d["calibration"]
    reported = d["reported"]
    return Job(
        _spec_in(d["spec"]), float(d["ideal_step_time"]), JobState(d["state"]), tuple(int(g) for g in d["gpus"]),
        float(d["since"]), float(d["done_iterations"]), float(d["checkpoint_iterations"]), float(d["progress_time"]),
        float(d["step_time"]), float(d["rate_since"]), int(d["restarts"]), str(d["reason"]),
        JobAccounting(**d["acct"]), None if d["exec"] is None else ExecConfig.from_dict(d["exec"]),
        None if d["exec_pending"] is None else ExecConfig.from_dict(d["exec_pending"]), d["deferred_until"],
        tuple(float(s) for s in d["rank_step_times"]), None if reported is None else (reported[0], reported[1]),
        None if memo is None else CalibrationMemo(**{k: _tupled(v) for k, v in memo.items()}),
        bool(d["held"]), d["time_limit_at"], bool(d["timing_out"]), frozenset(str(j) for j in d["avoid"]),
    )


def _control_in(d: dict, engine: Engine) -> None:
    c = engine.control
    c.blocked.update((str(j), str(r)) for j, r in d["blocked"])
    c.dependents.update((str(j), set(s)) for j, s in d["dependents"])
    c.array_play.update((str(a), set(s)) for a, s in d["array_play"])
    c.array_waiting.update((str(a), deque(q)) for a, q in d["array_waiting"])
    c.limits.update((str(j), float(t)) for j, t in d["limits"])
    c.begins.update((str(j), float(t)) for j, t in d["begins"])
    c.warnings.update((str(j), float(t)) for j, t in d["warnings"])
