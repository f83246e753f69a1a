"""MeshReplica: a node's side of the mesh's log, composed by NodeDaemon when its coordinator is etcd.

Every node replays the same log (carried by `daemon.mesh.MeshLink`) through its own engine. Before the replay the
node takes back the job records and the supervisors it kept; then each entry is applied in log order, its actions
carried out here once the log is past what this node had already done; once the log is replayed the node joins
(again), reports the exits that happened while meshd was down, and proposes again the submits and cancels that may
have died in the outbox. Ranks of a job the mesh no longer places here are stopped, progress reports are thinned to
one entry per REPORT_GAP (`ReportGate`), and a submit's entry carries its record (`record_payload`). One server has
no replica: NodeDaemon's engine hears of everything at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from meshsched.daemon.config import DaemonConfig
from meshsched.daemon.engine_loop import EngineLoop
from meshsched.daemon.eventlog import Snapshot
from meshsched.daemon.journal import TERMINAL, JobRecord, Journal
from meshsched.daemon.launcher import Launcher, Outcome, read_outcome
from meshsched.daemon.mirror import mirror
from meshsched.daemon.runs import LocalRuns

from meshsched import events as ev
from meshsched import snapshot
from meshsched.actions import Kill, Launch, Preempt, Reconfigure, ScheduleTimer, SignalJob
from meshsched.engine import Engine
from meshsched.state import JobState, NodeSpec

LOG = logging.getLogger("meshd")
REPORT_GAP = 5.0  # seconds between a job's progress reports in the log (each is an entry every node applies)


@dataclass(frozen=True, slots=True)
class ReplicaContext:
    """What MeshReplica uses of its node."""

    config: DaemonConfig
    engine: Engine
    journal: Journal
    launcher: Launcher
    records: dict[str, JobRecord]
    loop: EngineLoop  # handle (an entry), input (a proposal), sid
    runs: LocalRuns  # the runs this node holds: launch counts, restarts due, outcomes
    post: Callable[[JobRecord], None]  # a journaled submit to the leader (daemon.submission)
    node_spec: Callable[[str], NodeSpec]  # this node as the engine accounts it, with the address it is reached at
    notify: Callable[[str], None]  # a line for systemd
    fresh_engine: Callable[[], Engine] | None = None  # an engine of the same stack (a snapshot is tried in one)


class MeshReplica:
    def __init__(self, ctx: ReplicaContext) -> None:
        self.ctx = ctx
        self._pending_outcomes: list[tuple[str, Outcome, bool]] = []  # exits found at start, proposed once synced
        self._pending_runs: dict[str, int] = {}  # job -> the run whose exit was found at start
        self.submitted: dict[str, int] = {}  # node -> highest job seq (`NODE.SEQ`) the log has submitted
        self.behind: dict[str, int] | None = None  # (loaded a snapshot past this node's journal) see _reconcile
        self.fenced: dict[str, float] = {}  # job -> when fencing stopped its ranks here (UNIX time); see fence
        self._live = False  # the log has been replayed since this meshd started (a NodeLost of it rejoins)
        self.holding = False  # (daemon.mesh sets it) this node is fenced or behind the log's head: launches wait
        self.held: dict[str, list] = {}  # job -> its held Launch and the actions on it since: (carry, action)s

    def recover_local_runs(self) -> None:
        """Before the log is replayed: every job record this node kept, and its supervisors re-adopted; the exits
        that happened while meshd was down are proposed once the log is replayed."""
        c = self.ctx
        for rec in c.journal.load():
            c.records[rec.job_id] = rec
            if rec.supervisor_pid:
                if c.launcher.adopt(rec.job_id, rec.supervisor_pid, rec.supervisor_start, Path(rec.job_dir)):
                    c.runs.launched[rec.job_id] = rec.restarts
                    continue
                c.runs.kill_leftovers(rec)
                self._pending_outcomes.append((rec.job_id, read_outcome(Path(rec.job_dir)), rec.pausing))
                self._pending_runs[rec.job_id] = rec.restarts
            elif Path(rec.job_dir).exists():
                c.runs.reap_orphan(rec)

    def apply_entry(self, entry, index: int, act: bool) -> None:
        """One entry of the mesh's log, in log order, on every node (`act`: carry out its actions here; False
        while replaying what this node already did before a restart)."""
        c = self.ctx
        e, jobs, jobs_nodes = entry.event, c.engine.state.jobs, c.engine.state.nodes
        if isinstance(e, ev.JobSubmitted):
            self._note_submitted(e.spec.job_id)
            if e.spec.job_id in jobs:
                return self._skip(index)
            if e.spec.job_id not in c.records and entry.record is not None:
                known = {f.name for f in fields(JobRecord)}
                data = {k: v for k, v in entry.record.items() if k in known}
                data.update(job_dir=str(c.config.jobs_dir / e.spec.job_id))
                c.records[e.spec.job_id] = JobRecord(**data)
        elif entry.run is not None:  # an exit or report of a run that is over (the job was requeued since)
            job = jobs.get(getattr(e, "job_id", ""))
            if job is None or job.restarts != entry.run:
                return self._skip(index)
        job_id = getattr(e, "job_id", None) or getattr(getattr(e, "spec", None), "job_id", None)
        if job_id is not None and job_id not in c.records:
            return self._skip(index)  # a job this log never submitted (cannot happen short of a foreign writer)
        if isinstance(e, ev.NodeJoined) and (node := jobs_nodes.get(e.node.name)) is not None and node.alive:
            return self._skip(index)  # a second rejoin (two leaders each declared it lost): it is in already
        was_alive = isinstance(e, ev.NodeLost) and (node := jobs_nodes.get(e.node)) is not None and node.alive
        c.loop.handle(e, entry.time, act, index)  # nothing queues behind it: in a mesh every input is proposed
        if was_alive and e.node == c.config.node_name and self._live:
            LOG.warning("mesh: this node was declared lost (cut off from etcd for longer than node_grace); joining again")
            c.loop.input(ev.NodeJoined(c.loop.sid("rejoin"), c.node_spec(c.config.mesh_address or c.config.node_name)))

    def _skip(self, index: int) -> None:
        with self.ctx.journal.batch():
            self.ctx.journal.set_applied(index)

    def synced(self) -> None:
        """The log is replayed: join (again), report what ended meanwhile, hand over unsent submits and cancels."""
        c = self.ctx
        state, sid, runs = c.engine.state, c.loop.sid, c.runs
        self._live = True
        if self.behind is not None:
            self._reconcile(self.behind)
        node = state.nodes.get(c.config.node_name)
        if node is None or not node.alive:
            c.loop.input(ev.NodeJoined(sid("join"), c.node_spec(c.config.mesh_address or c.config.node_name)))
        for job_id, outcome, pausing in self._pending_outcomes:
            job = state.jobs.get(job_id)
            if self.behind is not None and job is not None and job.restarts != self._pending_runs.get(job_id):
                continue  # the exit of a run the skipped entries had already moved on from
            if job is not None and job.state.holds_gpus and runs.rank0_here(job_id, running=False):
                if outcome.status in ("lost", "terminated") and not pausing:
                    event = ev.JobFailed(sid("recover"), job_id, "meshd restarted and the job's processes were "
                                         "gone", requeue=True)
                else:
                    event = runs.outcome_event(job_id, outcome, pausing)
                c.loop.input(event, job.restarts)
        self._pending_outcomes.clear()
        for job_id, run in runs.launched.items():  # adopted, but its start may have died in the outbox
            job = state.jobs.get(job_id)
            if job is not None and job.state is JobState.LOADING and job.restarts == run and runs.rank0_here(job_id):
                c.loop.input(ev.JobStarted(sid("spawned"), job_id), run)
        for rec in c.records.values():
            if rec.job_id not in state.jobs and rec.state == "PENDING" and rec.job_id.startswith(
                    f"{c.config.node_name}.") and not self._logged(rec.job_id):
                c.post(rec)  # never logged
            job = state.jobs.get(rec.job_id)
            if rec.cancel_proposed and job is not None and not job.state.is_terminal:  # it may have died in the outbox
                c.loop.input(ev.CancelRequested(sid("cancel"), rec.job_id))
        self.stop_released([j for j in runs.launched if c.launcher.running(j)])

    # ---------------------------------------------------------------- snapshots (daemon.mesh writes and loads them)

    def _note_submitted(self, job_id: str) -> None:
        node, _, seq = job_id.rpartition(".")
        if node and seq.isdigit() and int(seq) > self.submitted.get(node, -1):
            self.submitted[node] = int(seq)

    def _logged(self, job_id: str) -> bool:
        """(after a snapshot past this node's journal) the log submitted this job (it may have been forgotten
        since: posting it again would run it twice)."""
        node, _, seq = job_id.rpartition(".")
        return self.behind is not None and seq.isdigit() and int(seq) <= self.submitted.get(node, -1)

    def snapshot(self, index: int, last_seq: dict, addresses: dict) -> Snapshot:
        """The mesh's state after entry `index` (this engine must have applied exactly that far); SnapshotError
        (one line) where the stack cannot be snapshotted."""
        c = self.ctx
        why = snapshot.refusal(c.engine)
        if why is not None:
            raise snapshot.SnapshotError(why)
        records = {j: record_payload(c.records[j]) for j in c.engine.state.jobs if j in c.records}
        return Snapshot(index, snapshot.encode(c.engine), records, dict(last_seq), dict(addresses),
                        dict(self.submitted))

    def load_snapshot(self, snap: Snapshot, durable: int) -> None:
        """Fill the (fresh) engine from `snap`: decoded into a scratch engine and its records read first, so one
        that does not decode (SnapshotError, one line) leaves meshd's engine untouched; then the job records it
        carries. `durable`: how far this node's journal had carried out the log; a snapshot past it skipped
        entries this node never acted on (`_reconcile` once the log is replayed)."""
        c = self.ctx
        if c.fresh_engine is not None:
            snapshot.decode(snap.engine, c.fresh_engine())
        known, new = {f.name for f in fields(JobRecord)}, {}
        for job_id, payload in snap.records.items():
            if job_id not in c.records:
                try:
                    data = {k: v for k, v in payload.items() if k in known}
                    new[job_id] = JobRecord(**dict(data, job_dir=str(c.config.jobs_dir / job_id)))
                except (TypeError, AttributeError) as exc:
                    raise snapshot.SnapshotError(f"job record {job_id}: {exc}") from None
        try:
            submitted = {str(k): int(v) for k, v in snap.submitted.items()}
        except (TypeError, ValueError) as exc:
            raise snapshot.SnapshotError(f"submitted: {exc}") from None
        snapshot.decode(snap.engine, c.engine)
        c.records.update(new)
        self.submitted.update(submitted)
        now = time.time()
        with c.journal.batch():
            for job_id in snap.records:
                job = c.engine.state.jobs.get(job_id)
                if job is not None:
                    mirror(c.records[job_id], job, now)
                    c.journal.put(c.records[job_id])
        if c.engine.timers.at is not None:  # the leader arms the engine's one timer
            c.loop.handlers[ScheduleTimer](ScheduleTimer(c.engine.timers.at, c.engine.timers.key))
        if snap.index > durable:
            state, me = c.engine.state, c.config.node_name
            self.behind = {j: job.restarts for j, job in state.jobs.items()
                           if job.state.holds_gpus and any(state.gpus[g].node == me for g in job.gpus)}

    def _reconcile(self, placed: dict[str, int]) -> None:
        """This node's journal was behind the snapshot it loaded: the entries in between were never carried out
        here. A local run the mesh has moved on from (its job ended, requeued, or started again) is stopped; a job
        the skipped entries started here (`placed`: job -> run) whose ranks never launched goes back to the queue."""
        c = self.ctx
        state = c.engine.state
        for job_id, run in list(c.runs.launched.items()):
            job = state.jobs.get(job_id)
            moved = job is None or not job.state.holds_gpus or job.restarts != run
            if moved and c.launcher.running(job_id) and job_id not in c.runs.restart_for:
                LOG.info("job %s: the mesh moved on from this run while meshd was down; stopping its ranks", job_id)
                c.launcher.stop(job_id, c.config.kill_grace)
        for job_id, run in placed.items():
            job = state.jobs.get(job_id)
            if job is not None and job.state.holds_gpus and job.restarts == run and c.runs.launched.get(job_id) != run:
                c.loop.input(ev.JobFailed(c.loop.sid("behind"), job_id, "meshd restarted behind the mesh's snapshot: "
                                          "this run's launch here was never carried out", requeue=True), run)

    # ---------------------------------------------------------------- launches held behind the log's head

    def gate(self, handlers: dict[type, Callable]) -> None:
        """Route the actions on a job's processes through the hold (`handlers` is the engine loop's table)."""
        for kind in (Launch, Preempt, Kill, Reconfigure, SignalJob):
            handlers[kind] = self._gated(handlers[kind])

    def _gated(self, carry: Callable) -> Callable:
        def run(action) -> None:
            if isinstance(action, Launch) and (self.holding or action.job_id in self.held):
                self.held[action.job_id] = [(carry, action)]  # a later Launch supersedes the held one
            elif action.job_id in self.held:  # after the held launch, in log order
                self.held[action.job_id].append((carry, action))
            else:
                carry(action)
        return run

    def release_held(self) -> None:
        """At the log's head again (caught up after a partition, or at start): of the launches held behind it, carry
        out only those of jobs the engine STILL places here as that run on those GPUs and not running here yet, with
        the actions on them since (a preemption, a reconfiguration), in log order. The others were superseded by
        later entries (requeued once this node was declared lost, started elsewhere, cancelled) and are dropped."""
        c = self.ctx
        held, self.held = self.held, {}
        for job_id, actions in held.items():
            launch, job = actions[0][1], c.engine.state.jobs.get(job_id)  # (the engine counts the run at its Launch)
            if (job is None or not job.state.holds_gpus or job.restarts != launch.restart + 1
                    or tuple(job.gpus) != tuple(launch.gpus) or c.launcher.running(job_id)):
                LOG.info("job %s: its launch here, held while this node caught up with the log, was superseded: "
                         "not started", job_id)
                continue
            for carry, action in actions:
                carry(action)

    def stop_released(self, job_ids: list[str]) -> None:
        """Ranks still running here of a job the engine no longer places here (a multi-node job whose rank 0
        ended, a job requeued while this node was counted lost) are stopped."""
        c = self.ctx
        for job_id in dict.fromkeys(job_ids):
            job = c.engine.state.jobs.get(job_id)
            here = job is not None and job.state.holds_gpus and any(
                c.engine.state.gpus[g].node == c.config.node_name for g in job.gpus)
            if not here and c.launcher.running(job_id) and job_id not in c.runs.restart_for:
                LOG.info("job %s: the mesh no longer places it here; stopping its ranks", job_id)
                c.launcher.stop(job_id, c.config.kill_grace)

    def cancel(self, rec: JobRecord) -> None:
        """Propose the cancel: the node holding the job's ranks kills them when the cancel is in the log."""
        c = self.ctx
        if rec.state in TERMINAL:
            return
        if not rec.cancel_proposed:  # journaled before the answer: a crash cannot lose it in the outbox
            rec.cancel_proposed = True
            with c.journal.batch():
                c.journal.put(rec)
        c.loop.input(ev.CancelRequested(c.loop.sid("cancel"), rec.job_id))

    # ---------------------------------------------------------------- fencing (daemon.mesh decides when)

    @property
    def outbox_path(self) -> Path:
        """Where MeshLink keeps its outbox of proposals not yet handed to etcd (survives a SIGKILL of meshd)."""
        return self.ctx.config.state_dir / "mesh-outbox.jsonl"

    def fence(self, budget: float) -> list[str]:
        """This node cannot show etcd it is alive: stop every rank it runs before the leader may declare it lost
        (at the earliest `budget` seconds from now). Rank 0's node asks for a checkpoint-and-exit, as a
        preemption does (the exit is a JobPaused, not a failure); the ranks are SIGTERMed in any case once
        `budget` less the kill grace has passed. Nothing is started again here unless the log says so."""
        c = self.ctx
        hard = max(0.0, budget - c.config.kill_grace - 6.0)  # the launcher SIGKILLs kill_grace + 5 s after SIGTERM
        stopped = []
        for job_id in list(c.runs.launched):
            if job_id in self.fenced or not c.launcher.running(job_id):
                continue
            self.fenced[job_id] = time.time()
            stopped.append(job_id)
            c.runs.restart_for.pop(job_id, None)
            if c.runs.rank0_here(job_id) and hard > 0:
                c.runs.preempt(Preempt(job_id))  # checkpoint first (jobs on the SDK), then SIGTERM
                asyncio.get_running_loop().call_later(hard, self._fence_stop, job_id)
            else:
                if c.runs.rank0_here(job_id):
                    c.records[job_id].pausing = True  # its exit is a JobPaused: stopped, not failed
                c.launcher.stop(job_id, c.config.kill_grace)
        if stopped:
            LOG.warning("mesh: fenced: stopping %d job(s) here: %s", len(stopped), ", ".join(stopped))
        return stopped

    def _fence_stop(self, job_id: str) -> None:
        c = self.ctx
        if job_id in self.fenced and c.launcher.running(job_id):
            c.launcher.stop(job_id, c.config.kill_grace)

    def unfence(self) -> None:
        """etcd hears this node again: what fencing stopped waits for the log (its exits are in the outbox)."""
        self.fenced.clear()

    def leadership_changed(self, leader: str | None) -> None:
        self.ctx.notify(f"STATUS=mesh leader: {leader or 'none'}")


class ReportGate:
    """(mesh) Rank 0's progress reports thinned to one log entry per REPORT_GAP a job."""

    def __init__(self) -> None:
        self._reported: dict[str, float] = {}  # job -> when its last progress report was proposed

    def due(self, job_id: str) -> bool:
        """Whether rank 0's progress report goes to the log now (at most one per REPORT_GAP a job)."""
        now = time.time()
        if now - self._reported.get(job_id, -REPORT_GAP) < REPORT_GAP:
            return False
        self._reported[job_id] = now
        return True

    def forget(self, job_id: str) -> None:
        self._reported.pop(job_id, None)


def record_payload(rec: JobRecord) -> dict:
    """What other nodes need of a job record to list and launch it (never its token-scrubbed env twice)."""
    out = json.loads(rec.to_json())
    for key in ("supervisor_pid", "supervisor_start", "state", "reason", "cancel_proposed"):
        out.pop(key, None)
    return out
