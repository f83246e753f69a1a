"""NodeDaemon: meshd's lifecycle and the loop event -> engine -> journal -> actions.

This server is its own leader (the embedded local coordinator): the engine and policy are the same
classes the simulator drives. Every engine event runs in one journal transaction; the job records
touched by the event or its actions are written in it. Resources are set up in order in `start()` and
torn down in reverse by `close()` (an AsyncExitStack). Closing meshd never stops jobs: they live in their
own sessions and the next meshd re-adopts them. Under the etcd coordinator the engine follows the mesh's log
instead: `daemon/mesh.py` carries it, `daemon/mesh_node.py` applies it here. What the API shows of jobs and
nodes is `daemon/listing.py`'s.
"""

from __future__ import annotations

import asyncio
import enum
import fcntl
import itertools
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

from meshsched import events as ev
from meshsched.actions import Action, FitModel, Kill, Launch, Preempt, Reconfigure, ScheduleTimer
from meshsched.daemon.config import DaemonConfig
from meshsched.daemon.confine import job_limits, open_confiner, thread_env, usable_cpus
from meshsched.daemon.dirs import highest_job_dir, private_dir
from meshsched.daemon.gpus import GpuBackend, open_backend, profile_type
from meshsched.daemon.hostres import HostResources, host_resources
from meshsched.daemon.jobcontrol import (HOLDING, TERMINAL, JobControl, default_name, job_spec,
                                         refuse_never_runnable, resources)
