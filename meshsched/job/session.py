"""The training session: checkpoint/resume, cooperative exit agreed across ranks, reports, calibration.

    sess = meshsched.job.attach(sampler=sampler, checkpoint_every=10, total_steps=total)
    sess.track(model=model, optimizer=opt)      # plus the sampler and RNG, tracked by attach
    sess.resume()                               # loads the latest checkpoint, if any
    while sess.step < total:
        for mb in sess.micro_batches():         # this rank's share of the global batch, cut for accumulation
            with (nullcontext() if mb.sync else ddp.no_sync()), sess.forward_timer():
                loss = loss_fn(ddp(x[mb.indices]), y[mb.indices])
            (loss * mb.weight).backward()
        opt.step(); opt.zero_grad()
        if sess.end_step():                     # every rank gets the same answer at the same step
            sess.exit()                         # checkpoint saved; exit code 75 = preempted, resumable

Ranks vote at agreed steps: a vote is an asynchronous all-reduce of three integers -- "some rank wants to
stop" (SIGTERM, or rank 0 got a checkpoint-and-exit directive from meshd), "rank 0 holds directives", and
rank 0's choice of the number of steps to the next vote (about `vote_interval` seconds of its measured step
time; 0 = every step). The next vote step collects the result (long finished by then, so no rank waits for
a sleeping peer) and acts on it. Every rank therefore acts at the same step, at most two vote intervals
after the request; a directive's payload is broadcast from rank 0 and applied before the next step, so
local batches and accumulation steps change only at step boundaries and never change the global batch. Outside meshd (no MESH_JOB_ID) there is no reporter and no directive; with
no MESH_CHECKPOINT_DIR there are no checkpoints and SIGTERM keeps its default action.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from meshsched.job.accumulate import MicroBatch, micro_batches
from meshsched.job.checkpoint import Checkpointer, RngState, State, TorchState
from meshsched.job.env import MeshEnv
from meshsched.job.reporter import Reporter, StepRecord
from meshsched.job.sampler import ElasticSampler
from meshsched.wire.exitcodes import PREEMPTED_EXIT_CODE

LOG = logging.getLogger("meshsched.job")


class _Meta(State):
    """The session's own counters: step and accumulation steps (JSON, so torch is not needed for them)."""

    def __init__(self, session: Session) -> None:
        super().__init__("session")
        self.session = session

    def state_dict(self) -> dict:
        return {"step": self.session.step, "accum_steps": self.session.accum_steps}

    def load_state_dict(self, state: dict) -> None:
        self.session.step = int(state["step"])
        if self.session.env.accum_steps is None and self.session.plan is None:  # meshd's choice for this run wins
            self.session.accum_steps = int(state["accum_steps"])

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.state_dict()))

    def load(self, path: Path) -> None:
        self.load_state_dict(json.loads(path.read_text()))


