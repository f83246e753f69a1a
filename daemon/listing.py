"""meshd's views and listings: a job's view (`mesh show`, `mesh ls --json`), this node's and the mesh's nodes
(`mesh nodes`), the squeue table `mesh ls` prints (rendered here, passed through by the CLI) and the job views
`mesh ls --json` prints (encoded here), cached per job between changes.

A job's row or encoded view depends, besides the clock, on its record and on the engine's pending reason for it.
Every record change ends in `Journal.put`, which stamps the job with the journal's write count, and every engine
event ends a journal write; so while the write count has not moved every cached piece holds, and after it moved a
piece holds while its job's stamp and pending reason are what they were when it was made. Jobs whose view moves
with the clock (holding GPUs: TIME, the estimate of done iterations; or with throughput reports) are made afresh
per request, and their pieces from before they started are dropped when that is seen (it took a write). A listing of 1,000 queued jobs is one join of cached pieces, and a submit or a cancel remakes only the
pieces of the jobs it changed.

Honest figures: a job's progress is measured only when the job reports it (meshsched.job; the record's `reported`,
journaled, so it outlives a restart of meshd); otherwise `done_iterations` and `step_time` are null and the engine's
extrapolation (what scheduling uses) is under `progress` as `estimated_*`. TIME is the time the job held GPUs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from meshsched.daemon.config import DaemonConfig
from meshsched.daemon.confine import format_cpus
from meshsched.daemon.gpus import GpuBackend
from meshsched.daemon.hostres import HostResources
from meshsched.daemon.jobformat import DEFAULT, FIELDS, collapse, render, row
from meshsched.daemon.journal import HOLDING, TERMINAL, JobRecord, Journal
from meshsched.daemon.launcher import Launcher
from meshsched.daemon.mps import MpsManager
from meshsched.daemon.privacy import slot as slot_for
from meshsched.daemon.privacy import visible

from meshsched.engine import Engine

if TYPE_CHECKING:  # for the type only: daemon.mesh loads the etcd coordinator, which one server never needs
    from meshsched.daemon.mesh import MeshLink

_encode = json.JSONEncoder(separators=(",", ":")).encode  # one encoder: json.dumps(..., separators) makes one a call
_VIEW_FIELDS = tuple(f.name for f in fields(JobRecord) if f.name != "env")  # the API's job view


@dataclass(frozen=True, slots=True)
class ListingContext:
    """What Listings reads of its node."""

    config: DaemonConfig  # node_name
    records: dict[str, JobRecord]
    engine: Engine  # live figures, pending reasons, the policy's name, GPUs and nodes
    journal: Journal  # its write count and per-job stamps (the caches' keys)
    throughput: dict[str, dict[int, dict]]  # job -> rank -> latest report (JobChannel's)
    gpus: GpuBackend
    host: HostResources
    launcher: Launcher  # its confiner's view
    mps: MpsManager
    mesh: MeshLink | None  # (leader, view) None on one server
    started_at: float  # when meshd started (its uptime)


class Listings:
    def __init__(self, ctx: ListingContext) -> None:
        self.ctx = ctx
        self._at = {"rows": -1, "views": -1}  # the journal's write count when each cache was last checked
        # per cache, job -> (key, {slot: its piece}); rows: the table row, views: the encoded view, each as an
        # operator ("all"), its owner ("own") or anyone else ("public") sees it (daemon/privacy.py)
        self._cache: dict[str, dict[str, tuple]] = {"rows": {}, "views": {}}

    def _unchanged(self, cache: str) -> bool:
        """Nothing was written since `cache` was last checked (every piece in it holds)."""
        writes = self.ctx.journal.writes
        same, self._at[cache] = writes == self._at[cache], writes
        return same

    def _key(self, rec) -> tuple | None:
        """What a job's piece depends on besides the clock: its record's stamp and, while it is queued, its pending
        reason. None: the piece moves with the clock (never cached)."""
        d = self.ctx
        if (rec.held_since is not None and rec.end_time is None) or rec.job_id in d.throughput:
            return None
        job = d.engine.state.jobs.get(rec.job_id)
        queued = job is not None and job.state.is_queued
        return d.journal.stamps.get(rec.job_id), d.engine.pending_reason(rec.job_id) if queued else ""

    def _pieces(self, which: str, recs: list, slot_of, make) -> list:
        """Each job's piece in `which` cache: `make(rec, now, slot)` unless a piece made since the job last changed
        is there."""
        same, now, out, cache = self._unchanged(which), time.time(), [], self._cache[which]
        for rec in recs:
            slot = slot_of(rec)
            hit = cache.get(rec.job_id)
            if hit is None or not same or slot not in hit[1]:
                key = self._key(rec)
                if hit is None or key is None or hit[0] != key:
                    hit = (key, {})
                    if key is not None:
                        cache[rec.job_id] = hit
                    else:  # it moves with the clock now: no piece of it may be served while nothing is written
                        cache.pop(rec.job_id, None)
                if slot not in hit[1]:
                    hit[1][slot] = make(rec, now, slot)
            out.append(hit[1][slot])
        return out

    @property
    def server_dirs(self) -> tuple:
        """meshd's own directories: paths under them are named to operators only."""
        return self.ctx.config.state_dir, self.ctx.config.runtime_dir

    def table(self, recs: list, uid: int | None, operator: bool, names: tuple[str, ...] = DEFAULT,
              unfold: bool = False) -> bytes:
        """The `mesh ls` table of `recs` (header first) in the columns `names` (daemon/jobformat.py), pending tasks
        of an array as one row unless `unfold`, UTF-8; a user who is not an operator sees other users' jobs with
        their reasons' public part only (daemon/privacy.py)."""

        def make(rec, now: float, slot: str) -> tuple[dict, tuple[str, ...]]:  # its brief, and its default row
            brief = visible(self.brief(rec, now), slot, self.server_dirs, rec.job_dir)
            return brief, row(brief, DEFAULT)

        pieces = self._pieces("rows", recs, lambda rec: slot_for(operator, uid, rec.uid), make)
        rows = {id(b): r for b, r in pieces} if names == DEFAULT else {}
        briefs = [b for b, _ in pieces]
        header = tuple(FIELDS[n][0] for n in names)
        return render([header, *(rows.get(id(b)) or row(b, names) for b in (briefs if unfold else collapse(briefs)))])

    def views(self, recs: list, uid: int | None, operator: bool) -> bytes:
        """The JSON list of the job views of `recs`; a user who is not an operator sees other users' jobs
        without their PRIVATE fields and their reasons' private detail (the queue is public, what others run,
        where, and what it printed are not: daemon/privacy.py)."""

        def make(rec, now: float, slot: str) -> bytes:
            return _encode(visible(self.job_view(rec, now), slot, self.server_dirs, rec.job_dir)).encode()

        return b"[" + b",".join(self._pieces("views", recs, lambda rec: slot_for(operator, uid, rec.uid), make)) + b"]"

    def view_for(self, rec: JobRecord, uid: int | None, operator: bool) -> dict:
        """job_view as the asking user sees it (`mesh show`, submit's and cancel's answers)."""
        return visible(self.job_view(rec), slot_for(operator, uid, rec.uid), self.server_dirs, rec.job_dir)

    def brief(self, rec, now: float) -> dict:
        """job_view's squeue columns only: the same values at a fraction of the cost."""
        d = self.ctx
        job, start = d.engine.state.jobs.get(rec.job_id), rec.start_time
        queued = job is not None and job.state.is_queued
        holds = job is not None and job.state.holds_gpus
        out = {"job_id": rec.job_id, "name": rec.name, "user": rec.user, "state": rec.state, "gpus": rec.gpus,
               "node": rec.node, "reason": d.engine.pending_reason(rec.job_id) if queued else rec.reason,
               "elapsed": run_time(rec, now), "partners": self.partners(job) if holds else [],
               "exec": rec.exec if holds else None, "submit_time": rec.submit_time, "start_time": start,
               "end_time": rec.end_time, "time_limit": rec.time_limit, "time_left": time_left(rec, now),
               "array_id": rec.array_id, "array_task": rec.array_task, "array_limit": rec.array_limit,
               "exit_code": rec.exit_code, "iterations": rec.iterations,
               "done_iterations": rec.reported[0] if rec.reported else None}
        if rec.cancelling and holds:  # as job_view says it
            out["state"], out["reason"] = "COMPLETING", "cancelled; waiting for its processes to exit"
        return out

    def job_view(self, rec: JobRecord, now: float | None = None) -> dict:
        """A job as the API shows it (`mesh show`, `mesh ls --json`): its record but the env, with the engine's
        live figures."""
        d = self.ctx
        now = time.time() if now is None else now
        out = {k: getattr(rec, k) for k in _VIEW_FIELDS}
        job = d.engine.state.jobs.get(rec.job_id)
        live = job is not None and not job.state.is_terminal
        if live and job.state.is_queued:
            out["reason"] = d.engine.pending_reason(rec.job_id)
        out.update(progress_of(rec, job if live else None, now))
        out["elapsed"] = run_time(rec, now)
        out["restarts"], out["launches"] = max(0, rec.restarts - 1), rec.restarts  # the record counts launches
        out["time_left"], out["eligible_time"] = time_left(rec, now), self.eligible(rec, job)
        if rec.cancelling and rec.state in HOLDING:  # Slurm's word for "ending, processes still there"
            out["state"], out["reason"] = "COMPLETING", "cancelled; waiting for its processes to exit"
        out["gpu_names"] = [d.engine.state.gpus[g].local_index for g in rec.assigned]
        out["cpu_list"] = format_cpus(rec.cpu_ids)  # cpu_ids as Cpus_allowed_list writes them: 0-3,8
        if job is not None and job.state.holds_gpus:  # its colocation set: jobs sharing any of its GPUs
            out["partners"] = self.partners(job)
            if job.exec_pending is not None:
                out["exec_pending"] = job.exec_pending.to_dict()
        else:
            out["partners"] = []
        ranks = d.throughput.get(rec.job_id)
        if ranks and job is not None and not job.state.is_terminal:  # reported by meshsched.job, per rank
            out["samples_per_second"] = round(sum(r["samples_per_second"] for r in ranks.values()), 3)
            out["rank_reports"] = {str(k): v for k, v in sorted(ranks.items())}
        return out

    def eligible(self, rec: JobRecord, job) -> float | None:
        """Slurm's EligibleTime: when its gates opened (submitted, --begin passed, the jobs it depends on ended);
        None while one is still closed (held, waiting for its begin time or a dependency)."""
        if job is not None and job.state.is_queued and (rec.held or self.ctx.engine.pending_reason(rec.job_id) in
                                                        ("Dependency", "BeginTime", "JobHeldUser")):
            return None
        ends = [r.end_time for _, j in rec.dependency if (r := self.ctx.records.get(j)) is not None and r.end_time]
        return max([rec.submit_time, rec.begin_time or 0.0, *ends])

    def partners(self, job) -> list[str]:
        """The jobs sharing any of `job`'s GPUs (its colocation set)."""
        gpus = self.ctx.engine.state.gpus
        return sorted({o for g in job.gpus for o in gpus[g].jobs if o != job.job_id}, key=_id_key)

    def node_view(self) -> dict:
        d = self.ctx
        inv = d.gpus.inventory()
        readings = {r.index: r for r in d.gpus.readings()}
        state = d.engine.state
        node = state.nodes.get(d.config.node_name)  # None in a mesh until the log says it joined
        jobs_on = {state.gpus[g].local_index: list(state.gpus[g].jobs) for g in (node.gpus if node else ())}
        gpus = []
        for info in inv:
            rd = readings.get(info.index)
            gpus.append({
                "index": info.index, "name": info.name, "uuid": info.uuid, "memory_total_mb": info.memory_total_mb,
                "memory_used_mb": rd.memory_used_mb if rd else 0, "utilization": rd.utilization if rd else -1,
                "temperature": rd.temperature if rd else -1, "jobs": jobs_on.get(info.index, []),
            })
        out = {
            "name": d.config.node_name, "backend": d.gpus.kind, "policy": d.engine.policy.name,
            "gpus": gpus, "free_gpus": state.free_by_node.get(d.config.node_name, 0), "total_gpus": len(inv),
            "cpus": d.host.cpus, "memory_gb": d.host.memory_gb, "confinement": d.launcher.confiner.view(),
            "alive": node is not None and node.alive, "mps": d.mps.kind, "queue_length": d.engine.queue_length,
            "running": sum(1 for r in d.records.values() if r.state in HOLDING),
            "uptime": time.time() - d.started_at,
        }
        if d.mesh is not None:
            out.update(leader=d.mesh.leader == d.config.node_name, mesh=d.mesh.view())
        return out

    def nodes_view(self) -> list[dict]:
        """This node in full; in a mesh, every other node as the shared engine state knows it."""
        d = self.ctx
        here = self.node_view()
        here["drain"] = d.engine.drains.status(here["name"]) if here["name"] in d.engine.state.nodes else None
        if d.mesh is None:
            return [here]
        state, out = d.engine.state, [here]
        for name, node in sorted(state.nodes.items()):
            if name != here["name"]:
                out.append({"name": name, "backend": "mesh", "policy": here["policy"], "alive": node.alive,
                            "gpus": [{"index": state.gpus[g].local_index, "name": node.gpu_type,
                                      "jobs": list(state.gpus[g].jobs)} for g in node.gpus],
                            "free_gpus": state.free_by_node.get(name, 0), "total_gpus": node.size,
                            "cpus": node.cpus, "memory_gb": node.host_memory_gb,
                            "queue_length": here["queue_length"], "leader": d.mesh.leader == name,
                            "drain": d.engine.drains.status(name)})
        return out