from meshsched.daemon.journal import Journal, JobRecord
from meshsched.daemon.listing import Listings
from meshsched.daemon.launcher import Launcher, Outcome, free_port, read_outcome
from meshsched.daemon.mesh_node import MeshReplica, shared_port
from meshsched.daemon.mps import MpsManager, open_mps
from meshsched.daemon.notify import Notifier
from meshsched.daemon.users import owner_of, share_dirs
from meshsched.daemon.supervisor import LaunchSpec
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.executor import check_handlers, dispatch
from meshsched.perf.loader import installed_handle
from meshsched.policies.registry import make_policy, needs_models
from meshsched.exitcodes import PREEMPTED_EXIT_CODE
from meshsched.protocol import DEFAULT_ITERATIONS, ReportContext, SubmitRequest, check_report
from meshsched.state import ExecConfig, JobState, NodeSpec

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
        self._events: deque[ev.Event] = deque()
        self._dispatching = False
        self._timer: asyncio.TimerHandle | None = None
        self._stimulus = itertools.count(1)
        self._tasks: set[asyncio.Task] = set()
        self._closed = asyncio.Event()
        self._notifier = Notifier()
        self.sdk_jobs: set[str] = set()  # running jobs whose ranks speak meshsched.job (they take directives)
        self.directives: dict[str, list[dict]] = {}  # job -> directives for its rank 0, sent with the next reply
        self.nudge: Callable[[str], None] = lambda job_id: None  # asks rank 0 to send now (the job socket's)
        self.throughput: dict[str, dict[int, dict]] = {}  # job -> rank -> latest report (samples/s, times)
        self._preempt_timers: dict[str, asyncio.TimerHandle] = {}
        self._restart_for: dict[str, ExecConfig] = {}  # job -> config it restarts with once it has checkpointed
        self._fit_pool: ProcessPoolExecutor | None = None  # model fits (Lazer's GP) run here, off the loop
        self._handlers = {Launch: self._launch, Preempt: self._preempt, Kill: self._kill,
                          Reconfigure: self._reconfigure, ScheduleTimer: self._arm_timer, FitModel: self._fit}
        check_handlers("meshd", self._handlers)
        self._id_floor = 1  # new job ids continue past every existing job directory
        self.mesh = None  # a MeshLink under the etcd coordinator: the engine follows the mesh's log
        self.replica: MeshReplica | None = None  # (mesh) what this node does with that log
        self._runs: dict[str, int] = {}  # job -> the launch count its local ranks were started with
        self.control = JobControl(self)  # arrays, dependencies, time limits, hold/release/requeue, --wait
        self.listings = Listings(self)  # `mesh ls` and `mesh ls --json`, cached between state changes

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
            self._id_floor = highest_job_dir(cfg.jobs_dir) + 1
            self.journal = Journal(cfg.journal_path)
            self._stack.callback(self.journal.close)
            self.host = host_resources(cfg)
            self.gpus = open_backend(cfg.fake_gpus, cfg.gpu_type, cfg.gpu_memory_mb)
            self._stack.callback(self.gpus.close)
            self.mps = open_mps(cfg, self.gpus)
            await self.mps.start()
            self._stack.push_async_callback(self.mps.close)
            # models are read here, once, never inside a scheduling pass; XGBoost only for a sharing policy
            handle = installed_handle(interference=needs_models(cfg.policy))
            handle = replace(handle, one_user_per_gpu=cfg.mps_one_user)  # sharing pairs one user's jobs under MPS
            self.engine = Engine(make_policy(cfg.policy, handle), ProfileEstimator(handle.perf))
            systemd_run = _systemd_run(cfg.systemd_scope)
            confiner = open_confiner(cfg.confine, usable_cpus(cfg.node_cpus, cfg.reserved_cpus),
                                     systemd_run is not None, cfg.cgroup_root, _tag(cfg.state_dir))
            self.launcher = Launcher(loop, self._on_exit, systemd_run, log_max_bytes=int(cfg.log_max_mb * 2**20),
                                     confiner=confiner)
            self._stack.callback(self.launcher.close)
            self._stack.callback(lambda: [t.cancel() for t in self._tasks])
            self._stack.callback(self._cancel_timer)
            self._stack.callback(lambda: [t.cancel() for t in self._preempt_timers.values()])
            self._stack.callback(self._close_fit_pool)
            if cfg.coordinator is not None and cfg.coordinator.backend != "local":
                from meshsched.daemon.coordinator import open_coordinator
                from meshsched.daemon.mesh import MeshLink

                self.replica = MeshReplica(self)
                self.mesh = MeshLink(self, self.replica, open_coordinator(cfg.coordinator, cfg.node_name),
                                     cfg.coordinator, cfg.node_grace)
                self.replica.recover_local_runs()
                self.mesh.start()
                self._stack.push_async_callback(self.mesh.close)
            else:
                self._recover()
            from meshsched.daemon.api import start_api
            from meshsched.daemon.jobsock import start_job_socket

            self._stack.push_async_callback(await start_job_socket(self))
            self._stack.push_async_callback(await start_api(self))
            self._stack.callback(self._notifier.close)
            if self._notifier.watchdog_interval:
                task = loop.create_task(self._watchdog(self._notifier.watchdog_interval))
                self._stack.callback(task.cancel)
            self.started_at = time.time()
            self.status = Status.RUNNING
            self._notifier.send(f"READY=1\nSTATUS=serving {len(self.gpus.inventory())} GPU(s)\nMAINPID={os.getpid()}")
        except BaseException:
            await self._stack.aclose()
            self.status = Status.CLOSED
            self._closed.set()
            raise

    async def close(self) -> None:
        if self.status in (Status.CLOSING, Status.CLOSED):
            await self._closed.wait()
            return
        self.status = Status.CLOSING
        self._notifier.send("STOPPING=1")
        try:
            await self._stack.aclose()
        finally:
            self.status = Status.CLOSED
            self._closed.set()

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

    # ---------------------------------------------------------------- the event loop of the engine

    def dispatch(self, event: ev.Event) -> None:
        """Feed `event` to the engine (events raised while handling one are queued, never nested)."""
        self._events.append(event)
        if self._dispatching:
            return
        self._dispatching = True
        try:
            while self._events:
                self._handle(self._events.popleft())
        finally:
            self._dispatching = False

    def _sid(self, kind: str) -> str:
        return f"{kind}-{next(self._stimulus)}"

    def _handle(self, event: ev.Event, now: float | None = None, act: bool = True, index: int | None = None) -> None:
        now = time.time() if now is None else now
        touched: list[str] = []
        jid = getattr(event, "job_id", None) or getattr(getattr(event, "spec", None), "job_id", None)
        if jid:
            touched.append(jid)
        memory = self.engine.memory
        with self.journal.batch():
            actions = self.engine.handle(event, now)
            if self.engine.memory is not memory:  # the preemption layer remembered something: durable with it
                self._journal_memory()
            touched += self.engine.settled  # jobs job control queued, blocked or cancelled in passing
            for action in actions:
                if isinstance(action, Action):
                    touched.append(action.job_id)
                if act:
                    dispatch("meshd", self._handlers, action)
                elif isinstance(action, ScheduleTimer):
                    self._arm_timer(action)
            for job_id in dict.fromkeys(touched):
                self._sync(job_id, now)
            if index is not None:
                self.journal.set_applied(index)
        if self.replica is not None:
            self.replica.stop_released(touched)

    def _journal_memory(self) -> None:
        encode = getattr(self.engine.policy.preemption, "encode_memory", None)
        if encode is not None and self.engine.memory is not None and self.mesh is None:  # a mesh replays its log
            self.journal.put_memory(encode(self.engine.memory))

    def _restore_memory(self) -> None:
        """(one server) The preemption layer's memory from the journal (Lazer: deferrals, observations), before
        anything is scheduled: a restart neither forgets what it learned nor a deferral it promised."""
        decode = getattr(self.engine.policy.preemption, "decode_memory", None)
        text = self.journal.load_memory()
        if decode is None or text is None:
            return
        try:
            self.engine.memory = decode(text)
        except (ValueError, KeyError, TypeError) as exc:
            LOG.warning("the policy's journaled memory is unreadable (%s); it starts afresh", exc)

    def _input(self, event: ev.Event, run: int | None = None, queued: bool = False, record: dict | None = None) -> None:
        """Something happened here: the engine hears of it now (one server) or once the mesh's leader has put
        it in the log (`queued`: after the event being handled, never nested)."""
        if self.mesh is not None:
            self.mesh.propose(event, run, record)
        elif queued:
            self._events.append(event)
        else:
            self.dispatch(event)

    def _preempt(self, action: Preempt) -> None:
        if not self._rank0_here(action.job_id):  # its other nodes stop once rank 0 has checkpointed and left
            return
        rec = self.records[action.job_id]
        rec.pausing = True
        self._restart_for.pop(rec.job_id, None)
        self._checkpoint_exit(rec)

    def _checkpoint_exit(self, rec: JobRecord) -> None:
        if rec.job_id in self.sdk_jobs:  # cooperative: checkpoint-and-exit, SIGTERM after the grace period
            self.send_directive(rec.job_id, {"kind": "checkpoint_exit"})
            self._preempt_timers[rec.job_id] = asyncio.get_running_loop().call_later(
                self.config.preempt_grace, self._preempt_expired, rec.job_id)
        else:
            self.launcher.stop(rec.job_id, self.config.kill_grace)

    def _kill(self, action: Kill) -> None:
        if self.mesh is not None and not self.launcher.running(action.job_id):
            return  # nothing of it runs here
        rec = self.records[action.job_id]
        self._restart_for.pop(rec.job_id, None)
        if self.mps.kind == "none":
            self.launcher.stop(rec.job_id, self.config.kill_grace)
        else:  # MPS: terminate_client for every worker before any signal
            task = asyncio.get_running_loop().create_task(self._terminate_then_stop(rec))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _reconfigure(self, action: Reconfigure) -> None:
        """Micro-batch, accumulation and per-rank samples (LISS) change in-process at a step boundary (a
        `calibrate` directive to the SDK; applied when rank 0 collects it). MPS limits and plans are fixed per
        CUDA context: checkpoint and exit, then the same GPUs are relaunched with the new config (`_on_exit`)."""
        if not self._rank0_here(action.job_id):
            return
        rec = self.records[action.job_id]
        x = action.exec
        if not action.restart and rec.job_id in self.sdk_jobs:
            directive = {"kind": "calibrate", "accum_steps": x.accumulation, "micro_batch": x.micro_batch,
                         "exec": x.to_dict()}
            job = self.engine.state.jobs[rec.job_id]
            if x.local_batches is not None or (job.exec is not None and job.exec.local_batches is not None):
                directive["local_batches"] = list(x.samples(rec.gpus))  # LISS (even again when it is reset)
            self.send_directive(rec.job_id, directive)
            return
        self._restart_for[rec.job_id] = x
        self._checkpoint_exit(rec)

    def directive_taken(self, job_id: str, directive: dict) -> None:
        """Rank 0 collected a directive: a calibration takes effect at its next step boundary."""
        if directive.get("kind") == "calibrate" and "exec" in directive:
            self._input(ev.ReconfigureApplied(self._sid("calibrated"), job_id, ExecConfig.from_dict(directive["exec"])),
                        self._runs.get(job_id), queued=True)

    def _preempt_expired(self, job_id: str) -> None:
        self._preempt_timers.pop(job_id, None)
        LOG.warning("job %s: no exit %.0f s after checkpoint-and-exit; SIGTERM", job_id, self.config.preempt_grace)
        self.launcher.stop(job_id, self.config.kill_grace)

    def send_directive(self, job_id: str, directive: dict) -> None:
        """Queue a directive (checkpoint_exit, calibrate) for the job's rank 0; it rides on the next reply, which
        the nudge asks for now rather than at the job's next report."""
        self.directives.setdefault(job_id, []).append(directive)
        self.nudge(job_id)

    def take_directives(self, job_id: str) -> list[dict]:
        out = self.directives.pop(job_id, [])
        for d in out:
            self.directive_taken(job_id, d)
        if self._events and not self._dispatching:
            self.dispatch(self._events.popleft())
        return out

    async def _terminate_then_stop(self, rec: JobRecord) -> None:
        gpus = [self.engine.state.gpus[g].local_index for g in rec.assigned]
        workers = self.launcher.workers(rec.job_id)
        for gpu, pid in zip(gpus, workers):
            try:
                await self.mps.terminate_client(gpu, pid)
            except (RuntimeError, OSError):
                pass  # the signals below still stop it
        self.launcher.stop(rec.job_id, self.config.kill_grace)

    def _launch(self, action: Launch) -> None:
        rec = self.records[action.job_id]
        state = self.engine.state
        x = action.exec
        rec.exec = x.to_dict()
        rec.node = state.gpus[action.gpus[0]].node  # rank 0's
        ranks = [r for r, g in enumerate(action.gpus) if state.gpus[g].node == self.config.node_name]
        if not ranks or self.launcher.running(rec.job_id):
            return  # its ranks run on other nodes (or, replaying the mesh's log, already here)
        local = [state.gpus[action.gpus[r]].local_index for r in ranks]
        inv = self.gpus.inventory()
        nodes = list(dict.fromkeys(state.gpus[g].node for g in action.gpus))
        many = len(nodes) > 1
        env = dict(os.environ)
        env.update(rec.env)
        env.setdefault("MESH_GRACE_PERIOD", str(self.config.preempt_grace))
        # The SDK trains with this micro-batch and accumulation (the global batch is unchanged).
        env.update(MESH_MICRO_BATCH=str(x.micro_batch), MESH_ACCUM_STEPS=str(x.accumulation),
                   MESH_MPS_PERCENTAGE=str(x.mps_percentage), MESH_PLAN=x.plan or rec.plan or "")  # else the asked
        self._forget_run(rec.job_id)
        limits = job_limits(self.launcher.confiner, (rec.cpus, rec.memory_gb, rec.gpus),
                            (x.cpus_per_gpu, x.memory_gb_per_gpu), len(local),
                            (self.host.cpus, self.host.memory_gb, len(inv)),
                            [r.cpu_ids for r in self.records.values() if r.job_id != rec.job_id and r.cpu_ids
                             and self.launcher.running(r.job_id)])
        if limits.cpus:  # OpenMP & co. use the rank's share of the job's CPUs
            env.update(thread_env(len(limits.cpus), len(local), rec.env))
        spec = LaunchSpec(
            job_id=rec.job_id, command=rec.command, cwd=rec.cwd, env=env, local_gpus=local,
            master_port=shared_port(rec.job_id, action.restart) if many else free_port(), restart=action.restart,
            socket=str(self.config.job_socket), first_rank=ranks[0], world_size=len(action.gpus),
            node_rank=nodes.index(self.config.node_name),
            master_addr=self.mesh.addresses.get(nodes[0], nodes[0]) if many else "127.0.0.1",
            output=rec.output, error=rec.error,
            checkpoint_dir=str(self._checkpoints(rec)), grace=self.config.kill_grace,
            rank_envs=[self.mps.client_env(g, share=x.mps_percentage, mem_limit_mb=x.memory_limit_mb) for g in local],
            devices=[inv[g].cuda_id for g in local],
        )
        try:
            owner = owner_of(rec.uid) if rec.uid is not None else None  # many users: the job runs as its submitter
            rec.supervisor_pid, rec.supervisor_start, limits = self.launcher.spawn(Path(rec.job_dir), spec, owner,
                                                                                   limits)
        except (OSError, KeyError) as exc:  # KeyError: its user no longer exists
            self._input(ev.JobFailed(self._sid("launch"), rec.job_id, f"could not start on {self.config.node_name}: "
                                     f"{exc}"), action.restart + 1, queued=True)
            return
        rec.cpu_ids, rec.memory_limit_gb, rec.memory_enforced_by = list(limits.cpus), limits.memory_gb, limits.memory_by
        self._runs[rec.job_id] = action.restart + 1  # the engine's launch count while this run lives
        rec.pausing = False
        if ranks[0] == 0:
            self._input(ev.JobStarted(self._sid("spawned"), rec.job_id), action.restart + 1, queued=True)

    def _checkpoints(self, rec: JobRecord) -> Path:
        """Where the job's checkpoints live: its job dir, or `checkpoint_root/<id>` (shared storage in a mesh, so a
        job requeued to another node resumes)."""
        root = self.config.checkpoint_root
        return Path(rec.job_dir) / "checkpoints" if root is None else root / rec.job_id

    def _sync(self, job_id: str, now: float) -> None:
        """Copy the engine's view of a job into its durable record and journal any transition."""
        job = self.engine.state.jobs.get(job_id)
        rec = self.records.get(job_id)
        if job is None or rec is None:
            return
        old = rec.state
        rec.state = job.state.value
        rec.reason = job.reason
        if job.gpus:  # kept after the job lets go: where it last ran
            rec.assigned = list(job.gpus)
        rec.restarts = job.restarts
        rec.done_iterations = job.done_iterations
        rec.checkpoint_iterations = job.checkpoint_iterations
        rec.step_time = job.step_time
        if job.exec is not None:
            rec.exec = job.exec.to_dict()
        if job.state is JobState.LOADING and rec.start_time is None:
            rec.start_time = now
        if job.state.is_terminal and rec.end_time is None:
            rec.end_time = now
        if not job.state.holds_gpus:  # a re-adopted PAUSING job is RUNNING to the engine: keep the flag
            rec.pausing = False
            if self.mesh is not None and rec.supervisor_pid and not self.launcher.running(job_id):
                rec.supervisor_pid, rec.supervisor_start = 0, ""  # its exit is in the log now
        self.control.synced(rec, job, old)
        if old != rec.state:
            self.journal.transition(job_id, now, rec.state, rec.reason)
            why = f" ({rec.reason})" if rec.reason else ""
            LOG.info("job %s (%s): %s -> %s%s", job_id, rec.name, old, rec.state, why)
        self.journal.put(rec)

    def _arm_timer(self, action: ScheduleTimer) -> None:  # the ScheduleTimer handler
        if self.mesh is not None:  # the leader arms it
            self.mesh.timer_set(action)
            return
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        delay = max(0.0, action.at - time.time())
        self._timer = loop.call_later(delay, self.dispatch, ev.Tick(self._sid("tick"), action.key))

    def _fit(self, action: FitModel) -> None:  # the FitModel handler
        """Run the fit in a worker process (bit-identical to a fit in the simulator, and the loop keeps
        serving); its result comes back as ModelFitted."""
        if self.mesh is not None:  # a fitted model is a live object: it cannot travel through the log yet
            LOG.warning("model fits are not carried across the mesh: the policy keeps its prior model")
            return
        if self._fit_pool is None:
            import multiprocessing

            self._fit_pool = ProcessPoolExecutor(1, multiprocessing.get_context("spawn"), initializer=_one_thread)
        loop = asyncio.get_running_loop()
        future = self._fit_pool.submit(action.fit, action.request)
        future.add_done_callback(lambda f: loop.call_soon_threadsafe(self._fitted, f))

    def _fitted(self, future: Future) -> None:
        if self.status is not Status.RUNNING or future.cancelled():
            return
        if (err := future.exception()) is not None:
            LOG.warning("a model fit failed: %s: %s (the policy goes on with its last model)", type(err).__name__, err)
            return
        model = future.result()  # unpickling a torch model imported torch: the policy's suggestions use one thread
        _one_thread()
        self.dispatch(ev.ModelFitted(self._sid("fitted"), model))

    def _close_fit_pool(self) -> None:
        if self._fit_pool is not None:
            self._fit_pool.shutdown(wait=False, cancel_futures=True)
            self._fit_pool = None

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_exit(self, job_id: str, outcome: Outcome) -> None:
        """A job's supervisor ended: turn its outcome into the engine event it means."""
        rec = self.records[job_id]
        if self.mesh is None:  # in a mesh the pid stays until the log has the exit (a restart proposes it again)
            rec.supervisor_pid, rec.supervisor_start = 0, ""
        rec.exit_code = outcome.exit_code
        if self.mesh is not None:  # durable now: the exit itself may wait in the outbox
            with self.journal.batch():
                self.journal.put(rec)
        self._forget_run(job_id)
        run = self._runs.pop(job_id, None)
        job = self.engine.state.jobs.get(job_id)
        if job is None or not job.state.holds_gpus:
            with self.journal.batch():
                self.journal.put(rec)
            return
        if self.mesh is not None and not self._rank0_here(job_id, running=False):
            with self.journal.batch():
                self.journal.put(rec)
            if outcome.status == "failed":  # rank 0's node reports the job's end; a failure here ends it too
                self._input(ev.JobFailed(self._sid("exit"), job_id, f"ranks on {self.config.node_name} failed: "
                                         f"{outcome.reason}"), run)
            return
        if rec.cancelling:  # every process of the job is gone: now it is CANCELLED and its GPUs free
            rec.cancelling = False
            self.dispatch(ev.CancelRequested(self._sid("cancelled"), job_id))
            return
        again = self._restart_for.pop(job_id, None)
        if again is not None and outcome.status not in ("completed", "failed") and not rec.pausing:
            # checkpointed for a reconfiguration, or stopped by signal (a job not on the SDK's socket yet; its
            # supervisor, signalled before it set up, leaves no result): the same GPUs, the new config, resumed
            # from the last checkpoint
            self._launch(Launch(job_id, job.gpus, job.checkpoint_iterations, job.restarts, again))
            if run is not None:
                self._runs[job_id] = run  # the same run to the engine: it did not count a launch
            self._input(ev.ReconfigureApplied(self._sid("reconfigured"), job_id, again), run)
            return
        event = self._outcome_event(job_id, outcome, rec.pausing or job.state is JobState.PAUSING)
        if isinstance(event, ev.JobFailed) and event.requeue:  # it exited resumable on its own: back off
            delay = self.config.self_preempt_backoff * 2 ** (rec.self_preempts - 1)
            LOG.warning("job %s exited resumable without a preemption; requeued in %.1f s", job_id, delay)
            self._preempt_timers[job_id] = asyncio.get_running_loop().call_later(delay, self._input, event, run)
            return
        self._input(event, run)

    def _forget_run(self, job_id: str) -> None:
        """Drop what belonged to the job's last run (directives, throughput, the preemption timer)."""
        self.sdk_jobs.discard(job_id)
        if self.replica is not None:
            self.replica.forget_run(job_id)
        self.directives.pop(job_id, None)
        self.throughput.pop(job_id, None)
        timer = self._preempt_timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()

    def _outcome_event(self, job_id: str, outcome: Outcome, pausing: bool) -> ev.Event:
        if outcome.status == "completed":
            return ev.JobFinished(self._sid("exit"), job_id)
        if outcome.status == "preempted":  # checkpointed and exited on its own: resumable either way
            if pausing:
                return ev.JobPaused(self._sid("exit"), job_id, self.engine.state.jobs[job_id].checkpoint_iterations)
            rec = self.records[job_id]
            rec.self_preempts += 1
            if rec.self_preempts > self.config.self_preempt_limit:
                return ev.JobFailed(self._sid("exit"), job_id, f"exited {rec.self_preempts} times with code "
                                    f"{PREEMPTED_EXIT_CODE} (resumable) although no preemption was asked for")
            return ev.JobFailed(self._sid("exit"), job_id, "exited resumable without a preemption", requeue=True)
        if outcome.status == "failed":
            return ev.JobFailed(self._sid("exit"), job_id, outcome.reason)
        if pausing:
            job = self.engine.state.jobs[job_id]
            return ev.JobPaused(self._sid("exit"), job_id, job.checkpoint_iterations)
        return ev.JobFailed(self._sid("exit"), job_id, outcome.reason or "terminated outside meshd")

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
        pass sees the GPUs of a live job that is not re-adopted yet as free."""
        self._restore_memory()
        self.dispatch(ev.NodeJoined(self._sid("join"), self.node_spec()))
        ngpus = len(self.gpus.inventory())
        outcomes: list[ev.Event] = []
        for rec in self.journal.load():
            self.records[rec.job_id] = rec
            if rec.state in TERMINAL:
                continue
            spec, held = self.control.recovered(rec)
            if rec.gpus > ngpus:
                self.dispatch(ev.JobRestored(self._sid("restore"), spec, rec.restarts > 0,
                                             rec.checkpoint_iterations, rec.restarts, held))
                continue
            if rec.state in HOLDING and rec.assigned and max(rec.assigned) < ngpus:
                adopt = ev.JobAdopted(self._sid("adopt"), spec, tuple(rec.assigned), rec.done_iterations,
                                      rec.checkpoint_iterations, rec.restarts,
                                      ExecConfig.from_dict(rec.exec) if rec.exec else None, rec.time_limit_at)
                job_dir = Path(rec.job_dir)
                if self.launcher.adopt(rec.job_id, rec.supervisor_pid, rec.supervisor_start, job_dir):
                    self.dispatch(adopt)
                    if rec.cancelling:  # the cancel's kill timer died with the previous meshd
                        self._kill(Kill(rec.job_id))
                    continue
                self._kill_leftovers(rec)
                self.dispatch(adopt)
                outcome = read_outcome(job_dir)
                if rec.cancelling:
                    rec.cancelling = False
                    outcomes.append(ev.CancelRequested(self._sid("recover"), rec.job_id))
                elif outcome.status == "lost" or (outcome.status == "terminated" and not rec.pausing):
                    why = "meshd restarted and the job's processes were gone"
                    outcomes.append(ev.JobFailed(self._sid("recover"), rec.job_id, why, requeue=True))
                else:
                    outcomes.append(self._outcome_event(rec.job_id, outcome, rec.pausing))
                continue
            self._reap_orphan(rec)
            self.dispatch(ev.JobRestored(self._sid("restore"), spec, rec.restarts > 0,
                                         rec.checkpoint_iterations, rec.restarts, held))
        for event in outcomes:
            self.dispatch(event)
        self.dispatch(ev.RecoveryDone(self._sid("recovered")))
        live = sum(1 for r in self.records.values() if r.state not in TERMINAL)
        LOG.info("recovered %d job record(s), %d not finished", len(self.records), live)

    def _kill_leftovers(self, rec: JobRecord) -> None:
        """Its supervisor died while meshd was down: SIGKILL what it left (ranks, their children)."""
        left = self.launcher.kill_leftovers(rec.job_id, rec.supervisor_pid)
        if left:
            LOG.warning("job %s: killed %d process(es) its dead supervisor left", rec.job_id, len(left))

    def _reap_orphan(self, rec: JobRecord) -> None:
        """meshd crashed between spawning the job and journaling the launch: SIGKILL that supervisor."""
        orphan = self.launcher.reap_orphan(Path(rec.job_dir), rec.job_id)
        if orphan is not None:
            LOG.warning("job %s: killed orphaned supervisor %d (launch never journalled)", rec.job_id, orphan)

    # ---------------------------------------------------------------- requests (API and job socket)

    def submit(self, req: SubmitRequest, user: str) -> JobRecord:
        refuse_never_runnable(self, req)  # one line, no id taken, nothing journaled
        seq, job_id = self.new_job_id()
        rec = JobRecord(
            job_id=job_id, seq=seq, gpus=req.gpus, model=req.model, batch_size=req.batch_size,
            iterations=req.iterations or DEFAULT_ITERATIONS, iterations_given=req.iterations is not None,
            submit_time=time.time(), name=req.name or default_name(req.command),
            user=user, deadline=req.deadline, guaranteed=req.guaranteed, command=req.command, cwd=req.cwd,
            env=req.env, job_dir=str(self.config.jobs_dir / job_id), **resources(req),
        )
        spec = job_spec(rec)  # validates
        with self.journal.batch():  # durable first: a failed write (full disk) leaves no phantom job
            self.journal.put(rec)
            self.journal.transition(job_id, rec.submit_time, "PENDING", "submitted")
        self.records[job_id] = rec
        self.submitted(rec, ev.JobSubmitted(self._sid("submit"), spec))
        return rec

    def new_job_id(self) -> tuple[int, str]:
        """The next sequence number and the job id it makes (in a mesh `NODE.SEQ`: unique without a leader)."""
        seq = self.journal.next_seq(self._id_floor)
        return seq, str(seq) if self.mesh is None else f"{self.config.node_name}.{seq}"

    def submitted(self, rec: JobRecord, event: ev.JobSubmitted) -> None:
        """A journaled submit reaches the engine (one server) or the mesh's leader with what nodes need to run it."""
        if self.mesh is None:
            self.dispatch(event)
            return
        from meshsched.daemon.mesh import record_payload

        self._input(event, record=record_payload(rec))

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
                self._kill(Kill(job_id))
            return rec
        if rec.state not in TERMINAL:
            self.dispatch(ev.CancelRequested(self._sid("cancel"), job_id))
        return rec

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
            if self.replica is not None and not self.replica.report_due(job_id):  # each is an entry on every node
                return
            self._input(ev.IterationReport(self._sid("report"), job_id, iterations, step_time, age or 0.0),
                        self._runs.get(job_id))
            ranks = self.throughput.get(job_id, {})
            if rank is not None and len(ranks) == self.records[job_id].gpus > 1:  # every rank has reported
                fwd = [ranks[r]["forward_time"] for r in sorted(ranks)]  # what tells a straggler (Gimbal sec. 6)
                times = fwd if min(fwd) > 0 else [ranks[r]["step_time"] for r in sorted(ranks)]
                self._input(ev.RankReport(self._sid("ranks"), job_id, tuple(times)), self._runs.get(job_id))

    def job_hello(self, job_id: str, sdk: bool, steps: int | None = None) -> None:
        if sdk:
            self.sdk_jobs.add(job_id)
        rec = self.records.get(job_id)
        if steps and rec is not None and not rec.iterations_given and steps != rec.iterations:
            rec.iterations = steps  # journalled with the event; `mesh submit --iters` would have overridden it
            self._input(ev.TotalDeclared(self._sid("hello"), job_id, steps), self._runs.get(job_id))

    def job_checkpoint(self, job_id: str, iterations: float) -> None:
        self._input(ev.CheckpointSaved(self._sid("checkpoint"), job_id, iterations), self._runs.get(job_id))

    def job_of_pid(self, pid: int) -> str | None:
        """The job whose workers include `pid` (every worker is in its supervisor's session)."""
        try:
            sid = os.getsid(pid)
        except OSError:
            return None
        return self.launcher.sessions.get(sid)

    # ---------------------------------------------------------------- where a job's ranks run (in a mesh)

    def _rank0_here(self, job_id: str, running: bool = True) -> bool:
        """One server: always. In a mesh: rank 0 of the job's current run is on this node (it checkpoints,
        takes directives and reports the job's end)."""
        if self.mesh is None:
            return True
        job = self.engine.state.jobs.get(job_id)
        here = job is not None and bool(job.gpus) and self.engine.state.gpus[job.gpus[0]].node == self.config.node_name
        return here and (not running or self.launcher.running(job_id))

    def rank_home(self, rec: JobRecord, rank: int) -> tuple[str, int]:
        """The node that ran the job's global `rank` last and its local rank there (the log's name)."""
        gpus = self.engine.state.gpus
        if self.mesh is None or not rec.assigned or rank >= len(rec.assigned):
            return self.config.node_name, rank
        node = gpus[rec.assigned[rank]].node
        return node, sum(1 for g in rec.assigned[:rank] if gpus[g].node == node)


def _one_thread() -> None:
    """Model work (fits in the worker, suggestions in meshd) uses one torch/OpenMP thread: at a few hundred
    points more threads only cost CPU."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

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

