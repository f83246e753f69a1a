"""The job socket: training processes talk to meshd in length-prefixed msgpack frames (meshsched.protocol).

The peer is identified by SO_PEERCRED: its pid must belong to a running job's worker session, and a
message naming another job is refused. A bad or oversized frame closes only that connection.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Awaitable, Callable

from meshsched.protocol import HEADER, ProtocolError, decode_body, encode_frame, frame_length

PEERCRED = struct.Struct("3i")  # pid, uid, gid


def peer_pid(writer: asyncio.StreamWriter) -> int:
    sock = writer.get_extra_info("socket")
    pid, _, _ = PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
    return pid


async def start_job_socket(daemon) -> Callable[[], Awaitable[None]]:
    """Serve the job socket of `daemon` (a NodeDaemon); returns the coroutine function that closes it."""
    path = daemon.config.job_socket
    path.unlink(missing_ok=True)
    conns: set[asyncio.StreamWriter] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.add(writer)
        try:
            await _session(daemon, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            conns.discard(writer)
            writer.close()

    server = await asyncio.start_unix_server(serve, path=str(path))
    os.chmod(path, 0o666)  # any local process may connect; SO_PEERCRED decides what it may say

    async def close() -> None:
        server.close()
        for w in list(conns):
            w.close()
        await server.wait_closed()
        path.unlink(missing_ok=True)

    return close


async def _session(daemon, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    pid = peer_pid(writer)
    rank: int | None = None  # said in `hello` by meshsched.job; directives go to rank 0's connection
    while True:
        header = await reader.readexactly(HEADER.size)
        try:
            body = await reader.readexactly(frame_length(header))
            msg = decode_body(body)
        except ProtocolError as exc:
            await _reply(writer, {"type": "error", "error": str(exc)})
            return
        job_id = daemon.job_of_pid(pid)
        if job_id is None:
            await _reply(writer, {"type": "error", "error": f"process {pid} belongs to no running job"})
            return
        if msg.get("job_id", job_id) != job_id:
            await _reply(writer, {"type": "error", "error": f"process {pid} may speak only for job {job_id}"})
            return
        kind = msg["type"]
        if kind == "hello" and isinstance(msg.get("rank"), int):
            rank = msg["rank"]
            daemon.job_hello(job_id, bool(msg.get("sdk")), msg.get("steps"))
        elif kind == "report":
            extra = {k: float(msg[k]) for k in ("samples", "forward_time", "window") if k in msg}
            daemon.job_report(job_id, float(msg["iterations"]), float(msg["step_time"]),
                              rank=int(msg["rank"]) if "rank" in msg else None, **extra)
        elif kind == "checkpoint":
            daemon.job_checkpoint(job_id, float(msg["iterations"]))
        reply = {"type": "ok", "job_id": job_id, "seq": msg.get("seq")}
        if rank == 0 and daemon.directives.get(job_id):
            reply["directives"] = daemon.take_directives(job_id)
        await _reply(writer, reply)


async def _reply(writer: asyncio.StreamWriter, message: dict) -> None:
    writer.write(encode_frame(message))
    await writer.drain()
