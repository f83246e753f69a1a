"""EngineLoop: the one way into meshd's engine: event -> engine -> journal -> actions.

Events raised while one is handled are queued, never nested. Every engine event runs in one journal transaction;
the records of the jobs it changed are mirrored from the engine (`daemon.mirror`) and written in it. A transaction
a full disk refuses is kept in memory and retried (`daemon.diskwatch`): the event stands, and what is said of a
job is what happened to it. What happens
on this node is an *input*: one server hands it to the engine at once, a mesh proposes it to the leader
(`daemon.mesh.MeshLink`) and applies it once it is in the log. The loop also names each stimulus (`sid`).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable

from meshsched.daemon.diskwatch import DiskWatch
from meshsched.daemon.journal import JobRecord, Journal
from meshsched.daemon.launcher import Launcher
from meshsched.daemon.mirror import mirror

from meshsched import events as ev
from meshsched.actions import ScheduleTimer
from meshsched.engine import Engine
from meshsched.executor import dispatch
from meshsched.state import Job

LOG = logging.getLogger("meshd")


class EngineLoop:
    def __init__(self, engine: Engine, journal: Journal, records: dict[str, JobRecord], launcher: Launcher,
                 handlers: dict[type, Callable], mesh=None) -> None:
        self.engine = engine
        self.journal = journal
        self.records = records
        self.launcher = launcher
        self.handlers = handlers  # action type -> what carries it out here
        self.mesh = mesh  # a MeshLink: inputs are proposed to its leader, the engine follows its log
        self.after: Callable[[list[str]], None] = lambda job_ids: None  # (mesh) the replica stops released ranks
        self.ended: Callable[[JobRecord, Job, str], None] = lambda rec, job, old: None  # job control's waiters
        # accounting and retention (daemon/accounting.py, daemon/retention.py): a job's end, jobs forgotten
        self.accounted: Callable[[JobRecord], None] = lambda rec: None
        self.forgot: Callable[[tuple[str, ...]], None] = lambda job_ids: None
        self._events: deque[ev.Event] = deque()
        self._dispatching = False
        self._stimulus = itertools.count(1)
        self.disk = DiskWatch(journal)  # a full disk: writes kept and retried, new launches held
        # job -> its record's values (JobRecord.values) as just journaled (Submission): its first pass puts it only
        # if the pass changed it (an array on a busy cluster is written once, not twice)
        self.clean: dict[str, tuple] = {}

    def sid(self, kind: str) -> str:
        """A new stimulus id."""
        return f"{kind}-{next(self._stimulus)}"

    def dispatch(self, event: ev.Event) -> None:
        """Feed `event` to the engine (events raised while handling one are queued, never nested)."""
        self._events.append(event)
        if self._dispatching:
            return
        self._dispatching = True
        try:
            while self._events:
                self.handle(self._events.popleft())
        finally:
            self._dispatching = False

    def dispatch_many(self, events: list[ev.Event]) -> None:
        """Feed events that happened together (an array's tasks, a bulk cancel) to the engine with one scheduling
        pass after the last (`Engine.handle_many`), in one journal transaction; while one is being handled, they
        are queued behind it, one by one."""
        if len(events) < 2 or self._dispatching or self._events:
            for event in events:
                self.dispatch(event)
            return
        self._dispatching = True
        try:
            self.handle_many(events)
            while self._events:
                self.handle(self._events.popleft())
        finally:
            self._dispatching = False

    def dispatch_queued(self) -> None:
        """Handle what was queued while nothing is being handled (an input queued from outside the loop)."""
        if self._events and not self._dispatching:
            self.dispatch(self._events.popleft())

    def input(self, event: ev.Event, run: int | None = None, queued: bool = False, record: dict | None = None) -> None:
        """Something happened here: the engine hears of it now (one server) or once the mesh's leader has put
        it in the log (`queued`: after the event being handled, never nested)."""
        if self.mesh is not None:
            self.mesh.propose(event, run, record)
        elif queued:
            self._events.append(event)
        else:
            self.dispatch(event)

    def handle(self, event: ev.Event, now: float | None = None, act: bool = True, index: int | None = None) -> None:
        """One event in one journal transaction; `act`: carry out its actions (a mesh replaying what this node
        already did does not); `index`: the log entry it is (journaled as applied)."""
        now = time.time() if now is None else now
        jid = getattr(event, "job_id", None) or getattr(getattr(event, "spec", None), "job_id", None)
        memory = self.engine.memory
        with self.journal.batch(defer=True):  # the event happened: a full disk keeps its writes for a retry
            actions = self.engine.handle(event, now)
            touched = ([jid] if jid else []) + self.engine.take_changed()  # the event's job, what the engine changed
            if self.engine.memory is not memory:  # the preemption layer remembered something: durable with it
                self._journal_memory()
            if type(event) is ev.DrainChanged and self.mesh is None:  # (a mesh replays its log)
                self.journal.put_drains([r.to_dict() for r in self.engine.drains.records.values()])
            for action in actions:
                if act:
                    dispatch("meshd", self.handlers, action)
                elif isinstance(action, ScheduleTimer):
                    self.handlers[ScheduleTimer](action)
            for job_id in dict.fromkeys(touched):
                self._sync(job_id, now)
            if type(event) is ev.JobsForgotten:  # retention: meshd forgets what the engine did
                self.forgot(event.job_ids)
            if index is not None:
                self.journal.set_applied(index)
        self.disk.check()
        self.after(touched)

    def handle_many(self, events: list[ev.Event], now: float | None = None) -> None:
        """`handle` for events that happened together (one server): one engine call, one transaction."""
        now = time.time() if now is None else now
        memory = self.engine.memory
        with self.journal.batch(defer=True):
            actions = self.engine.handle_many(events, now)
            touched = [getattr(e, "job_id", None) or e.spec.job_id for e in events] + self.engine.take_changed()
            if self.engine.memory is not memory:
                self._journal_memory()
            for action in actions:
                dispatch("meshd", self.handlers, action)
            for job_id in dict.fromkeys(touched):
                self._sync(job_id, now)
        self.disk.check()
        self.after(touched)

    def _sync(self, job_id: str, now: float) -> None:
        """Mirror the engine's view of a job into its durable record and journal any transition."""
        job = self.engine.state.jobs.get(job_id)
        rec = self.records.get(job_id)
        if job is None or rec is None:
            return
        old = mirror(rec, job, now)
        if job_id in self.disk.parked:  # its launch waits for disk space
            rec.reason = self.disk.reason
        if self.mesh is not None and not job.state.holds_gpus and rec.supervisor_pid and \
                not self.launcher.running(job_id):
            rec.supervisor_pid, rec.supervisor_start = 0, ""  # its exit is in the log now
        self.ended(rec, job, old)
        if old != rec.state:
            self.journal.transition(job_id, now, rec.state, rec.reason)
            why = f" ({rec.reason})" if rec.reason else ""
            LOG.info("job %s (%s): %s -> %s%s", job_id, rec.name, old, rec.state, why)
            if job.state.is_terminal:  # its accounting row, in this transaction
                self.accounted(rec)
        if (clean := self.clean.pop(job_id, None)) is None or clean != rec.values():  # (clean and left as it was: not)
            self.journal.put(rec)

    def _journal_memory(self) -> None:
        layer = self.engine.policy.remembers()
        if layer is not None and self.engine.memory is not None and self.mesh is None:  # a mesh replays its log
            self.journal.put_memory(layer.encode_memory(self.engine.memory))

    def restore_memory(self) -> None:
        """(one server) The preemption layer's memory from the journal (Lazer: deferrals, observations), before
        anything is scheduled: a restart neither forgets what it learned nor a deferral it promised."""
        layer = self.engine.policy.remembers()
        text = self.journal.load_memory()
        if layer is None or text is None:
            return
        try:
            self.engine.memory = layer.decode_memory(text)
        except (ValueError, KeyError, TypeError) as exc:
            LOG.warning("the policy's journaled memory is unreadable (%s); it starts afresh", exc)
