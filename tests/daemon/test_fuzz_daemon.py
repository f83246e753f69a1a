"""Fuzzing meshd (hypothesis): generated frames on the job socket, generated requests to the HTTP API.

The daemon runs in a background thread with fake GPUs; one blocker job holds every GPU so that generated
submissions queue instead of spawning processes. Job-socket frames are sent as if from that job's process
(the peer check maps this test's pid to it), so they reach the decoder and the handlers, not just the
refusal at accept. After each batch: meshd is still up, answers a well-formed client, and never said 5xx.

CI runs MESH_FUZZ_EXAMPLES (default 1,000) of each; `MESH_FUZZ_EXAMPLES=10000 pytest tests/test_fuzz_daemon.py`
runs the full 10,000 of each by hand.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from meshsched.daemon.node import NodeDaemon

from meshsched.wire.protocol import (
    HEADER,
    MESSAGE_TYPES,
    REPLY_TYPES,
    FrameDecoder,
    SubmitRequest,
    encode_frame,
)
from tests.support.daemon import daemon_in_thread, make_config, poll, py, remove, short_dir

pytestmark = pytest.mark.slow
EXAMPLES = int(os.environ.get("MESH_FUZZ_EXAMPLES", "1000"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


class Served:
    def __init__(self, d: NodeDaemon, loop: asyncio.AbstractEventLoop) -> None:
        self.d, self.loop = d, loop
        self.statuses: list[int] = []
        self.blocker = ""

    def call(self, fn, *args):
        """Run `fn(*args)` on the daemon's loop thread (the journal belongs to that thread)."""
        async def go():
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(go(), self.loop).result(10)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    runtime = short_dir()
    cfg = make_config(tmp_path_factory.mktemp("fuzz") / "state", runtime)
    with daemon_in_thread(cfg) as (d, loop):
        yield _serving(d, loop)
    remove(runtime)


def _serving(d, loop) -> Served:
    """The fuzzer's view of a meshd: a job holding every GPU (the frames speak for it)."""
    s = Served(d, loop)
    blocker = s.call(d.submit, SubmitRequest(command=py("import time; time.sleep(600)"), cwd="/tmp", gpus=4,
                                             iterations=1), "fuzzer")
    s.blocker = blocker.job_id
    poll(lambda: d.records[blocker.job_id].state == "RUNNING", what="blocker running")
    original = d.job_of_pid
    me = os.getpid()
    d.job_of_pid = lambda pid: blocker.job_id if pid == me else original(pid)  # frames speak for the blocker
    return s


# ------------------------------------------------------------------ the job socket

values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
jvalues = st.recursive(  # what a JSON body can hold (NaN and Infinity included: Python's json accepts them)
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=8,
)
keys = st.sampled_from(["v", "type", "job_id", "rank", "iterations", "step_time", "samples", "forward_time",
                        "window", "seq", "sdk"]) | st.text(max_size=8)
messages = st.dictionaries(keys, values, max_size=8).map(lambda m: {"v": 1, **m}) | st.builds(
    lambda kind, extra: {"v": 1, "type": kind, **extra},
    st.sampled_from(MESSAGE_TYPES), st.dictionaries(keys, values, max_size=6),
)


def _msgpack(m: dict) -> bytes:
    import msgpack

    return msgpack.packb(m, use_bin_type=True)


frames = st.one_of(
    messages.map(lambda m: HEADER.pack(len(_msgpack(m))) + _msgpack(m)),  # well framed, odd content
    st.binary(max_size=64).map(lambda b: HEADER.pack(len(b)) + b),  # well framed garbage
    st.binary(max_size=16),  # not even a header
    st.integers(min_value=65537, max_value=2**32 - 1).map(HEADER.pack),  # oversized announcement
)


