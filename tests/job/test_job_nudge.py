"""Directives without waiting for the next report: meshd nudges rank 0's connection, meshsched.job sends at
once and gets the directive with the reply (daemon/jobsock.py, meshsched/job/reporter.py)."""

from __future__ import annotations

import socket
import sys
import threading
from pathlib import Path

from meshsched.daemon.node import NodeDaemon

from meshsched.job.client import JobClient
from meshsched.job.reporter import Reporter
from meshsched.wire.protocol import (
    MESSAGE_TYPES,
    FrameDecoder,
    SubmitRequest,
    encode_frame,
)
from tests.support.daemon import (
    JOB,
    kill_sessions,
    make_config,
    py,
    short_dir,
    wait_for,
)

NUDGE = {"type": "ok", "seq": None, "nudge": True}


class FakeMeshd:
    """A job socket served by a thread: hands each request to `answer`, which returns the frames to send."""

    def __init__(self, answer) -> None:
        self.dir = short_dir()
        self.path = str(Path(self.dir) / "job.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen()
        self.answer = answer
        self.requests: list[dict] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        decoder = FrameDecoder(MESSAGE_TYPES)
        with conn:
            while data := conn.recv(65536):
                for msg in decoder.feed(data):
                    self.requests.append(msg)
                    conn.sendall(b"".join(encode_frame(f) for f in self.answer(msg)))  # one write: one read

    def close(self) -> None:
        self.server.close()
        Path(self.path).unlink(missing_ok=True)
        Path(self.dir).rmdir()


def test_a_nudge_before_the_reply_is_kept_for_later_not_taken_as_the_reply():
    fake = FakeMeshd(lambda msg: [NUDGE, {"type": "ok", "seq": msg["seq"], "n": len(msg)}])
    try:
        client = JobClient(fake.path)
        reply = client.request({"type": "ping"})
        assert reply.get("nudge") is None and reply["seq"] == 1
        assert client.take_nudge() and not client.take_nudge()
        client.close()
    finally:
        fake.close()


def test_the_reporter_sends_at_once_when_nudged_not_at_its_interval():
    got = threading.Event()
    directives: list[dict] = []

    def answer(msg):
        if msg["type"] == "hello":
            assert msg["nudge"] == 1 and msg["rank"] == 0
            return [{"type": "ok", "seq": msg["seq"]}, NUDGE]  # queued just after the hello: read with its reply
        return [{"type": "ok", "seq": msg["seq"], "directives": [{"kind": "checkpoint_exit"}]}]

    fake = FakeMeshd(answer)
    reporter = Reporter(fake.path, 0, 600.0, lambda d: (directives.append(d), got.set()))  # 10 minutes
    try:
        assert got.wait(20.0), "the directive waited for the 600 s interval"
        assert directives == [{"kind": "checkpoint_exit"}] and [m["type"] for m in fake.requests] == ["hello", "ping"]
    finally:
        reporter.close()
        fake.close()


async def test_a_preemption_reaches_a_job_whose_report_interval_is_long(dirs, tmp_path):
    d = NodeDaemon(make_config(*dirs, gpus=1, policy="srtf", preempt_grace=60.0))
    await d.start()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    try:
        long = d.submit(SubmitRequest(command=[sys.executable, str(script)], cwd="/tmp", gpus=1, iterations=1000,
                                      env={"MESH_REPORT_INTERVAL": "600"}), "tester")
        await wait_for(lambda: long.job_id in d.sdk_jobs and long.state == "RUNNING", what="hello")
        short = d.submit(SubmitRequest(command=py("pass"), cwd="/tmp", gpus=1, iterations=1,
                                       env={"MESH_REPORT_INTERVAL": "600"}), "tester")
        assert long.state == "PAUSING"
        await wait_for(lambda: short.state == "COMPLETED", what="short job done (the long one checkpointed)")
        log = (d.config.jobs_dir / long.job_id / "logs" / "rank0.log").read_text()
        assert "checkpoint-and-exit requested by meshd" in log  # the directive, within 15 s of a 600 s interval
    finally:
        pids = [r.supervisor_pid for r in d.records.values()]
        await d.close()
        kill_sessions(pids)


def test_a_report_says_how_long_ago_its_first_step_began():
    # meshd keeps a report's step time only if no partner came or went on the job's GPUs since its first step
    # began (engine `_on_report`): the frame says how long ago that was.
    import time

    from meshsched.job.reporter import StepRecord

    fake = FakeMeshd(lambda msg: [{"type": "ok", "seq": msg["seq"]}])
    reporter = Reporter(fake.path, 0, 600.0, lambda d: None)
    try:
        wait = time.monotonic() + 20
        while not reporter.connected and time.monotonic() < wait:  # the hello answered: flush() is then the
            time.sleep(0.01)  # only sender (before, a flush right after the hello arrived raced the thread's connect)
        assert reporter.connected
        t = time.perf_counter()
        reporter.record(StepRecord(1, 8, 0.0, 0.3, t - 0.2))  # began 0.5 s ago
        reporter.record(StepRecord(2, 8, 0.0, 0.2, t))
        reporter.flush()
        report = fake.requests[-1]
        assert report["type"] == "report" and report["window"] == 0.5
        assert 0.5 <= report["age"] < 5.0
    finally:
        reporter.close()
        fake.close()
