"""FaultWatch: meshd tells when a shared GPU's fault domain went down, and posts `GpuFault` (meshsched.faults).

Under MPS a fatal fault in one client, or the GPU's MPS daemon dying, ends every client on that GPU (without MPS a
fault stays in its own CUDA context: nothing here runs). Two ways meshd sees it:

- The MPS daemon of a GPU that holds jobs stops answering (asked every WATCH_S). meshd stops what is left of
  the jobs on that GPU, waits for their exits (taken here, not turned into failures), starts the GPU's daemon
  again, and only then posts GpuFault(gpu, no culprit): the engine requeues every job that was on it uncharged
  (and a new placement there finds a working daemon).
- A job sharing a GPU fails with a CUDA fatal error in its reason or the tails of its rank logs (FAULT_MARKS:
  an illegal memory access, an unspecified launch failure, an Xid, ...; or GONE_MARKS: the MPS server went
  away). Its failure is held up to WINDOW_S. If its partner on that GPU fails too within the window, the first
  of them to fail with a fault of its own (FAULT_MARKS) is the culprit, and the partner is requeued uncharged;
  when none shows one, the MPS server went away (no culprit). A partner that lives on: the held failure is
  posted as it was, WINDOW_S late.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from meshsched.daemon.engine_loop import EngineLoop
from meshsched.daemon.journal import JobRecord
from meshsched.daemon.launcher import Launcher, Outcome
from meshsched.daemon.mps import MpsManager

from meshsched import events as ev
from meshsched.engine import Engine

LOG = logging.getLogger("meshd")

WATCH_S = 2.0  # how often the MPS daemon of each GPU holding a job is asked whether it lives
WINDOW_S = 5.0  # how long a faulted job's failure waits for its partner's
TAIL_BYTES = 4096  # of each rank log, searched for a fault's marks
FAULT_MARKS = ("illegal memory access", "unspecified launch failure", "illegal instruction", "misaligned address",
               "xid", "device-side assert", "hardware stack error", "uncorrectable ecc")
GONE_MARKS = ("server exited", "mps server", "mps client", "client terminated", "mps_server", "mps_client",
              "mpsconnectionfailed", "mpsserver", "mpsclient")


def marks(text: str, which: tuple[str, ...]) -> bool:
    low = text.lower()
    return any(m in low for m in which)


@dataclass(frozen=True, slots=True)
class WatchContext:
    node: str  # this node's name (its GPUs are the ones watched)
    kill_grace: float
    engine: Engine
    loop: EngineLoop
    launcher: Launcher
    mps: MpsManager
    records: dict[str, JobRecord]
    outcome_event: Callable[[str, Outcome, bool], ev.Event]  # LocalRuns': what an exit means on its own


@dataclass(slots=True)
class Failed:
    job_id: str
    outcome: Outcome
    run: int | None
    text: str  # its reason and its rank logs' tails


@dataclass(slots=True)
class Window:
    """A faulted job's failure held for its partners' (on `gpus`, the GPUs it shared)."""

    gpus: tuple[int, ...]
    partners: set[str]
    failed: list[Failed] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class FaultWatch:
    def __init__(self, ctx: WatchContext) -> None:
        self.ctx = ctx
        self.dead: dict[int, set[str]] = {}  # GPU whose MPS daemon died -> jobs whose exits are awaited
        self.windows: dict[str, Window] = {}  # first failed job -> its window
        self._tasks: set[asyncio.Task] = set()

    @property
    def on(self) -> bool:
        return self.ctx.mps.kind != "none"

    def start(self) -> Callable[[], None]:
        """Watch the MPS daemons (under MPS); returns what stops it."""
        if self.on:
            self._spawn(self._watch())
        return self.close

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for w in self.windows.values():
            if w.timer is not None:
                w.timer.cancel()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---------------------------------------------------------------- exits (LocalRuns.on_exit asks first)

    def claim(self, job_id: str, outcome: Outcome, run: int | None) -> bool:
        """Whether this exit belongs to a fault domain that went down (then this watch posts what it means)."""
        if not self.on:
            return False
        state = self.ctx.engine.state
        job = state.jobs.get(job_id)
        if job is None or not job.state.holds_gpus:
            return False
        for gpu, waiting in self.dead.items():
            if job_id in waiting:
                waiting.discard(job_id)
                if not waiting:
                    self._spawn(self._revive_then_post(gpu))
                return outcome.status != "completed"  # a job that finished right then finished
        if outcome.status not in ("failed", "terminated", "lost"):
            return False
        for first, w in self.windows.items():
            if job_id in w.partners:
                w.failed.append(Failed(job_id, outcome, run, self._text(job_id, outcome)))
                self._decide(first)
                return True
        if outcome.status != "failed":
            return False
        text = self._text(job_id, outcome)
        shared = tuple(g for g in job.gpus if len(state.gpus[g].jobs) > 1 and state.gpus[g].node == self.ctx.node)
        if not shared or not marks(text, FAULT_MARKS + GONE_MARKS):
            return False
        partners = {j for g in shared for j in state.gpus[g].jobs if j != job_id}
        w = self.windows[job_id] = Window(shared, partners, [Failed(job_id, outcome, run, text)])
        w.timer = asyncio.get_running_loop().call_later(WINDOW_S, self._decide, job_id, True)
        LOG.info("job %s failed with a GPU fault on shared GPU(s) %s: waiting %.0f s for its partner(s) %s", job_id,
                 ",".join(map(str, shared)), WINDOW_S, ",".join(sorted(partners)))
        return True

    def _text(self, job_id: str, outcome: Outcome) -> str:
        out = [outcome.reason]
        rec = self.ctx.records.get(job_id)
        if rec is not None:
            for log in sorted((Path(rec.job_dir) / "logs").glob("rank*.log")):
                with contextlib.suppress(OSError), open(log, "rb") as fh:
                    fh.seek(max(0, log.stat().st_size - TAIL_BYTES))
                    out.append(fh.read().decode(errors="replace"))
        return "\n".join(out)

    def _decide(self, first: str, over: bool = False) -> None:
        """The window of `first`'s failure closes: when its partners failed or (`over`) its time is up."""
        w = self.windows.get(first)
        if w is None:
            return
        if not over and len(w.failed) < 2:
            return
        del self.windows[first]
        if w.timer is not None:
            w.timer.cancel()
        loop, state = self.ctx.loop, self.ctx.engine.state
        if len(w.failed) == 1:  # the partner lives on: an ordinary failure
            f = w.failed[0]
            loop.input(self.ctx.outcome_event(f.job_id, f.outcome, False), f.run)
            return
        partner = w.failed[1].job_id
        gpu = next((g for g in w.gpus if partner in state.gpus[g].jobs), w.gpus[0])
        culprit = next((f for f in w.failed if marks(f.text, FAULT_MARKS)), None)
        requeued = ",".join(f.job_id for f in w.failed if culprit is None or f.job_id != culprit.job_id)
        LOG.warning("GPU %d faulted (culprit: %s): %s requeued uncharged", gpu,
                    culprit.job_id if culprit else "none, the MPS server went away", requeued)
        if culprit is None:  # its daemon may be gone too: started again (if so) before the GPU is given out
            self._spawn(self._revive_then_post(gpu))
        else:
            loop.input(ev.GpuFault(loop.sid("gpu-fault"), gpu, culprit.job_id, culprit.outcome.reason))
        for f in w.failed:  # a failed job not on that GPU fails as it did
            job = state.jobs.get(f.job_id)
            if job is not None and job.state.holds_gpus and gpu not in job.gpus:
                loop.input(self.ctx.outcome_event(f.job_id, f.outcome, False), f.run)

    # ---------------------------------------------------------------- the MPS daemons

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            for gpu in self._busy():
                try:
                    alive = await self.ctx.mps.alive(self.ctx.engine.state.gpus[gpu].local_index)
                except (RuntimeError, OSError):
                    alive = True  # not known: asked again next time
                if not alive and gpu not in self.dead:
                    self._server_died(gpu)

    def _busy(self) -> list[int]:
        """This node's GPUs that hold a job running here, whose daemon is not known dead."""
        c = self.ctx
        return [g.index for g in c.engine.state.gpus if g.node == c.node and g.index not in self.dead
                and any(c.launcher.running(j) for j in g.jobs)]

    def _server_died(self, gpu: int) -> None:
        c = self.ctx
        jobs = {j for j in c.engine.state.gpus[gpu].jobs if c.launcher.running(j)}
        LOG.warning("the MPS server of GPU %d died: stopping what is left of job(s) %s, then starting it again",
                    gpu, ",".join(sorted(jobs)) or "-")
        self.dead[gpu] = jobs
        for job_id in jobs:
            c.launcher.stop(job_id, c.kill_grace)  # its CUDA context is gone: it cannot go on
        if not jobs:
            self._spawn(self._revive_then_post(gpu))

    async def _revive_then_post(self, gpu: int) -> None:
        c = self.ctx
        try:
            await c.mps.revive(c.engine.state.gpus[gpu].local_index)
        except (RuntimeError, OSError) as exc:
            LOG.error("could not start the MPS server of GPU %d again: %s", gpu, exc)
        self.dead.pop(gpu, None)
        c.loop.input(ev.GpuFault(c.loop.sid("mps-died"), gpu, None, f"MPS server of GPU {gpu} died"))