class JobConn:
    def __init__(self, path: str) -> None:
        self.path = path
        self.sock: socket.socket | None = None

    def exchange(self, frame: bytes) -> list[dict]:
        """Send one frame; read until a reply frame arrives, the daemon closes, or it waits for more bytes."""
        if self.sock is None:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.settimeout(5)
            self.sock.connect(self.path)
        self.sock.sendall(frame)
        dec = FrameDecoder(REPLY_TYPES)
        declared = HEADER.unpack(frame[: HEADER.size])[0] if len(frame) >= HEADER.size else -1
        whole = declared > 65536 or 0 <= declared <= len(frame) - HEADER.size
        if not whole:  # a partial frame gets no answer (the daemon waits FRAME_TIMEOUT for the rest)
            self.close()
            return []
        self.sock.settimeout(5)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    self.close()
                    return []
                got = dec.feed(data)
                if got:
                    if got[0]["type"] == "error":  # the daemon closes the connection after an error
                        self.close()
                    return got
        except TimeoutError:
            self.close()
            raise AssertionError(f"no answer within 5 s to a whole frame {frame[:40]!r}") from None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _healthy(s: Served) -> None:
    conn = _Unix(str(s.d.config.api_socket))
    conn.request("GET", "/v1/health")
    assert json.loads(conn.getresponse().read())["status"] == "running"
    conn.close()
    c = JobConn(str(s.d.config.job_socket))
    reply = c.exchange(encode_frame({"type": "ping", "seq": 1}))
    c.close()
    assert reply and reply[0]["type"] == "ok" and reply[0]["job_id"] == s.blocker


def test_fuzz_job_socket(served):
    conn = JobConn(str(served.d.config.job_socket))
    sent: list[int] = []

    @FUZZ
    @given(frame=frames)
    def one(frame: bytes) -> None:
        sent.append(len(frame))
        for reply in conn.exchange(frame):
            assert reply["type"] in REPLY_TYPES

    try:
        one()
    finally:
        conn.close()
    assert len(sent) >= EXAMPLES  # every generated frame was sent
    _healthy(served)
    assert served.d.records[served.blocker].state in ("RUNNING", "PAUSING")


# ------------------------------------------------------------------ the HTTP API


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("meshd", timeout=10)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


job_ids = st.sampled_from(["1", "2", "999", "0", "-1", "abc", "..", "%00", "1e3", "\u2460", "x" * 300]) | st.text(
    max_size=12)
submit_bodies = st.fixed_dictionaries(
    {"command": st.sampled_from([["true"], ["/nonexistent/x"], []]) | st.lists(st.text(max_size=5), max_size=2)
        .map(lambda a: ["/nonexistent/" + "".join(a)])},
    optional={"cwd": st.sampled_from(["/tmp", "", "rel", "/\x00"]) | st.text(max_size=10),
              "gpus": st.integers(-3, 6) | jvalues, "batch_size": st.integers(-1, 10**12) | jvalues,
              "iterations": st.integers(-1, 10**12) | jvalues, "model": st.text(max_size=10) | jvalues,
              "name": st.text(max_size=150) | jvalues, "deadline": st.floats() | jvalues,
              "guaranteed": jvalues, "env": st.dictionaries(st.text(max_size=5), jvalues, max_size=3),
              "extra": jvalues},
)
bodies = st.one_of(st.none(), submit_bodies.map(lambda b: json.dumps(b, default=repr)),
                   jvalues.map(lambda v: json.dumps(v, default=repr)),
                   st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
queries = st.dictionaries(st.sampled_from(["rank", "offset", "all", "x"]),
                          st.sampled_from(["0", "1", "-1", "1e23", "nan", "99999999999999999999", ""])
                          | st.text(max_size=8), max_size=3)


@st.composite
def requests(draw):
    method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]))
    job = draw(job_ids)
    path = draw(st.sampled_from(["/v1/health", "/v1/jobs", "/v1/jobs/{}", "/v1/jobs/{}/cancel", "/v1/jobs/{}/logs",
                                 "/v1/jobs/{}/explain", "/v1/nodes", "/metrics", "/", "/v1/{}"]))
    path = path.format(urllib.parse.quote(job, safe=""))
    query = draw(queries)
    if query:
        path += "?" + urllib.parse.urlencode(query)
    return method, path, draw(bodies)


def test_fuzz_http_api(served):
    bad: list[tuple] = []
    sent: list[str] = []

    @FUZZ
    @given(req=requests())
    def one(req) -> None:
        method, path, body = req
        if path.startswith(f"/v1/jobs/{served.blocker}/cancel"):
            path = "/v1/jobs/999999/cancel"  # keep the blocker: it keeps generated jobs queued instead of running
        sent.append(method)
        conn = _Unix(str(served.d.config.api_socket))
        try:
            data = None if body is None else body.encode("utf-8", "surrogatepass")
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            if resp.status >= 500:
                bad.append((method, path, body, resp.status))
        finally:
            conn.close()
        assert resp.status < 500, (method, path, body, resp.status)

    one()
    assert not bad and len(sent) >= EXAMPLES
    _healthy(served)
    assert served.d.records[served.blocker].state == "RUNNING"
