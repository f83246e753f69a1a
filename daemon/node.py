"""NodeDaemon: meshd's lifecycle and the loop event -> engine -> journal -> actions.

This server is its own leader (the embedded local coordinator): the engine and policy are the same
classes the simulator drives. Every engine event runs in one journal transaction; the job records
touched by the event or its actions are written in it. Resources are set up in order in `start()` and
torn down in reverse by `close()` (an AsyncExitStack). Closing meshd never stops jobs: they live in their
own sessions and the next meshd re-adopts them. The daemon composes parts, each seeing the node through a narrow
context: `daemon/engine_loop.py` (the way into the engine), `daemon/runs.py` (the actions on local processes),
`daemon/submission.py` (the one submit path), `daemon/control.py` (job control), `daemon/listing.py` (what the
API shows). Under the etcd coordinator the engine follows the mesh's log instead: `daemon/mesh.py` carries it,
`daemon/mesh_node.py` applies it here.
"""

from __future__ import annotations

import asyncio
import enum
import fcntl
import json
import logging
import os
import shutil
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import AsyncExitStack
from pathlib import Path

from meshsched import drain
from meshsched import events as ev
from meshsched.actions import FitModel, Kill, Launch, Preempt, Reconfigure, ScheduleTimer, SignalJob
from meshsched.daemon.accounting import Accounting
from meshsched.daemon.config import DaemonConfig
from meshsched.daemon.confine import open_confiner, usable_cpus
from meshsched.daemon.control import PLAIN, ControlContext, JobControl
from meshsched.daemon.dirs import private_dir
from meshsched.daemon.engine_loop import EngineLoop
from meshsched.daemon.faultwatch import FaultWatch, WatchContext
from meshsched.daemon.forgotten import find_forgotten, stop_forgotten, supervisor_of
from meshsched.daemon.gpus import GpuBackend, open_backend, profile_type
from meshsched.daemon.hostres import HostResources, host_resources
from meshsched.daemon.idmark import IdMark
from meshsched.daemon.journal import HOLDING, TERMINAL, Journal, JobRecord
from meshsched.daemon.listing import ListingContext, Listings
from meshsched.daemon.launcher import Launcher, read_outcome
from meshsched.daemon.mesh_node import MeshReplica, ReplicaContext, ReportGate
from meshsched.daemon.mps import MpsManager, open_mps
from meshsched.daemon.notify import Notifier
from meshsched.daemon.runs import JobChannel, LocalRuns, RunContext
from meshsched.daemon.retention import Retention, RetentionContext
from meshsched.daemon.submission import Submission, SubmitContext
from meshsched.daemon.supervisor import LaunchSpec
from meshsched.daemon.users import share_dirs
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.executor import check_handlers
from meshsched.loaders.profiles import installed_handle
from meshsched.policies.registry import make_policy, needs_models
from meshsched.wire.protocol import ReportContext, SubmitRequest, check_report
from meshsched.state import ExecConfig, JobSpec, NodeSpec

LOG = logging.getLogger("meshd")


