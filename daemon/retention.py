"""Retention: ended jobs leave the live journal, meshd's records and the engine after `keep_finished` seconds, and
their job directories after `keep_job_dirs` (0: kept forever, as Slurm's MinJobAge = 0); accounting keeps their rows.

A sweep runs a second after meshd starts, then every `interval(keep)` seconds. Forgetting goes through the engine as one event, `JobsForgotten`
(an input: on a mesh only the leader proposes it, and every node applies it in log order, so every node forgets the
same jobs). When it is handled (`forgot`, inside that event's journal transaction) each forgotten job's accounting
row is made sure of (jobs that ended before accounting existed get theirs now), its record and transitions leave
the journal, and meshd's per-job memory lets go of it: meshd's memory and `mesh ls --all` stay flat.
A queued job whose dependency a forgotten job met has it dropped (job control's `on_forget`, mirrored into its
record); one it never will meet keeps it and is cancelled DependencyNeverSatisfied once it is considered.
Job directories go only when no unfinished record names them and no process of theirs runs here.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from meshsched import events as ev
from meshsched.daemon.accounting import Accounting
from meshsched.daemon.config import DaemonConfig
from meshsched.daemon.engine_loop import EngineLoop
from meshsched.daemon.journal import TERMINAL, JobRecord, Journal
from meshsched.daemon.launcher import Launcher
from meshsched.daemon.runs import LocalRuns
from meshsched.engine import Engine

LOG = logging.getLogger("meshd")
BATCH = 250  # jobs one JobsForgotten names at most (a mesh log entry stays small)


def interval(keep: float) -> float:
    """Seconds between sweeps for an age limit of `keep` seconds: a tenth of it, between 1 s and 5 min."""
    return min(300.0, max(1.0, keep / 10))


@dataclass(frozen=True, slots=True)
class RetentionContext:
    config: DaemonConfig
    records: dict[str, JobRecord]
    engine: Engine
    journal: Journal
    loop: EngineLoop
    launcher: Launcher
    runs: LocalRuns
    accounting: Accounting
    proposes: Callable[[], bool] = lambda: True  # (mesh) only the leader proposes what every node then forgets


class Retention:
    def __init__(self, ctx: RetentionContext) -> None:
        self.ctx = ctx
        self._task: asyncio.Task | None = None
        self.forgotten = 0  # jobs forgotten since start
        self.dirs_removed = 0

    def start(self) -> None:
        cfg = self.ctx.config
        keeps = [k for k in (cfg.keep_finished, cfg.keep_job_dirs) if k > 0]
        if keeps:
            self._task = asyncio.get_running_loop().create_task(self._run(interval(min(keeps))))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self, every: float) -> None:
        await asyncio.sleep(min(every, 1.0))  # the first soon after start: a restart over a long journal trims it
        while True:
            try:
                for _ in self._steps(time.time()):
                    await asyncio.sleep(0)  # requests are served between batches
            except Exception:  # a sweep that fails (a disk error) is tried again next time; meshd goes on
                LOG.exception("retention sweep failed")
            await asyncio.sleep(every)

    def sweep(self, now: float) -> None:
        """Forget the jobs ended more than keep_finished ago; remove job dirs older than keep_job_dirs."""
        for _ in self._steps(now):
            pass

    def _steps(self, now: float):
        """The sweep, one batch of jobs at a time (yields after each)."""
        cfg, loop = self.ctx.config, self.ctx.loop
        if cfg.keep_finished > 0 and self.ctx.proposes():
            due = self.due(now - cfg.keep_finished)
            for i in range(0, len(due), BATCH):
                loop.input(ev.JobsForgotten(loop.sid("retention"), tuple(due[i:i + BATCH])), queued=True)
                loop.dispatch_queued()
                yield
        if cfg.keep_job_dirs > 0:
            self.remove_dirs(now - cfg.keep_job_dirs)

    def due(self, cutoff: float) -> list[str]:
        """Ended jobs whose end is before `cutoff` (and the engine knows ended, or not at all)."""
        jobs = self.ctx.engine.state.jobs
        out = []
        for rec in self.ctx.records.values():
            if rec.state in TERMINAL and (rec.end_time if rec.end_time is not None else rec.submit_time) < cutoff:
                job = jobs.get(rec.job_id)
                if job is None or job.state.is_terminal:
                    out.append(rec.job_id)
        return out

    def forgot(self, job_ids: tuple[str, ...]) -> None:
        """(EngineLoop, in the JobsForgotten event's transaction) what the engine forgot leaves meshd too."""
        c = self.ctx
        for job_id in job_ids:
            rec = c.records.get(job_id)
            if rec is None or job_id in c.engine.state.jobs or rec.state not in TERMINAL:
                continue
            c.accounting.ended(rec, keep=True)
            c.journal.forget(job_id)
            del c.records[job_id]
            c.runs.forget_run(job_id)  # its channel's reports and directives
            c.runs.launched.pop(job_id, None)
            self.forgotten += 1

    def remove_dirs(self, cutoff: float) -> None:
        """Job directories of ended or forgotten jobs, ended (else last changed) before `cutoff`."""
        c = self.ctx
        try:
            entries = list(c.config.jobs_dir.iterdir())
        except OSError:
            return
        for path in entries:
            rec = c.records.get(path.name)
            if not path.is_dir() or path.is_symlink() or c.launcher.running(path.name):
                continue
            if rec is not None and (rec.state not in TERMINAL or Path(rec.job_dir) != path):
                continue
            try:
                ended = rec.end_time if rec is not None and rec.end_time is not None else path.stat().st_mtime
            except OSError:
                continue
            if ended < cutoff:
                shutil.rmtree(path, ignore_errors=True)
                self.dirs_removed += 1