def run_time(rec: JobRecord, now: float) -> float:
    """Slurm's TIME: the seconds the job held GPUs (runs that ended, and the current one up to its end or now);
    a record from before this was counted: from its first start."""
    if rec.held_since is None and not rec.ran and rec.start_time is not None:
        return max(0.0, (rec.end_time or now) - rec.start_time)
    current = 0.0 if rec.held_since is None else max(0.0, (rec.end_time or now) - rec.held_since)
    return rec.ran + current


def time_left(rec: JobRecord, now: float) -> float | None:
    """What is left of the time limit of its current run (the whole limit while queued); None: no limit, or ended."""
    if rec.time_limit is None or rec.state in TERMINAL:
        return None
    if rec.held_since is not None and rec.time_limit_at is not None:
        return max(0.0, rec.time_limit_at - now)
    return rec.time_limit


def progress_of(rec: JobRecord, job, now: float) -> dict:
    """done_iterations and step_time as measured (what the job last reported; null when it never did) and the
    `progress` block that says which figures are measured and what the scheduler estimates (`job`: the engine's,
    while the job has not ended)."""
    measured = rec.reported is not None
    iters, step = (rec.reported[0], rec.reported[1] or None) if measured else (None, None)
    est_iters = round(job.iterations_at(now), 3) if job is not None else rec.done_iterations
    est_step = job.step_time if job is not None else rec.step_time
    return {"done_iterations": iters, "step_time": step,
            "progress": {"measured": measured, "iterations": iters, "step_time": step,
                         "estimated": not measured, "estimated_iterations": est_iters,
                         "estimated_step_time": est_step}}


def _id_key(job_id: str) -> tuple:
    return (0, int(job_id), "") if job_id.isdigit() else (1, 0, job_id)