class Status(enum.Enum):
    NEW = "new"
    STARTING = "starting"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class NodeDaemon:
    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.status = Status.NEW
        self.records: dict[str, JobRecord] = {}
        self.started_at = 0.0
        self.engine: Engine | None = None
        self.journal: Journal | None = None
        self.gpus: GpuBackend | None = None
        self.host: HostResources | None = None  # the node's CPUs and memory for jobs (read at start)
        self.launcher: Launcher | None = None
        self.mps: MpsManager | None = None
        self._stack = AsyncExitStack()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = asyncio.Event()
        self.leave = asyncio.Event()  # set to stop serving (main's SIGTERM/SIGINT, or a restart below)
        self.restart_reason: str | None = None  # why meshd should start again in place once closed (main execs)
        self._notifier = Notifier()
        self.channel = JobChannel()  # the job socket's: SDK jobs, directives for rank 0, throughput reports
        self.sdk_jobs, self.directives, self.throughput = (self.channel.sdk_jobs, self.channel.directives,
                                                           self.channel.throughput)
        self._fit_pool: ProcessPoolExecutor | None = None  # model fits (Lazer's GP) run here, off the loop
        self._handlers = {Launch: lambda a: self.runs.launch(a), Preempt: lambda a: self.runs.preempt(a),
                          Kill: lambda a: self.runs.kill(a), Reconfigure: lambda a: self.runs.reconfigure(a),
                          ScheduleTimer: self._arm_timer, FitModel: self._fit, SignalJob: lambda a: self.runs.signal(a)}
        check_handlers("meshd", self._handlers)
        self._ids: IdMark | None = None  # new job ids continue past every id given out and every job directory
        self.mesh = None  # a MeshLink under the etcd coordinator: the engine follows the mesh's log
        self.replica: MeshReplica | None = None  # (mesh) what this node does with that log
        self.reports: ReportGate | None = None  # (mesh) rank 0's progress reports, thinned
        # the parts, made at start (each sees its node through a narrow context):
        self.loop: EngineLoop | None = None  # the one way into the engine
        self.runs: LocalRuns | None = None  # the engine's actions on this node's processes
        self.control: JobControl | None = None  # dependencies, hold/release/requeue, --wait
        self.submission: Submission | None = None  # the one submit path
        self.listings: Listings | None = None  # `mesh ls` and `mesh ls --json`, cached between state changes
        self.accounting: Accounting | None = None  # a row per ended job (`mesh acct`), kept past retention
        self.retention: Retention | None = None  # ended jobs and their dirs forgotten after keep_finished / _job_dirs

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self.status is not Status.NEW:
            raise RuntimeError(f"meshd is {self.status.value}; start() runs once")
        self.status = Status.STARTING
        cfg = self.config
        loop = asyncio.get_running_loop()
        try:
            for path in (cfg.state_dir, cfg.jobs_dir, cfg.runtime_dir):
                private_dir(path)
            if cfg.submit_users:  # other users reach their own job directories and the sockets, list nothing
                share_dirs(cfg.state_dir, cfg.jobs_dir, cfg.runtime_dir)
            self._stack.callback(_lock(cfg.state_dir / "meshd.lock"))
            self._stack.callback(_lock(cfg.runtime_dir / "meshd.lock"))  # before touching its sockets
            self._ids = IdMark(cfg.state_dir / "last-job-id", cfg.jobs_dir)  # kept apart from the journal
            self._stack.callback(self._ids.close)
            self.journal = Journal(cfg.journal_path)
            self._stack.callback(self.journal.close)
            self.host = host_resources(cfg)
            self.gpus = open_backend(cfg.fake_gpus, cfg.gpu_type, cfg.gpu_memory_mb)
            self._stack.callback(self.gpus.close)
            self.mps = open_mps(cfg, self.gpus)
            await self.mps.start()
            self._stack.push_async_callback(self.mps.close)
            # models are read here, once, never inside a scheduling pass; XGBoost only for a sharing policy
            handle = installed_handle(interference=needs_models(cfg.policy), one_user_per_gpu=cfg.mps_one_user)
            self._fresh_engine = lambda: Engine(make_policy(cfg.policy, handle), ProfileEstimator(handle.perf))
            self.engine = self._fresh_engine()  # (mesh) a snapshot is tried in another fresh one first
            systemd_run = _systemd_run(cfg.systemd_scope)
            confiner = open_confiner(cfg.confine, usable_cpus(cfg.node_cpus, cfg.reserved_cpus),
                                     systemd_run is not None, cfg.cgroup_root, _tag(cfg.state_dir))
            self.launcher = Launcher(loop, lambda job_id, outcome: self.runs.on_exit(job_id, outcome), systemd_run,
                                     log_max_bytes=int(cfg.log_max_mb * 2**20), confiner=confiner)
            self._stack.callback(self.launcher.close)
            self._stack.callback(self._cancel_timer)
            self._stack.callback(self._close_fit_pool)
            self._make_parts()
            self._stack.callback(self.runs.close)
            self._stack.callback(self.runs.faults.start())  # a shared GPU is one fault domain (daemon/faultwatch.py)
            self._make_retention()
            if self.mesh is not None:
                self.replica.recover_local_runs()
                self._stop_forgotten()
                self.mesh.start()
                self._stack.push_async_callback(self.mesh.close)
            else:
                self._recover()
            await self._serve(loop)
        except BaseException:
            await self._stack.aclose()
            self.status = Status.CLOSED
            self._closed.set()
            raise

    def _make_parts(self) -> None:
        """The engine's loop and the parts around it, each given what it uses (never this daemon); under the etcd
        coordinator the mesh's link and this node's replica of its log too."""
        cfg = self.config
        self.started_at = time.time()
        mesh = cfg.coordinator is not None and cfg.coordinator.backend != "local"
        self.loop = EngineLoop(self.engine, self.journal, self.records, self.launcher, self._handlers)
        self.reports = ReportGate() if mesh else None
        addresses: dict[str, str] = {}  # (mesh) node -> where its ranks are reached
        self.runs = LocalRuns(RunContext(
            cfg, self.engine, self.journal, self.launcher, self.records, self.gpus, self.host, self.mps, self.loop,
            self.channel, addresses, mesh, self.reports.forget if mesh else lambda job_id: None))
        self.runs.faults = FaultWatch(WatchContext(cfg.node_name, cfg.kill_grace, self.engine, self.loop, self.launcher,
                                                   self.mps, self.records, self.runs.outcome_event))
        self.control = JobControl(ControlContext(self.records, self.engine, self.journal, self.launcher, self.loop))
        self.loop.ended = self.control.ended
        if mesh:
            self._make_mesh(addresses)
        self.submission = Submission(SubmitContext(cfg, self.records, self.engine, self.journal, self.loop,
                                                   self.control, self.mesh, self._ids))
        self.listings = Listings(ListingContext(cfg, self.records, self.engine, self.journal, self.throughput,
                                                self.gpus, self.host, self.launcher, self.mps, self.mesh,
                                                self.started_at))

    def _make_retention(self) -> None:
        """Accounting (a row per ended job, written with the event that ended it) and retention's sweep."""
        state = self.engine.state
        self.accounting = Accounting(self.journal, lambda rec: sorted({state.gpus[g].node for g in rec.assigned
                                                                       if g < len(state.gpus)}))
        self.retention = Retention(RetentionContext(self.config, self.records, self.engine, self.journal, self.loop,
                                                    self.launcher, self.runs, self.accounting,
                                                    lambda: self.mesh is None or self.mesh.leader == self.config.node_name))
        self.loop.accounted, self.loop.forgot = self.accounting.ended, self.retention.forgot
        self.retention.start()
        self._stack.callback(self.retention.close)

    def _make_mesh(self, addresses: dict[str, str]) -> None:
        from meshsched.daemon.coordinator_backends import open_coordinator
        from meshsched.daemon.mesh import LinkContext, MeshLink

        cfg, engine = self.config, self.engine
        self.replica = MeshReplica(ReplicaContext(
            cfg, engine, self.journal, self.launcher, self.records, self.loop, self.runs,
            lambda rec: self.submission.post(rec), self.node_spec, self._notifier.send, self._fresh_engine))
        self.replica.gate(self._handlers)  # launches wait while this node is behind the log's head (the loop's table)
        link = LinkContext(cfg.node_name, cfg.mesh_address or cfg.node_name,
                           tuple(g.name for g in self.gpus.inventory()), self.journal.applied(),
                           lambda: engine.state.nodes, addresses, restart=self.restart)
        self.mesh = MeshLink(link, self.replica, open_coordinator(cfg.coordinator, cfg.node_name), cfg.coordinator,
                             cfg.node_grace)
        self.loop.mesh = self.mesh
        self.loop.after = self.replica.stop_released

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """The job socket and the API open; systemd hears that meshd is ready."""
        from meshsched.daemon.api import start_api
        from meshsched.daemon.jobsock import start_job_socket

        self._stack.push_async_callback(await start_job_socket(self))
        self._stack.push_async_callback(await start_api(self))
        self._stack.callback(self._notifier.close)
        if self._notifier.watchdog_interval:
            task = loop.create_task(self._watchdog(self._notifier.watchdog_interval))
            self._stack.callback(task.cancel)
        self.status = Status.RUNNING
        self._notifier.send(f"READY=1\nSTATUS=serving {len(self.gpus.inventory())} GPU(s)\nMAINPID={os.getpid()}")

    async def close(self) -> None:
        if self.status in (Status.CLOSING, Status.CLOSED):
            await self._closed.wait()
            return
        self.status = Status.CLOSING
        self._notifier.send(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}" if self.restart_reason
                            else "STOPPING=1")  # (a restart in place: the same PID sends READY=1 again)
        try:
            await self._stack.aclose()
        finally:
            self.status = Status.CLOSED
            self._closed.set()

    def restart(self, reason: str) -> None:
        """Stop serving and start again in place (`daemon.main` execs meshd once this daemon is closed): the way back
        for a state only a fresh start rebuilds. Jobs keep running and are re-adopted, as after any restart."""
        if self.restart_reason is None:
            self.restart_reason = reason
        self.leave.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> NodeDaemon:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _watchdog(self, interval: float) -> None:
        while True:
            self._notifier.send("WATCHDOG=1")
            await asyncio.sleep(interval)

    def _arm_timer(self, action: ScheduleTimer) -> None:  # the ScheduleTimer handler
        if self.mesh is not None:  # the leader arms it
            self.mesh.timer_set(action)
            return
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        delay = max(0.0, action.at - time.time())
        self._timer = loop.call_later(delay, self.loop.dispatch, ev.Tick(self.loop.sid("tick"), action.key))

    def _fit(self, action: FitModel) -> None:  # the FitModel handler
        """Run the fit in a worker process (bit-identical to a fit in the simulator, and the loop keeps
        serving); its result comes back as ModelFitted. On a mesh every node's engine asks for the same fit:
        the node that leads when the action runs fits, the worker encodes the model as plain data
        (daemon/model_codec.py) and the ModelFitted is proposed, so every node installs the same model in log
        order. A fit lost with its leader is asked for again by the policy (Lazer: at its next observation)."""
        if self.mesh is not None and self.mesh.term is None:
            return  # a follower: the leader's fit reaches this engine through the log
        if self._fit_pool is None:
            import multiprocessing

            self._fit_pool = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"), initializer=_one_thread)
        loop = asyncio.get_running_loop()
        if self.mesh is not None:
            from meshsched.daemon.model_codec import fit_encoded

            future = self._fit_pool.submit(fit_encoded, action.fit, action.request)
        else:
            future = self._fit_pool.submit(action.fit, action.request)
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(self._fitted, f))

    def _fitted(self, future: Future) -> None:
        if self.status is not Status.RUNNING or future.cancelled():
            return
        if (err := future.exception()) is not None:
            LOG.warning("a model fit failed: %s: %s (the policy goes on with its last model)", type(err).__name__, err)
            return
        model = future.result()  # the policy's suggestions use one thread too
        _one_thread()
        if self.mesh is not None:  # plain data (fit_encoded): to the log; every node decodes and installs it
            from meshsched.daemon.model_codec import MAX_BYTES

            if (size := len(json.dumps(model, separators=(",", ":")))) > MAX_BYTES:
                LOG.warning("a fitted model of %d bytes is over the log's %d: every node keeps its last model", size,
                            MAX_BYTES)
                return
            self.mesh.propose(ev.ModelFitted(f"fitted-{self.config.node_name}-{self.loop.sid('fit')}", model))
            return
        self.loop.dispatch(ev.ModelFitted(self.loop.sid("fitted"), model))

    def _close_fit_pool(self) -> None:
        if self._fit_pool is not None:
            self._fit_pool.shutdown(wait=False, cancel_futures=True)
            self._fit_pool = None

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ---------------------------------------------------------------- recovery

    def node_spec(self, address: str = "") -> NodeSpec:
        """This node as the engine (and, in its NodeJoined entry, every node of a mesh) accounts it."""
        inv = self.gpus.inventory()
        gpu_type = self.config.gpu_type or profile_type(inv[0].name)
        return NodeSpec(self.config.node_name, len(inv), gpu_type, inv[0].memory_total_mb, address,
                        self.host.cpus, self.host.memory_gb)

    def _recover(self) -> None:
        """Rebuild the engine from the journal; re-adopt live jobs, requeue the rest. Outcomes of jobs that
        ended while meshd was down (each may start a scheduling pass) wait until every record is back, so no
        pass sees the GPUs of a live job that is not re-adopted yet as free; nor of a job whose processes run but
        which no record re-adopted: those are stopped first (`_stop_forgotten`)."""
        dispatch, sid, runs = self.loop.dispatch, self.loop.sid, self.runs
        self.loop.restore_memory()
        dispatch(ev.NodeJoined(sid("join"), self.node_spec()))
        for event in drain.restore(self.journal.load_drains(), sid):  # before any pass: still drained
            dispatch(event)
        ngpus = len(self.gpus.inventory())
        outcomes: list[ev.Event] = []
        for rec in self.journal.load():
            self.records[rec.job_id] = rec
            if rec.state in TERMINAL:
                continue
            spec, held = self.control.recovered(rec)
            if rec.gpus > ngpus:
                dispatch(ev.JobRestored(sid("restore"), spec, rec.restarts > 0, rec.checkpoint_iterations, rec.restarts,
                                         held))
                continue
            if rec.state in HOLDING and rec.assigned and max(rec.assigned) < ngpus:
                adopt = ev.JobAdopted(sid("adopt"), spec, tuple(rec.assigned), rec.done_iterations,
                                      rec.checkpoint_iterations, rec.restarts,
                                      ExecConfig.from_dict(rec.exec) if rec.exec else None, rec.time_limit_at)
                job_dir = Path(rec.job_dir)
                if self.launcher.adopt(rec.job_id, rec.supervisor_pid, rec.supervisor_start, job_dir):
                    dispatch(adopt)
                    if rec.cancelling:  # the cancel's kill timer died with the previous meshd
                        runs.kill(Kill(rec.job_id))
                    continue
                runs.kill_leftovers(rec)
                dispatch(adopt)
                outcome = read_outcome(job_dir)
                if rec.cancelling:
                    rec.cancelling = False
                    outcomes.append(ev.CancelRequested(sid("recover"), rec.job_id))
                elif outcome.status == "lost" or (outcome.status == "terminated" and not rec.pausing):
                    why = "meshd restarted and the job's processes were gone"
                    outcomes.append(ev.JobFailed(sid("recover"), rec.job_id, why, requeue=True))
                else:
                    rec.exit_code = outcome.exit_code  # as on_exit records it: `mesh show`, `--wait`'s own code
                    outcomes.append(runs.outcome_event(rec.job_id, outcome, rec.pausing))
                continue
            if not held and self._adopt_unjournaled(rec, spec, ngpus):
                continue
            runs.reap_orphan(rec)
            if self._ended_unjournaled(rec):
                continue
            dispatch(ev.JobRestored(sid("restore"), spec, rec.restarts > 0, rec.checkpoint_iterations, rec.restarts, held))
        self._stop_forgotten()
        for event in outcomes:
            dispatch(event)
        dispatch(ev.RecoveryDone(sid("recovered")))
        live = sum(1 for r in self.records.values() if r.state not in TERMINAL)
        LOG.info("recovered %d job record(s), %d not finished", len(self.records), live)

    def _adopt_unjournaled(self, rec: JobRecord, spec: JobSpec, ngpus: int) -> bool:
        """A queued record whose launch the journal lost (a WAL cut short, writes a full disk kept in memory when
        meshd was killed) while that run's supervisor still runs here (its pid and start time in supervisor.pid,
        its GPUs in launch.json): the run is adopted as launched, never killed and started a second time (it may
        have ended and be handing its result over). A job across nodes is left to the orphan rule."""
        job_dir = Path(rec.job_dir)
        try:
            launch = LaunchSpec.load(job_dir / "launch.json")
        except (OSError, ValueError, KeyError, TypeError):
            return False
        gpus = tuple(launch.local_gpus)
        if (not gpus or len(gpus) != rec.gpus or launch.world_size not in (0, len(gpus)) or max(gpus) >= ngpus
                or launch.restart < rec.restarts):
            return False
        pid, start = supervisor_of(rec.job_id, job_dir)  # supervisor.pid, or the live one (a full disk refused it)
        if not self.launcher.adopt(rec.job_id, pid, start, job_dir):
            return False
        rec.assigned, rec.restarts = list(gpus), launch.restart + 1
        rec.supervisor_pid, rec.supervisor_start = pid, start
        self.loop.dispatch(ev.JobAdopted(self.loop.sid("adopt"), spec, gpus, rec.checkpoint_iterations,
                                         rec.checkpoint_iterations, rec.restarts,
                                         ExecConfig.from_dict(rec.exec) if rec.exec else None, rec.time_limit_at))
        LOG.warning("job %s (%s): its run %d runs (supervisor %d) but the journal had lost its launch: adopted",
                    rec.job_id, rec.name, launch.restart, pid)
        return True

    def _ended_unjournaled(self, rec: JobRecord) -> bool:
        """A queued record whose job dir holds the end (completed or failed) of a run it does not know was launched
        (its launch and end were lost from the journal: a WAL cut short, writes a full disk kept in memory when meshd
        was killed) ends as that run did, never to run again. A result of a run the record knows (its `restarts`
        counts launches; result.json says which run it is of) is of a run since requeued; a preempted or terminated
        run is meant to run again."""
        outcome = read_outcome(Path(rec.job_dir))
        if outcome.status not in ("completed", "failed") or outcome.run is None or outcome.run < rec.restarts:
            return False
        now = time.time()
        try:
            ended = (Path(rec.job_dir) / "result.json").stat().st_mtime
        except OSError:
            ended = now
        rec.state = "COMPLETED" if outcome.status == "completed" else "FAILED"
        rec.reason = "" if outcome.status == "completed" else outcome.reason
        rec.exit_code, rec.restarts, rec.end_time = outcome.exit_code, outcome.run + 1, ended
        rec.supervisor_pid, rec.supervisor_start, rec.held = 0, "", False
        if outcome.status == "completed":
            rec.done_iterations = rec.checkpoint_iterations = float(rec.iterations)
        with self.journal.batch(defer=True):  # a full disk keeps it for a retry
            self.journal.transition(rec.job_id, now, rec.state, rec.reason)
            self.journal.put(rec)
        LOG.warning("job %s (%s): its run %d ended (%s, exit code %s) but the journal had lost it: %s, not run "
                    "again", rec.job_id, rec.name, outcome.run, outcome.status, outcome.exit_code, rec.state)
        return True

    def _stop_forgotten(self) -> None:
        """Job processes no record re-adopted (a journal moved aside, emptied, cut short or stale) are stopped, and
        start waits until they are gone: the first scheduling pass comes after this, so their GPUs are never given
        to another job while they run (daemon/forgotten.py)."""
        cfg, confiner = self.config, self.launcher.confiner
        found = find_forgotten(cfg.jobs_dir, cfg.job_socket, confiner.parent, self.launcher.running)
        if found:
            stop_forgotten(found, cfg.jobs_dir, cfg.kill_grace)
            for f in found:
                confiner.remove(f.job_id)

    # ---------------------------------------------------------------- requests (API and job socket)

    def submit(self, req: SubmitRequest, user: str) -> JobRecord:
        """Submit one job as meshd's user (`Submission.submit`, the one submit path, for a plain request)."""
        return self.submission.submit(req, PLAIN, user)[0]

    def cancel(self, job_id: str) -> JobRecord:
        rec = self.records[job_id]
        if self.replica is not None:
            self.replica.cancel(rec)
            return rec
        if rec.state in HOLDING and self.launcher.running(job_id):
            if not rec.cancelling:  # CANCELLED (and its GPUs free) once every process of it is gone
                rec.cancelling = True
                with self.journal.batch():
                    self.journal.put(rec)
                self.runs.kill(Kill(job_id))
            return rec
        if rec.state not in TERMINAL:
            self.loop.dispatch(ev.CancelRequested(self.loop.sid("cancel"), job_id))
        return rec

    def cancel_many(self, job_ids: list[str]) -> list[JobRecord]:
        """`cancel` for many jobs at once (an array, `mesh cancel` by filter): on one server the queued ones reach
        the engine together, with one scheduling pass after the last (`EngineLoop.dispatch_many`); their records."""
        if self.replica is not None:
            return [self.cancel(job_id) for job_id in job_ids]
        queued, recs = [], []
        with self.journal.batch():
            for job_id in job_ids:
                rec = self.records[job_id]
                if rec.state in HOLDING and self.launcher.running(job_id) or rec.state in TERMINAL:
                    self.cancel(job_id)
                else:
                    queued.append(ev.CancelRequested(self.loop.sid("cancel"), job_id))
                recs.append(rec)
            self.loop.dispatch_many(queued)
        return recs

    def job_report(self, job_id: str, iterations: float, step_time: float, rank: int | None = None,
                   samples: float | None = None, forward_time: float | None = None,
                   window: float | None = None, age: float | None = None) -> None:
        """A progress report; meshsched.job sends one per rank (rank 0's drives the engine). Impossible: refused.
        `age`: seconds since the first step it covers began (its step time was measured over them)."""
        last = self.throughput.get(job_id, {}).get(rank) if rank is not None else None
        check_report(iterations, step_time, rank, forward_time, ReportContext(
            self.records[job_id].gpus, last and last["iterations"], last and time.time() - last["at"]))
        if rank is not None:
            self.throughput.setdefault(job_id, {})[rank] = {
                "iterations": iterations, "step_time": step_time, "forward_time": forward_time or 0.0,
                "samples_per_second": (samples or 0.0) / window if window else 0.0, "at": time.time(),
            }
        if not rank:
            if self.reports is not None and not self.reports.due(job_id):  # each is an entry on every node
                return
            self.loop.input(ev.IterationReport(self.loop.sid("report"), job_id, iterations, step_time, age or 0.0),
                        self.runs.launched.get(job_id))
            ranks = self.throughput.get(job_id, {})
            if rank is not None and len(ranks) == self.records[job_id].gpus > 1:  # every rank has reported
                fwd = [ranks[r]["forward_time"] for r in sorted(ranks)]  # what tells a straggler (Gimbal sec. 6)
                times = fwd if min(fwd) > 0 else [ranks[r]["step_time"] for r in sorted(ranks)]
                self.loop.input(ev.RankReport(self.loop.sid("ranks"), job_id, tuple(times)), self.runs.launched.get(job_id))

    def job_hello(self, job_id: str, sdk: bool, steps: int | None = None) -> None:
        if sdk:
            self.sdk_jobs.add(job_id)
        rec = self.records.get(job_id)
        if steps and rec is not None and not rec.iterations_given and steps != rec.iterations:
            rec.iterations = steps  # journalled with the event; `mesh submit --iters` would have overridden it
            self.loop.input(ev.TotalDeclared(self.loop.sid("hello"), job_id, steps), self.runs.launched.get(job_id))

    def job_checkpoint(self, job_id: str, iterations: float) -> None:
        self.loop.input(ev.CheckpointSaved(self.loop.sid("checkpoint"), job_id, iterations), self.runs.launched.get(job_id))

    def job_of_pid(self, pid: int) -> str | None:
        """The job whose workers include `pid` (every worker is in its supervisor's session)."""
        try:
            sid = os.getsid(pid)
        except OSError:
            return None
        return self.launcher.sessions.get(sid)

    def take_directives(self, job_id: str) -> list[dict]:
        """Rank 0 collects its directives (the job socket's reply carries them)."""
        return self.runs.take_directives(job_id)

    # ---------------------------------------------------------------- where a job's ranks run (in a mesh)

    def rank_home(self, rec: JobRecord, rank: int) -> tuple[str, int]:
        """The node that ran the job's global `rank` last and its local rank there (the log's name)."""
        gpus = self.engine.state.gpus
        if self.mesh is None or not rec.assigned or rank >= len(rec.assigned):
            return self.config.node_name, rank
        node = gpus[rec.assigned[rank]].node
        return node, sum(1 for g in rec.assigned[:rank] if gpus[g].node == node)


def _one_thread() -> None:
    """Model work (fits in the worker, suggestions in meshd) uses one OpenMP thread (and one torch thread
    where torch is loaded): at a few hundred points more threads only cost CPU. Lazer's GP is numpy now
    (policies/lazer_gp.py): torch is not imported for it (seconds of a worker's start)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _systemd_run(mode: str) -> str | None:
    """systemd-run when jobs should get transient scopes: `yes`, or `auto` under systemd (INVOCATION_ID set)."""
    if mode == "no" or (mode == "auto" and not os.environ.get("INVOCATION_ID")):
        return None
    path = shutil.which("systemd-run")
    if path is None and mode == "yes":
        raise RuntimeError("systemd_scope = yes but systemd-run is not on PATH")
    return path


def _tag(path: Path) -> str:
    """A short name for a state dir (its meshd's job cgroups are told apart by it)."""
    import zlib

    return f"{zlib.crc32(str(path.resolve()).encode()):08x}"


def _lock(path: Path):
    """Hold an exclusive lock on `path` (one meshd per state dir); returns the function that releases it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(f"another meshd already serves {path.parent}") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return lambda: os.close(fd)

