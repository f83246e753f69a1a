"""The one submit path of meshd: a SubmitRequest (with job control's options) refused at the door when the cluster
could never run it, else made into job records (one, or an array's tasks), journaled in one transaction and posted
to the engine as JobSubmitted (one server) or proposed to the mesh's leader with the record (a mesh). The API, job
control and the mesh's replay of unsent submits all go through `Submission`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshsched import events as ev
from meshsched.daemon.config import DaemonConfig
from meshsched.daemon.control import PLAIN, ControlRequest, JobControl, check_model, expand_pattern
from meshsched.daemon.engine_loop import EngineLoop
from meshsched.daemon.idmark import IdMark
from meshsched.daemon.journal import JobRecord, Journal
from meshsched.daemon.launcher import exported
from meshsched.daemon.mesh_node import record_payload
from meshsched.daemon.mirror import job_spec
from meshsched.engine import Engine
from meshsched.state import JobSpec
from meshsched.wire.protocol import DEFAULT_ITERATIONS, SubmitRequest

if TYPE_CHECKING:  # for the type only: daemon.mesh loads the etcd coordinator, which one server never needs
    from meshsched.daemon.mesh import MeshLink


class SubmitError(ValueError):
    """A submission the cluster can never run (answered 400)."""


@dataclass(frozen=True, slots=True)
class SubmitContext:
    """What Submission uses of its node."""

    config: DaemonConfig  # jobs_dir, node_name
    records: dict[str, JobRecord]
    engine: Engine  # the door's admission check
    journal: Journal
    loop: EngineLoop  # dispatch / input, sid
    control: JobControl  # dependency ids resolved
    mesh: MeshLink | None  # (its `synced`) None on one server
    ids: IdMark  # new job ids continue past every id given out and every job directory, whatever the journal says


class Submission:
    def __init__(self, ctx: SubmitContext) -> None:
        self.ctx = ctx

    def submit(self, req: SubmitRequest, ctl: ControlRequest = PLAIN, user: str = "",
               uid: int | None = None) -> list[JobRecord]:
        """One job or a whole array in one journal transaction, run as `uid` (None: meshd's user); its records."""
        c = self.ctx
        self.refuse_never_runnable(req)  # one line, no id taken, nothing journaled
        deps = c.control.resolve(ctl.dependency)
        now, env = time.time(), exported(req.env)  # the submitter's values of the variables meshd sets never reach it
        name, jobs_dir = req.name or default_name(req.command), str(c.config.jobs_dir)  # once: the tasks share them
        with c.journal.batch():  # durable first, id and records in one commit: a failed write leaves no phantom job
            seq, head = self.new_job_id()
            env = array_env(env, head, ctl.tasks) if ctl.tasks else env
            recs = [self._record(req, ctl, user, uid, seq, head, task, deps, now, env, name, jobs_dir)
                    for task in ctl.tasks or (None,)]
            specs = [job_spec(rec) for rec in recs]  # validates
            for rec in recs:
                c.journal.put(rec)
                c.journal.transition(rec.job_id, now, "PENDING", "submitted")
            journaled = [rec.values() for rec in recs]  # what the commit writes: a pass that changes nothing skips it
        for rec in recs:
            c.records[rec.job_id] = rec
        if c.mesh is None and len(recs) > 1:  # an array: its tasks reach the engine together, one pass for all
            self.post_many(recs, specs, journaled)
            return recs
        with c.journal.batch():  # every task's first scheduling pass in one commit
            for rec, spec, clean in zip(recs, specs, journaled):
                self.post(rec, spec, clean)
        return recs

    def post_many(self, recs: list[JobRecord], specs: list[JobSpec], journaled: list[tuple]) -> None:
        """(one server) An array's journaled tasks reach the engine in one batch (`EngineLoop.dispatch_many`: one
        scheduling pass after the last, one commit); a task its pass leaves as journaled is not written again."""
        loop = self.ctx.loop
        events = [ev.JobSubmitted(loop.sid("submit"), spec, held=rec.held) for rec, spec in zip(recs, specs)]
        loop.clean.update((rec.job_id, clean) for rec, clean in zip(recs, journaled))
        try:
            loop.dispatch_many(events)
        finally:
            for rec in recs:
                loop.clean.pop(rec.job_id, None)

    def batch_warnings(self, req: SubmitRequest) -> list[str]:
        """One line per GPU type of the live nodes whose profile of `req.model` was measured at per-GPU batches
        that do not include this job's (issue 26 point 7: its speed is extrapolated); for the submit's reply."""
        from meshsched.loaders.profiles import load_perf_model
        from meshsched.perf.batch_range import batch_outside_profile

        per_gpu = max(1, req.batch_size // max(req.gpus, 1))
        lines = (batch_outside_profile(load_perf_model(), req.model, t, per_gpu)
                 for t in self.ctx.engine.state.gpu_types)
        return [line for line in lines if line is not None]

    def _record(self, req: SubmitRequest, ctl: ControlRequest, user: str, uid: int | None, seq: int, head: str,
                task: int | None, deps: list, now: float, env: dict[str, str], name: str, jobs_dir: str) -> JobRecord:
        array_id = head if ctl.tasks else ""
        job_id = head if task is None else f"{head}_{task}"
        if task is None:
            env = dict(env)  # each record its own
        # else: the array's one env, shared by its tasks, never changed in place (MESH_ARRAY_TASK_ID is set at launch)
        files = {k: _path(getattr(ctl, k), req.cwd, job_id, array_id, task, user, name) for k in ("output", "error")}
        return JobRecord(
            job_id=job_id, seq=seq, gpus=req.gpus, model=req.model, batch_size=req.batch_size,
            iterations=req.iterations or DEFAULT_ITERATIONS, iterations_given=req.iterations is not None,
            submit_time=now, name=name, user=user, deadline=req.deadline, guaranteed=req.guaranteed,
            command=req.command, cwd=req.cwd, env=env, export=req.export, job_dir=os.path.join(jobs_dir, job_id),
            array_id=array_id, array_task=task, array_limit=ctl.array_limit, dependency=deps,
            time_limit=ctl.time_limit, held=ctl.hold, uid=uid, begin_time=ctl.begin, **files, **resources(req),
            signal=ctl.signal,
        )

    def post(self, rec: JobRecord, spec: JobSpec | None = None, clean: tuple | None = None) -> None:
        """A journaled submit reaches the engine (one server) or the mesh's leader with what nodes need to run it.
        `clean`: the record's values as just journaled (its pass writes it again only if it changed it)."""
        loop = self.ctx.loop
        event = ev.JobSubmitted(loop.sid("submit"), spec or job_spec(rec), held=rec.held)
        if self.ctx.mesh is None:
            if clean is not None:
                loop.clean[rec.job_id] = clean
            loop.dispatch(event)
            loop.clean.pop(rec.job_id, None)  # (an event queued behind one being handled: written as any)
        else:
            loop.input(event, record=record_payload(rec))

    def new_job_id(self) -> tuple[int, str]:
        """The next sequence number and the job id it makes (in a mesh `NODE.SEQ`: unique without a leader), inside
        the caller's batch. The mark outside the journal is raised before any record holds the id: neither a lost
        journal nor a batch that failed to commit gives it again."""
        seq = self.ctx.journal.take_seq(self.ctx.ids.floor())  # committed with the batch around it
        self.ctx.ids.given(seq)
        return seq, str(seq) if self.ctx.mesh is None else f"{self.ctx.config.node_name}.{seq}"

    def refuse_never_runnable(self, req: SubmitRequest) -> None:
        """SubmitError (answered 400; no id taken, nothing journaled) with the engine's one line on why the job
        could never run (`Engine.admission_error`: more GPUs than the live nodes have, more CPUs or memory than any
        node has, a plan the plan model calls infeasible, a guaranteed job over its tenant's quota). A mesh that
        has not caught up with its log has a partial view: its leader decides."""
        check_model(req.model)  # a model no profile knows (as the simulator refuses it)
        mesh = self.ctx.mesh
        if mesh is not None and not mesh.synced:
            return
        spec = JobSpec(job_id="new", gpus=req.gpus, model=req.model, batch_size=req.batch_size,
                       iterations=req.iterations or DEFAULT_ITERATIONS, guaranteed=req.guaranteed, **resources(req))
        why = self.ctx.engine.admission_error(spec)
        if why is not None:
            raise SubmitError(f"refused: {why.removeprefix('new: ')}")  # an id never given out


def array_env(env: dict[str, str], array_id: str, tasks: tuple[int, ...]) -> dict[str, str]:
    """The environment every task of an array keeps (one dict for all of them, encoded once per journal commit,
    `JobRecord.to_json`): the exported one and the array's variables; a task's own id, MESH_ARRAY_TASK_ID, is set
    from its record at each launch (`LocalRuns.launch`)."""
    return {**env, "MESH_ARRAY_JOB_ID": array_id, "MESH_ARRAY_TASK_COUNT": str(len(tasks)),
            "MESH_ARRAY_TASK_MIN": str(tasks[0]), "MESH_ARRAY_TASK_MAX": str(tasks[-1])}


def resources(req: SubmitRequest) -> dict[str, Any]:
    """The JobRecord fields of the plan and resources a submit asked for (`--plan --cpus --mem --tenant`)."""
    return {"plan": req.plan, "cpus": req.cpus, "memory_gb": req.memory_gb, "tenant": req.tenant}


def default_name(command: list[str]) -> str:
    """A job's name when none is given: its script's file name (40 characters at most), with control characters
    (newlines, escapes) replaced by '?': it becomes a column of `mesh ls`."""
    if len(command) > 1 and Path(command[0]).name.startswith("python"):  # the first argument that is no option
        script = next((a for a in command[1:] if not a.startswith("-")), command[0])
    else:
        script = command[0]
    return "".join(c if c.isprintable() else "?" for c in Path(script).name[:40])


def _path(pattern: str, cwd: str, job_id: str, array_id: str, task: int | None, user: str, name: str) -> str:
    if not pattern:
        return ""
    path = expand_pattern(pattern, job_id=job_id, array_id=array_id, task=task, user=user, name=name)
    return os.path.normpath(os.path.join(cwd, path))
