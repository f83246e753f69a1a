"""Per-rank progress reports to meshd, batched and sent from a background thread.

The training loop only appends a `StepRecord` to a bounded deque (no I/O, no lock held for long). Every
`interval` seconds the thread folds the records gathered since the last flush into one `report` frame
(latest step, samples, mean forward and iteration times) and sends it on the job socket; meshd's reply may
carry directives (checkpoint-and-exit, calibration), handed to `on_directive`. The thread also polls when
no step finished, so a directive reaches a job whose steps are slow; and between flushes it listens on the
socket, so that when meshd nudges (it queued a directive) it sends at once instead of at the next interval.
If meshd is unreachable the reports are dropped (and the connection retried each interval): training never
waits for the scheduler.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

MAX_PENDING = 4096


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    samples: int
    forward_time: float
    iteration_time: float
    ended: float  # time.perf_counter() at the step's end


class Reporter:
    def __init__(self, socket_path: str, rank: int, interval: float,
                 on_directive: Callable[[dict], None], total_steps: int | None = None) -> None:
        self.rank = rank
        self.total_steps = total_steps  # said in hello: meshd's estimate of the job's length follows it
        self.interval = max(0.01, interval)
        self._path = socket_path
        self._on_directive = on_directive
        self._records: deque[StepRecord] = deque(maxlen=MAX_PENDING)
        self._stop = threading.Event()
        self._client = None
        self._checkpoint: int | None = None  # step of a checkpoint meshd has not been told about
        self._wake_r, self._wake_w = socket.socketpair()  # close() ends the thread's wait at once
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name=f"mesh-reporter-{rank}", daemon=True)
        self._thread.start()

    @property
    def connected(self) -> bool:
        """Whether the reporter's thread holds a connection to meshd (its hello was answered)."""
        return self._client is not None

    def record(self, rec: StepRecord) -> None:
        self._records.append(rec)  # deque.append is atomic: the only cost on the training path

    def checkpointed(self, step: int) -> None:
        self._checkpoint = step  # sent with the next flush

    def _connect(self):
        from meshsched.job.client import JobClient

        try:
            client = JobClient(self._path)
        except OSError:
            return None
        try:
            hello = {"type": "hello", "sdk": 1, "rank": self.rank, "nudge": 1}
            if self.total_steps:
                hello["steps"] = self.total_steps
            client.request(hello)
        except (OSError, ValueError):  # ValueError: meshd refused (ProtocolError), e.g. not one of its jobs
            client.close()
            return None
        return client

    def _run(self) -> None:
        self._client = self._connect()
        while not self._wait():
            self.flush()
        self.flush()

    def _wait(self) -> bool:
        """Until the interval has passed or meshd nudged (False), or close() was called (True)."""
        deadline = time.monotonic() + self.interval
        while not self._stop.is_set():
            client = self._client
            if client is not None:
                try:  # also a nudge that came in one read with the last reply: the socket shows nothing more
                    if client.take_nudge():
                        return False
                except (OSError, ValueError):  # meshd closed the connection (or sent garbage): reconnect
                    client.close()
                    self._client = client = None
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select([self._wake_r] + ([client] if client is not None else []), [], [], left)
        return True

    def flush(self) -> None:
        batch: list[StepRecord] = []
        while self._records:
            batch.append(self._records.popleft())
        if self._client is None:
            self._client = self._connect()  # meshd restarted (it re-adopts jobs): say hello again
            if self._client is None:
                return
        if batch:
            n = len(batch)
            msg = {"type": "report", "rank": self.rank, "iterations": float(batch[-1].step),
                   "step_time": sum(r.iteration_time for r in batch) / n,
                   "samples": float(sum(r.samples for r in batch)),
                   "forward_time": sum(r.forward_time for r in batch) / n,
                   "window": float(sum(r.iteration_time for r in batch)),
                   # seconds since the first of these steps began: meshd keeps the step time only if no partner
                   # came or went on the job's GPUs since then
                   "age": max(0.0, time.perf_counter() - (batch[0].ended - batch[0].iteration_time))}
        else:
            msg = {"type": "ping"}
        try:
            reply = self._client.request(msg)
        except (OSError, ValueError):
            self._client.close()
            self._client = None
            return
        self.sent += 1
        step, self._checkpoint = self._checkpoint, None
        if step is not None:
            try:
                self._client.request({"type": "checkpoint", "iterations": float(step)})
            except (OSError, ValueError):
                self._checkpoint = step
                self._client.close()
                self._client = None
                return
        for directive in reply.get("directives") or ():
            self._on_directive(directive)

    def close(self) -> None:
        self._stop.set()
        self._wake_w.send(b"x")
        self._thread.join(timeout=5.0)
        if self._client is not None:
            self._client.close()
        self._wake_r.close()
        self._wake_w.close()