class Session:
    def __init__(self, env: MeshEnv, sampler: ElasticSampler | None = None, checkpoint_every: int = 0,
                 accum_steps: int | None = None, vote_interval: float = 0.25, handle_sigterm: bool | None = None,
                 rng: bool = True, total_steps: int | None = None) -> None:
        if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)
                                        or total_steps < 1):
            raise ValueError(f"total_steps must be an integer >= 1, got {total_steps!r}")
        self.env = env
        self.total_steps = total_steps
        self.rank, self.world_size = env.rank, env.world_size
        self.sampler = sampler
        self.step = 0
        # None: the accumulation meshd chose for this run (the plan's gaN, else MESH_ACCUM_STEPS), else 1
        self.plan = env.execution_plan()
        if accum_steps is None:
            accum_steps = self.plan.ga if self.plan is not None else env.accum_steps
        self.accum_steps = max(1, accum_steps or 1)
        self.checkpoint_every = checkpoint_every
        self.vote_interval = max(0.0, vote_interval)
        self._next_vote = 1  # the step whose end_step holds the next vote (the same on every rank)
        self._step_time = 0.0  # moving average of this rank's iteration time (rank 0's sets the vote cadence)
        self.exit_requested = False  # set by SIGTERM or a directive; acted on at an agreed step
        self.stopped = False  # the agreed decision
        self.exit_reason = ""
        self.checkpointer = Checkpointer(env.checkpoint_dir, env.keep) if env.checkpoint_dir else None
        self.states: list[State] = [_Meta(self)] + ([RngState()] if rng else [])
        if sampler is not None:
            self.states.append(TorchState("sampler", sampler))
        self._pending: list[dict] = []  # directives received by the reporter thread (rank 0)
        self._inflight: tuple | None = None  # (work, flags tensor, directives sent with it) of the last step
        self._lock = threading.Lock()
        self._forward = 0.0
        self._last = time.perf_counter()
        self.reporter = None
        if env.under_meshd and env.socket:
            self.reporter = Reporter(env.socket, self.rank, env.report_interval, self._on_directive, total_steps)
        if handle_sigterm is None:
            handle_sigterm = self.checkpointer is not None or env.under_meshd
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    # ------------------------------------------------------------ state

    def track(self, **objects) -> None:
        """Checkpoint these objects (anything with state_dict/load_state_dict) under the given names."""
        for name, obj in objects.items():
            self.add(TorchState(name, obj))

    def add(self, state: State) -> None:
        if any(s.name == state.name for s in self.states):
            raise ValueError(f"a state named {state.name!r} is already tracked")
        self.states.append(state)

    def resume(self) -> int:
        """Load the latest complete checkpoint into every tracked State (on every rank); returns the step."""
        if self.checkpointer is None:
            return self.step
        latest = self.checkpointer.latest()
        if latest is not None:
            self.checkpointer.load(latest, self.states)
            LOG.info("resumed from %s", latest.path)
        self._last = time.perf_counter()
        return self.step

    def save(self) -> Path | None:
        """Rank 0 writes a checkpoint of the current step (the caller has made the ranks agree)."""
        if self.checkpointer is None or self.rank != 0:
            return None
        ckpt = self.checkpointer.save(self.step, self.states, {"world_size": self.world_size})
        if self.reporter is not None:
            self.reporter.checkpointed(self.step)
        return ckpt.path

    # ------------------------------------------------------------ the step

    def micro_batches(self) -> list[MicroBatch]:
        """This rank's micro-batches for the current step (needs a sampler)."""
        if self.sampler is None:
            raise RuntimeError("attach(sampler=...) is needed for micro_batches()")
        idx = self.sampler.indices(self.rank)
        return micro_batches(idx, self.accum_steps, self.world_size, self.sampler.global_batch)

    @contextmanager
    def forward_timer(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._forward += time.perf_counter() - t0

    def end_step(self, samples: int | None = None) -> bool:
        """Close the step: advance, report, agree on exit and directives, checkpoint. True: stop now."""
        self.step += 1
        if self.sampler is not None:
            if samples is None:
                samples = self.sampler.local_batches[self.rank]
            self.sampler.advance()
        now = time.perf_counter()
        if self.reporter is not None:
            self.reporter.record(StepRecord(self.step, samples or 0, self._forward, now - self._last, now))
        dt = now - self._last
        self._step_time = dt if not self._step_time else 0.9 * self._step_time + 0.1 * dt
        self._forward, self._last = 0.0, now
        if self.step >= self._next_vote:
            self._agree()
        if self.stopped:
            self.save()
            return True
        if self.checkpoint_every and self.step % self.checkpoint_every == 0:
            self.save()
        return False

    def _distributed(self) -> bool:
        if self.world_size <= 1:
            return False
        return _process_group() is not None

    def _agree(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        if not self._distributed():
            want_exit = self.exit_requested
            self._next_vote = self.step + 1
        else:  # settle the previous step's vote, then start this step's
            import torch
            import torch.distributed as dist

            want_exit, pending_now = False, pending
            pending = []
            every = 1
            if self._inflight is not None:
                work, flags, sent = self._inflight
                work.wait()
                want_exit, has_directives = bool(flags[0].item()), int(flags[1].item()) > 0
                every = max(1, int(flags[2].item()))
                if has_directives:
                    box = [sent]
                    dist.broadcast_object_list(box, src=0)
                    pending = box[0]
            if not want_exit:
                device = "cuda" if dist.get_backend() == "nccl" else "cpu"
                cadence = 0
                if self.rank == 0 and self.vote_interval > 0 and self._step_time > 0:
                    cadence = min(1000, max(1, int(self.vote_interval / self._step_time)))
                flags = torch.tensor([int(self.exit_requested), len(pending_now) if self.rank == 0 else 0, cadence],
                                     dtype=torch.int64, device=device)
                self._inflight = (dist.all_reduce(flags, async_op=True), flags, pending_now)
            else:
                self._inflight = None
            self._next_vote = self.step + every
        for directive in pending:
            want_exit = self._apply(directive) or want_exit
        if want_exit:
            self.stopped = True
            self.exit_reason = self.exit_reason or ("SIGTERM" if self.exit_requested else "another rank's SIGTERM")

    def _apply(self, directive: dict) -> bool:
        """Apply one directive at this step boundary; True when it asks the job to stop."""
        kind = directive.get("kind")
        if kind == "checkpoint_exit":
            self.exit_reason = "checkpoint-and-exit requested by meshd"
            return True
        if kind == "calibrate":
            try:
                if "local_batches" in directive and self.sampler is not None:
                    self.sampler.set_local_batches(list(directive["local_batches"]))
                if "accum_steps" in directive:
                    steps = int(directive["accum_steps"])
                    if steps < 1:
                        raise ValueError("accum_steps must be >= 1")
                    self.accum_steps = steps
            except (ValueError, TypeError) as exc:
                LOG.warning("ignored calibration %s: %s", directive, exc)
            return False
        LOG.warning("ignored unknown directive %r", kind)
        return False

    # ------------------------------------------------------------ inputs from outside

    def _on_sigterm(self, signum, frame) -> None:
        self.exit_requested = True

    def _on_directive(self, directive: dict) -> None:
        if directive.get("kind") == "checkpoint_exit":
            self.exit_requested = True  # also covers world_size 1
        with self._lock:
            self._pending.append(directive)

    def request(self, directive: dict) -> None:
        """Queue a directive as if meshd had sent it (rank 0 only; for tests and local tools)."""
        self._on_directive(directive)

    # ------------------------------------------------------------ the end

    def close(self) -> None:
        """Settle the last vote (every rank issued it) and flush the last reports and checkpoint notice."""
        if self._inflight is not None:
            self._inflight[0].wait()
            self._inflight = None
        if self.reporter is not None:
            self.reporter.close()
            self.reporter = None

    def exit(self) -> None:
        """Leave with the code meshd reads as 'preempted, resumable' (after `end_step` returned True)."""
        self.close()
        dist = _process_group()
        if dist is not None:
            dist.destroy_process_group()
            # torch's teardown after a gloo group aborted a rank now and then (exit 134 instead of 75: meshd would
            # fail a preempted job; see examples/train.py); the checkpoint is written, so skip it
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(PREEMPTED_EXIT_CODE)
        sys.exit(PREEMPTED_EXIT_CODE)


def _process_group():
    """torch.distributed when the script initialised a process group, else None. Never imports torch: a script
    that did not import it has no group (and importing it takes seconds: a torch-less job's exit would wait)."""
    dist = sys.modules.get("torch.distributed")
    return dist if dist is not None and dist.is_available() and dist.is_initialized() else None


def attach(*, sampler: ElasticSampler | None = None, checkpoint_every: int = 0, accum_steps: int | None = None,
           vote_interval: float = 0.25, handle_sigterm: bool | None = None, rng: bool = True,
           total_steps: int | None = None) -> Session:
    """The session for this process, configured from the environment (a no-op shell outside meshd).

    accum_steps=None trains with the accumulation meshd chose (MESH_ACCUM_STEPS; the global batch is unchanged),
    else 1. rng=False leaves the random generators out of checkpoints (then a script without torch needs none).
    total_steps: the steps the script runs in total; meshd then uses it as the job's length (its estimate,
    `mesh top`'s STEP x/N) unless `mesh submit --iters` gave one."""
    return Session(MeshEnv.read(), sampler, checkpoint_every, accum_steps, vote_interval, handle_sigterm, rng,
                   total_steps)
