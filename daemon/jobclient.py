"""The training side of the job socket: a small blocking client for train.py (no asyncio needed).

    client = JobClient.from_env()          # None when not running under meshd
    if client: client.report(step, step_time)
"""

from __future__ import annotations

import os
import socket

from meshsched.protocol import REPLY_TYPES, FrameDecoder, ProtocolError, encode_frame


class JobClient:
    def __init__(self, path: str, timeout: float = 5.0) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(path)
        self._decoder = FrameDecoder(REPLY_TYPES)
        self._seq = 0

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
            data = self._sock.recv(65536)
            if not data:
                raise ConnectionError("meshd closed the job socket")
            msgs = self._decoder.feed(data)
            if msgs:
                reply = msgs[0]
                if reply.get("type") == "error":
                    raise ProtocolError(reply.get("error", "refused"))
                return reply

    def hello(self) -> dict:
        return self.request({"type": "hello"})

    def report(self, iterations: float, step_time: float) -> dict:
        return self.request({"type": "report", "iterations": float(iterations), "step_time": float(step_time)})

    def checkpoint(self, iterations: float) -> dict:
        return self.request({"type": "checkpoint", "iterations": float(iterations)})

    def close(self) -> None:
        self._sock.close()

