"""MeshReplica: a node's side of the mesh's log, composed by NodeDaemon when its coordinator is etcd.

Every node replays the same log (carried by `daemon.mesh.MeshLink`) through its own engine. Before the replay the
node takes back the job records and the supervisors it kept; then each entry is applied in log order, its actions
carried out here once the log is past what this node had already done; once the log is replayed the node joins
(again), reports the exits that happened while meshd was down, and proposes again the submits and cancels that may
have died in the outbox. Ranks of a job the mesh no longer places here are stopped, progress reports are thinned to
one entry per REPORT_GAP, and a multi-node job's ranks meet on a port every node computes alike. One server has no
replica: NodeDaemon's engine hears of everything at once.
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import fields
from pathlib import Path

from meshsched import events as ev
from meshsched.daemon.jobcontrol import TERMINAL, job_spec
from meshsched.daemon.journal import JobRecord
from meshsched.daemon.launcher import Outcome, read_outcome
from meshsched.state import JobState

LOG = logging.getLogger("meshd")
REPORT_GAP = 5.0  # seconds between a job's progress reports in the log (each is an entry every node applies)


class MeshReplica:
    def __init__(self, daemon) -> None:
        self.daemon = daemon
        self._pending_outcomes: list[tuple[str, Outcome, bool]] = []  # exits found at start, proposed once synced
        self._reported: dict[str, float] = {}  # job -> when its last progress report was proposed

    def recover_local_runs(self) -> None:
        """Before the log is replayed: every job record this node kept, and its supervisors re-adopted; the exits
        that happened while meshd was down are proposed once the log is replayed."""
        d = self.daemon
        for rec in d.journal.load():
            d.records[rec.job_id] = rec
            if rec.supervisor_pid:
                if d.launcher.adopt(rec.job_id, rec.supervisor_pid, rec.supervisor_start, Path(rec.job_dir)):
                    d._runs[rec.job_id] = rec.restarts
                    continue
                d._kill_leftovers(rec)
                self._pending_outcomes.append((rec.job_id, read_outcome(Path(rec.job_dir)), rec.pausing))
            elif Path(rec.job_dir).exists():
                d._reap_orphan(rec)

    def apply_entry(self, entry, index: int, act: bool) -> None:
        """One entry of the mesh's log, in log order, on every node (`act`: carry out its actions here; False
        while replaying what this node already did before a restart)."""
        d = self.daemon
        e, jobs = entry.event, d.engine.state.jobs
        if isinstance(e, ev.NodeJoined) and e.node.address:
            d.mesh.addresses[e.node.name] = e.node.address
        if isinstance(e, ev.JobSubmitted):
            if e.spec.job_id in jobs:
                return self._skip(index)
            if e.spec.job_id not in d.records and entry.record is not None:
                known = {f.name for f in fields(JobRecord)}
                data = {k: v for k, v in entry.record.items() if k in known}
                data.update(job_dir=str(d.config.jobs_dir / e.spec.job_id))
                d.records[e.spec.job_id] = JobRecord(**data)
        elif entry.run is not None:  # an exit or report of a run that is over (the job was requeued since)
            job = jobs.get(getattr(e, "job_id", ""))
            if job is None or job.restarts != entry.run:
                return self._skip(index)
        job_id = getattr(e, "job_id", None) or getattr(getattr(e, "spec", None), "job_id", None)
        if job_id is not None and job_id not in d.records:
            return self._skip(index)  # a job this log never submitted (cannot happen short of a foreign writer)
        d._handle(e, entry.time, act, index)  # nothing queues behind it: in a mesh every input is proposed

    def _skip(self, index: int) -> None:
        with self.daemon.journal.batch():
            self.daemon.journal.set_applied(index)

    def synced(self) -> None:
        """The log is replayed: join (again), report what ended meanwhile, hand over unsent submits and cancels."""
        d = self.daemon
        state = d.engine.state
        node = state.nodes.get(d.config.node_name)
        if node is None or not node.alive:
            d._input(ev.NodeJoined(d._sid("join"), d.node_spec(d.config.mesh_address or d.config.node_name)))
        for job_id, outcome, pausing in self._pending_outcomes:
            job = state.jobs.get(job_id)
            if job is not None and job.state.holds_gpus and d._rank0_here(job_id, running=False):
                if outcome.status in ("lost", "terminated") and not pausing:
                    event = ev.JobFailed(d._sid("recover"), job_id, "meshd restarted and the job's processes were "
                                         "gone", requeue=True)
                else:
                    event = d._outcome_event(job_id, outcome, pausing)
                d._input(event, job.restarts)
        self._pending_outcomes.clear()
        for job_id, run in d._runs.items():  # adopted, but its start may have died in the outbox
            job = state.jobs.get(job_id)
            if job is not None and job.state is JobState.LOADING and job.restarts == run and d._rank0_here(job_id):
                d._input(ev.JobStarted(d._sid("spawned"), job_id), run)
        for rec in d.records.values():
            if rec.job_id not in state.jobs and rec.state == "PENDING" and rec.job_id.startswith(
                    f"{d.config.node_name}."):
                d.submitted(rec, ev.JobSubmitted(d._sid("submit"), job_spec(rec), held=rec.held))  # never logged
            job = state.jobs.get(rec.job_id)
            if rec.cancel_proposed and job is not None and not job.state.is_terminal:  # it may have died in the outbox
                d._input(ev.CancelRequested(d._sid("cancel"), rec.job_id))
        self.stop_released([j for j in d._runs if d.launcher.running(j)])

    def stop_released(self, job_ids: list[str]) -> None:
        """Ranks still running here of a job the engine no longer places here (a multi-node job whose rank 0
        ended, a job requeued while this node was counted lost) are stopped."""
        d = self.daemon
        for job_id in dict.fromkeys(job_ids):
            job = d.engine.state.jobs.get(job_id)
            here = job is not None and job.state.holds_gpus and any(
                d.engine.state.gpus[g].node == d.config.node_name for g in job.gpus)
            if not here and d.launcher.running(job_id) and job_id not in d._restart_for:
                LOG.info("job %s: the mesh no longer places it here; stopping its ranks", job_id)
                d.launcher.stop(job_id, d.config.kill_grace)

    def cancel(self, rec: JobRecord) -> None:
        """Propose the cancel: the node holding the job's ranks kills them when the cancel is in the log."""
        d = self.daemon
        if rec.state in TERMINAL:
            return
        if not rec.cancel_proposed:  # journaled before the answer: a crash cannot lose it in the outbox
            rec.cancel_proposed = True
            with d.journal.batch():
                d.journal.put(rec)
        d._input(ev.CancelRequested(d._sid("cancel"), rec.job_id))

    def report_due(self, job_id: str) -> bool:
        """Whether rank 0's progress report goes to the log now (at most one per REPORT_GAP a job)."""
        now = time.time()
        if now - self._reported.get(job_id, -REPORT_GAP) < REPORT_GAP:
            return False
        self._reported[job_id] = now
        return True

    def forget_run(self, job_id: str) -> None:
        self._reported.pop(job_id, None)

    def leadership_changed(self) -> None:
        self.daemon._notifier.send(f"STATUS=mesh leader: {self.daemon.mesh.leader or 'none'}")


def shared_port(job_id: str, run: int) -> int:
    """MASTER_PORT of a job across nodes: every node computes the same one from the job and its run."""
    return 20000 + zlib.crc32(f"{job_id}:{run}".encode()) % 20000
