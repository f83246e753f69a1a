"""The training side of the job socket: a small blocking client for train.py (no asyncio needed).

    client = JobClient.from_env()          # None when not running under meshd
    if client: client.report(step, step_time)
"""

from __future__ import annotations

import os
import socket
from collections import deque

from meshsched.wire.protocol import REPLY_TYPES, FrameDecoder, ProtocolError, encode_frame


class JobClient:
    def __init__(self, path: str, timeout: float = 5.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._timeout = timeout
        self._sock.settimeout(timeout)
        self._sock.connect(path)
        self._decoder = FrameDecoder(REPLY_TYPES)
        self._inbox: deque[dict] = deque()  # frames read but not yet taken
        self._nudged = False  # meshd nudged (it holds directives for this connection's next reply)
        self._seq = 0

    def fileno(self) -> int:
        return self._sock.fileno()

    @classmethod
    def from_env(cls) -> JobClient | None:
        path = os.environ.get("MESH_SOCKET")
        if not path or not os.path.exists(path):
            return None
        try:
            return cls(path)
        except OSError:
            return None

    def request(self, message: dict) -> dict:
        self._seq += 1
        self._sock.sendall(encode_frame({**message, "seq": self._seq}))
        while True:
            while self._inbox:
                reply = self._inbox.popleft()
                if reply.get("type") == "error":
                    raise ProtocolError(reply.get("error", "refused"))
                if reply.get("nudge"):  # not the reply: meshd asks for a request (this one will do)
                    self._nudged = True
                    continue
                return reply
            self._read()

    def _read(self) -> None:
        data = self._sock.recv(65536)
        if not data:
            raise ConnectionError("meshd closed the job socket")
        self._inbox.extend(self._decoder.feed(data))

    def take_nudge(self) -> bool:
        """Read what meshd sent unasked, without waiting; True when it nudged since the last call (it holds
        directives: send a request now)."""
        self._sock.setblocking(False)
        try:
            while True:
                self._read()
        except BlockingIOError:
            pass
        finally:
            self._sock.settimeout(self._timeout)
        nudged = self._nudged or any(m.get("nudge") for m in self._inbox)
        self._inbox = deque(m for m in self._inbox if not m.get("nudge"))
        self._nudged = False
        return nudged

    def hello(self) -> dict:
        return self.request({"type": "hello"})

    def report(self, iterations: float, step_time: float) -> dict:
        return self.request({"type": "report", "iterations": float(iterations), "step_time": float(step_time)})

    def checkpoint(self, iterations: float) -> dict:
        return self.request({"type": "checkpoint", "iterations": float(iterations)})

    def close(self) -> None:
        self._sock.close()

