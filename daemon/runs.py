"""LocalRuns: the engine's actions carried out on this node's processes, and their exits turned into engine events.

Launch spawns a job's local ranks (one supervisor per job, confined to its CPUs and memory); Preempt asks rank 0
to checkpoint and exit (the SDK's directive, SIGTERM after the grace period; a job not on the SDK is stopped);
Kill stops every process of the job (after MPS's terminate_client); Reconfigure calibrates in-process or
checkpoints and relaunches on the same GPUs. A supervisor's exit becomes JobFinished / JobPaused / JobFailed.
`JobChannel` is what the job socket shares with them: SDK jobs, directives for rank 0, throughput reports.
"""

from __future__ import annotations

import asyncio
import logging
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from meshsched.daemon.config import DaemonConfig
from meshsched.daemon.confine import job_limits, thread_env
from meshsched.daemon.diskwatch import is_full
from meshsched.daemon.engine_loop import EngineLoop
from meshsched.daemon.gpus import GpuBackend
from meshsched.daemon.hostres import HostResources
from meshsched.daemon.journal import JobRecord, Journal
from meshsched.daemon.launcher import Launcher, Outcome, free_port, job_env
from meshsched.daemon.mps import MpsManager
from meshsched.daemon.supervisor import LaunchSpec
from meshsched.daemon.users import owner_of

from meshsched import events as ev
from meshsched.actions import Kill, Launch, Preempt, Reconfigure, SignalJob
from meshsched.engine import Engine
from meshsched.state import ExecConfig, JobState
from meshsched.wire.exitcodes import PREEMPTED_EXIT_CODE

LOG = logging.getLogger("meshd")


@dataclass(slots=True)
class JobChannel:
    """What meshd and running jobs say to each other over the job socket (`daemon.jobsock`)."""

    sdk_jobs: set[str] = field(default_factory=set)  # running jobs whose ranks speak meshsched.job (take directives)
    directives: dict[str, list[dict]] = field(default_factory=dict)  # job -> directives for rank 0's next reply
    throughput: dict[str, dict[int, dict]] = field(default_factory=dict)  # job -> rank -> latest report
    nudge: Callable[[str], None] = lambda job_id: None  # asks rank 0 to send now (set by the job socket)

    def send(self, job_id: str, directive: dict) -> None:
        """Queue a directive (checkpoint_exit, calibrate) for the job's rank 0; it rides on the next reply, which
        the nudge asks for now rather than at the job's next report."""
        self.directives.setdefault(job_id, []).append(directive)
        self.nudge(job_id)


@dataclass(frozen=True, slots=True)
class RunContext:
    """What LocalRuns uses of its node."""

    config: DaemonConfig
    engine: Engine
    journal: Journal
    launcher: Launcher
    records: dict[str, JobRecord]
    gpus: GpuBackend
    host: HostResources
    mps: MpsManager
    loop: EngineLoop
    channel: JobChannel
    addresses: dict[str, str]  # (mesh) node -> where its ranks are reached
    in_mesh: bool
    forget_reports: Callable[[str], None]  # (mesh) a run's report gate starts afresh


class LocalRuns:
    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.launched: dict[str, int] = {}  # job -> the launch count its local ranks were started with
        self.restart_for: dict[str, ExecConfig] = {}  # job -> config it restarts with once it has checkpointed
        self._timers: dict[str, asyncio.TimerHandle] = {}  # job -> its preemption's grace timer, or its backoff
        self._tasks: set[asyncio.Task] = set()
        ctx.loop.disk.resume = self.resume
        self.faults = None  # a FaultWatch (daemon/faultwatch.py), set by NodeDaemon: exits of a GPU fault domain

    def close(self) -> None:
        self.ctx.loop.disk.close()
        for task in self._tasks:
            task.cancel()
        for timer in self._timers.values():
            timer.cancel()

    # ---------------------------------------------------------------- where a job's ranks run

    def rank0_here(self, job_id: str, running: bool = True) -> bool:
        """One server: always. In a mesh: rank 0 of the job's current run is on this node (it checkpoints,
        takes directives and reports the job's end)."""
        c = self.ctx
        if not c.in_mesh:
            return True
        job = c.engine.state.jobs.get(job_id)
        here = job is not None and bool(job.gpus) and c.engine.state.gpus[job.gpus[0]].node == c.config.node_name
        return here and (not running or c.launcher.running(job_id))

    # ---------------------------------------------------------------- actions

    def preempt(self, action: Preempt) -> None:
        if not self.rank0_here(action.job_id):  # its other nodes stop once rank 0 has checkpointed and left
            return
        rec = self.ctx.records[action.job_id]
        rec.pausing = True
        self.restart_for.pop(rec.job_id, None)
        self._checkpoint_exit(rec)

    def _checkpoint_exit(self, rec: JobRecord) -> None:
        c = self.ctx
        if self._stop_held(rec.job_id):
            return
        if rec.job_id in c.channel.sdk_jobs:  # cooperative: checkpoint-and-exit, SIGTERM after the grace period
            c.channel.send(rec.job_id, {"kind": "checkpoint_exit"})
            self._timers[rec.job_id] = asyncio.get_running_loop().call_later(
                c.config.preempt_grace, self._preempt_expired, rec.job_id)
        else:
            c.launcher.stop(rec.job_id, c.config.kill_grace)

    def _preempt_expired(self, job_id: str) -> None:
        self._timers.pop(job_id, None)
        LOG.warning("job %s: no exit %.0f s after checkpoint-and-exit; SIGTERM", job_id, self.ctx.config.preempt_grace)
        self.ctx.launcher.stop(job_id, self.ctx.config.kill_grace)

    def kill(self, action: Kill) -> None:
        c = self.ctx
        if c.in_mesh and not c.launcher.running(action.job_id):
            return  # nothing of it runs here
        rec = c.records[action.job_id]
        self.restart_for.pop(rec.job_id, None)
        if self._stop_held(rec.job_id):
            return
        if c.mps.kind == "none":
            c.launcher.stop(rec.job_id, c.config.kill_grace)
        else:  # MPS: terminate_client for every worker before any signal
            task = asyncio.get_running_loop().create_task(self._terminate_then_stop(rec))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def signal(self, action: SignalJob) -> None:
        """`--signal`'s warning before the time limit: the signal to each rank of the job here (B:, the record's
        `signal` starting so: rank 0's process only), as `mesh cancel --signal` sends it."""
        c = self.ctx
        rec = c.records.get(action.job_id)
        if rec is None or not c.launcher.running(action.job_id):
            return
        if not rec.signal.startswith("B:"):
            sent = c.launcher.signal_workers(action.job_id, action.signal)
        else:  # rank 0 is the first of the supervisor's children on rank 0's node
            pids = c.launcher.workers(action.job_id)[:1] if self.rank0_here(rec.job_id) else []
            sent = sum(_kill(pid, action.signal) for pid in pids)
        LOG.info("job %s: signal %d to %d rank(s) before its time limit", rec.job_id, action.signal, sent)

    async def _terminate_then_stop(self, rec: JobRecord) -> None:
        c = self.ctx
        gpus = [c.engine.state.gpus[g].local_index for g in rec.assigned]
        workers = c.launcher.workers(rec.job_id)
        for gpu, pid in zip(gpus, workers):
            try:
                await c.mps.terminate_client(gpu, pid)
            except (RuntimeError, OSError):
                pass  # the signals below still stop it
        c.launcher.stop(rec.job_id, c.config.kill_grace)

    def reconfigure(self, action: Reconfigure) -> None:
        """Micro-batch, accumulation and per-rank samples (LISS) change in-process at a step boundary (a
        `calibrate` directive to the SDK; applied when rank 0 collects it). MPS limits and plans are fixed per
        CUDA context: checkpoint and exit, then the same GPUs are relaunched with the new config (`on_exit`)."""
        if not self.rank0_here(action.job_id):
            return
        c = self.ctx
        rec = c.records[action.job_id]
        x = action.exec
        if not action.restart and rec.job_id in c.channel.sdk_jobs:
            directive = {"kind": "calibrate", "accum_steps": x.accumulation, "micro_batch": x.micro_batch,
                         "exec": x.to_dict()}
            job = c.engine.state.jobs[rec.job_id]
            if x.local_batches is not None or (job.exec is not None and job.exec.local_batches is not None):
                directive["local_batches"] = list(x.samples(rec.gpus))  # LISS (even again when it is reset)
            c.channel.send(rec.job_id, directive)
            return
        self.restart_for[rec.job_id] = x
        self._checkpoint_exit(rec)

    def take_directives(self, job_id: str) -> list[dict]:
        """Rank 0 collects its directives: a calibration takes effect at its next step boundary."""
        out = self.ctx.channel.directives.pop(job_id, [])
        for d in out:
            if d.get("kind") == "calibrate" and "exec" in d:
                self.ctx.loop.input(ev.ReconfigureApplied(self.ctx.loop.sid("calibrated"), job_id,
                                                          ExecConfig.from_dict(d["exec"])),
                                    self.launched.get(job_id), queued=True)
        self.ctx.loop.dispatch_queued()
        return out

    def launch(self, action: Launch) -> None:
        c = self.ctx
        rec = c.records[action.job_id]
        state = c.engine.state
        x = action.exec
        rec.exec = x.to_dict()
        rec.node = state.gpus[action.gpus[0]].node  # rank 0's
        ranks = [r for r, g in enumerate(action.gpus) if state.gpus[g].node == c.config.node_name]
        if not ranks or c.launcher.running(rec.job_id):
            return  # its ranks run on other nodes (or, replaying the mesh's log, already here)
        if c.loop.disk.blocked():  # a full disk: no new start, the launch waits for space (daemon/diskwatch.py)
            c.loop.disk.park(action)
            return
        local = [state.gpus[action.gpus[r]].local_index for r in ranks]
        inv = c.gpus.inventory()
        nodes = list(dict.fromkeys(state.gpus[g].node for g in action.gpus))
        many = len(nodes) > 1
        env = job_env(rec.env, rec.export, rec.uid, c.config.passthrough_names)  # never meshd's own environment
        if rec.array_task is not None:  # (the array's other variables are in the env its tasks share)
            env["MESH_ARRAY_TASK_ID"] = str(rec.array_task)
        env.setdefault("MESH_GRACE_PERIOD", str(c.config.preempt_grace))
        # The SDK trains with this micro-batch and accumulation (the global batch is unchanged).
        env.update(MESH_MICRO_BATCH=str(x.micro_batch), MESH_ACCUM_STEPS=str(x.accumulation),
                   MESH_MPS_PERCENTAGE=str(x.mps_percentage), MESH_PLAN=x.plan or rec.plan or "")  # else the asked
        env["GROUP_WORLD_SIZE"] = str(len(nodes))  # torchrun's: the job's nodes (supervisor.rank_env sets the rest)
        self.forget_run(rec.job_id)
        limits = job_limits(c.launcher.confiner, (rec.cpus, rec.memory_gb, rec.gpus),
                            (x.cpus_per_gpu, x.memory_gb_per_gpu), len(local),
                            (c.host.cpus, c.host.memory_gb, len(inv)),
                            [r.cpu_ids for r in c.records.values() if r.job_id != rec.job_id and r.cpu_ids
                             and c.launcher.running(r.job_id)])
        if limits.cpus:  # OpenMP & co. use the rank's share of the job's CPUs
            env.update(thread_env(len(limits.cpus), len(local), rec.env))
        spec = LaunchSpec(
            job_id=rec.job_id, command=rec.command, cwd=rec.cwd, env=env, local_gpus=local,
            master_port=shared_port(rec.job_id, action.restart) if many else free_port(), restart=action.restart,
            socket=str(c.config.job_socket), first_rank=ranks[0], world_size=len(action.gpus),
            node_rank=nodes.index(c.config.node_name),
            master_addr=c.addresses.get(nodes[0], nodes[0]) if many else "127.0.0.1",
            output=rec.output, error=rec.error,
            checkpoint_dir=str(self._checkpoints(rec)), grace=c.config.kill_grace,
            rank_envs=[c.mps.client_env(g, share=x.mps_percentage, mem_limit_mb=x.memory_limit_mb) for g in local],
            devices=[inv[g].cuda_id for g in local],
        )
        self._spawn(rec, spec, limits, action, ranks[0] == 0)

    def _spawn(self, rec: JobRecord, spec: LaunchSpec, limits, action: Launch, rank0: bool) -> None:
        c = self.ctx
        run = action.restart + 1
        try:
            owner = owner_of(rec.uid) if rec.uid is not None else None  # many users: the job runs as its submitter
            rec.supervisor_pid, rec.supervisor_start, limits = c.launcher.spawn(Path(rec.job_dir), spec, owner, limits)
        except OSError as exc:
            if is_full(exc):  # its files cannot be written: it waits for space, it does not fail
                c.loop.disk.park(action, exc.strerror or str(exc))
                return
            c.loop.input(ev.JobFailed(c.loop.sid("launch"), rec.job_id, f"could not start on {c.config.node_name}: "
                                      f"{exc}"), run, queued=True)
            return
        except KeyError as exc:  # its user no longer exists
            c.loop.input(ev.JobFailed(c.loop.sid("launch"), rec.job_id, f"could not start on {c.config.node_name}: "
                                      f"{exc}"), run, queued=True)
            return
        rec.cpu_ids, rec.memory_limit_gb, rec.memory_enforced_by = list(limits.cpus), limits.memory_gb, limits.memory_by
        self.launched[rec.job_id] = run  # the engine's launch count while this run lives
        rec.pausing = False
        if rank0:
            c.loop.input(ev.JobStarted(c.loop.sid("spawned"), rec.job_id), run, queued=True)

    def resume(self, launches: list[Launch]) -> None:
        """The disk has space again: carry out the launches it held (of jobs that still hold those GPUs)."""
        jobs = self.ctx.engine.state.jobs
        for action in launches:
            job = jobs.get(action.job_id)
            if job is not None and job.state is JobState.LOADING and job.gpus == action.gpus:
                self.launch(action)
        self.ctx.loop.dispatch_queued()

    def _stop_held(self, job_id: str) -> bool:
        """Stop a job whose launch waits for disk space: it ends as a run stopped before it began."""
        if self.ctx.loop.disk.unpark(job_id) is None:
            return False
        self.on_exit(job_id, Outcome("terminated", "stopped before it started (the disk was full)"))
        return True

    def _put(self, rec: JobRecord) -> None:
        """Journal `rec` now; a full disk keeps it for a retry (the exit it records has happened)."""
        with self.ctx.journal.batch(defer=True):
            self.ctx.journal.put(rec)
        self.ctx.loop.disk.check()

    def _checkpoints(self, rec: JobRecord) -> Path:
        """Where the job's checkpoints live: its job dir, or `checkpoint_root/<id>` (shared storage in a mesh, so a
        job requeued to another node resumes)."""
        root = self.ctx.config.checkpoint_root
        return Path(rec.job_dir) / "checkpoints" if root is None else root / rec.job_id

    # ---------------------------------------------------------------- exits

    def on_exit(self, job_id: str, outcome: Outcome) -> None:
        """A job's supervisor ended: turn its outcome into the engine event it means."""
        c = self.ctx
        rec = c.records[job_id]
        if not c.in_mesh:  # in a mesh the pid stays until the log has the exit (a restart proposes it again)
            rec.supervisor_pid, rec.supervisor_start = 0, ""
        rec.exit_code = outcome.exit_code
        if c.in_mesh:  # durable now: the exit itself may wait in the outbox
            self._put(rec)
        self.forget_run(job_id)
        run = self.launched.pop(job_id, None)
        job = c.engine.state.jobs.get(job_id)
        if job is None or not job.state.holds_gpus:
            self._put(rec)
            return
        if c.in_mesh and not self.rank0_here(job_id, running=False):
            self._put(rec)
            if outcome.status == "failed":  # rank 0's node reports the job's end; a failure here ends it too
                c.loop.input(ev.JobFailed(c.loop.sid("exit"), job_id, f"ranks on {c.config.node_name} failed: "
                                          f"{outcome.reason}"), run)
            return
        if rec.cancelling:  # every process of the job is gone: now it is CANCELLED and its GPUs free
            rec.cancelling = False
            c.loop.dispatch(ev.CancelRequested(c.loop.sid("cancelled"), job_id))
            return
        again = self.restart_for.pop(job_id, None)
        if again is not None and outcome.status not in ("completed", "failed") and not rec.pausing:
            # checkpointed for a reconfiguration, or stopped by signal (a job not on the SDK's socket yet; its
            # supervisor, signalled before it set up, leaves no result): the same GPUs, the new config, resumed
            # from the last checkpoint
            self.launch(Launch(job_id, job.gpus, job.checkpoint_iterations, job.restarts, again))
            if run is not None:
                self.launched[job_id] = run  # the same run to the engine: it did not count a launch
            c.loop.input(ev.ReconfigureApplied(c.loop.sid("reconfigured"), job_id, again), run)
            return
        if self.faults is not None and self.faults.claim(job_id, outcome, run):
            return  # a shared GPU's fault domain went down: the watch posts what it means (GpuFault)
        event = self.outcome_event(job_id, outcome, rec.pausing or job.state is JobState.PAUSING)
        if isinstance(event, ev.JobFailed) and event.requeue:  # it exited resumable on its own: back off
            delay = c.config.self_preempt_backoff * 2 ** (rec.self_preempts - 1)
            LOG.warning("job %s exited resumable without a preemption; requeued in %.1f s", job_id, delay)
            self._timers[job_id] = asyncio.get_running_loop().call_later(delay, c.loop.input, event, run)
            return
        c.loop.input(event, run)

    def forget_run(self, job_id: str) -> None:
        """Drop what belonged to the job's last run (directives, throughput, the preemption timer)."""
        c = self.ctx
        c.channel.sdk_jobs.discard(job_id)
        c.forget_reports(job_id)
        c.channel.directives.pop(job_id, None)
        c.channel.throughput.pop(job_id, None)
        timer = self._timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()

    def outcome_event(self, job_id: str, outcome: Outcome, pausing: bool) -> ev.Event:
        c = self.ctx
        sid = c.loop.sid
        if outcome.status == "completed":
            return ev.JobFinished(sid("exit"), job_id)
        if outcome.status == "preempted":  # checkpointed and exited on its own: resumable either way
            if pausing:
                return ev.JobPaused(sid("exit"), job_id, c.engine.state.jobs[job_id].checkpoint_iterations)
            rec = c.records[job_id]
            rec.self_preempts += 1
            if rec.self_preempts > c.config.self_preempt_limit:
                return ev.JobFailed(sid("exit"), job_id, f"exited {rec.self_preempts} times with code "
                                    f"{PREEMPTED_EXIT_CODE} (resumable) although no preemption was asked for")
            return ev.JobFailed(sid("exit"), job_id, "exited resumable without a preemption", requeue=True)
        if outcome.status == "failed":
            return ev.JobFailed(sid("exit"), job_id, outcome.reason)
        if pausing:
            job = c.engine.state.jobs[job_id]
            return ev.JobPaused(sid("exit"), job_id, job.checkpoint_iterations)
        return ev.JobFailed(sid("exit"), job_id, outcome.reason or "terminated outside meshd")

    # ---------------------------------------------------------------- what a previous meshd left

    def kill_leftovers(self, rec: JobRecord) -> None:
        """Its supervisor died while meshd was down: SIGKILL what it left (ranks, their children)."""
        left = self.ctx.launcher.kill_leftovers(rec.job_id, rec.supervisor_pid)
        if left:
            LOG.warning("job %s: killed %d process(es) its dead supervisor left", rec.job_id, len(left))

    def reap_orphan(self, rec: JobRecord) -> None:
        """meshd crashed between spawning the job and journaling the launch: SIGKILL that supervisor."""
        orphan = self.ctx.launcher.reap_orphan(Path(rec.job_dir), rec.job_id)
        if orphan is not None:
            LOG.warning("job %s: killed orphaned supervisor %d (launch never journalled)", rec.job_id, orphan)


def _kill(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


def shared_port(job_id: str, run: int) -> int:
    """MASTER_PORT of a job across nodes: every node computes the same one from the job and its run."""
    return 20000 + zlib.crc32(f"{job_id}:{run}".encode()) % 20000
