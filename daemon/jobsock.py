"""The job socket: training processes talk to meshd in length-prefixed msgpack frames (meshsched.wire.protocol).

The peer is identified by SO_PEERCRED when the connection is accepted, before a byte is read: its pid must
belong to a running job's session, else it gets one error frame and is closed. A message naming another job
is refused. A bad or oversized frame closes only that connection; a report with impossible figures
(protocol.check_report) gets an error reply and changes nothing. A frame must arrive whole within
FRAME_TIMEOUT once begun, a connection idle for IDLE_TIMEOUT is closed (meshsched.job reconnects), and a
job holds at most MAX_PER_JOB connections (MAX_CONNECTIONS in all).
Directives ride on replies. So that one need not wait for the job's next report (every
MESH_REPORT_INTERVAL, 1 s by default), meshd nudges the connection of the job's rank 0 when its hello said
that it reads nudges ("nudge": 1, as meshsched.job does): an unsolicited frame {"type": "ok", "seq": None,
"nudge": True}, upon which the client sends at once and gets the directives with the reply. A nudge
carries nothing, so a lost one loses nothing.
A job's supervisor says how the job ended in a `result` frame (as well as in result.json, which a full disk may
refuse); it is taken from the session's leader only. Its `ok` says whether the end is durable (`keep_result`):
meshd writes the result.json the supervisor could not (root's quota and reserved blocks are not the user's);
while the disk refuses that too, `durable: false`, and the supervisor offers it again and stays, so that a meshd
SIGKILLed meanwhile adopts it on restart and is told again, never running the job a second time.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import stat
import struct
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path

from meshsched.wire.protocol import (
    HEADER,
    ProtocolError,
    ReportRefused,
    decode_body,
    encode_frame,
    frame_length,
)

PEERCRED = struct.Struct("3i")  # pid, uid, gid
FRAME_TIMEOUT = 10.0  # seconds for the rest of a frame once its first byte arrived
IDLE_TIMEOUT = 600.0  # seconds without a frame before the connection is closed
MAX_PER_JOB = 256  # connections one job may hold open (ranks, their reporter threads, tools)
MAX_CONNECTIONS = 1024


def peer_pid(writer: asyncio.StreamWriter) -> int:
    sock = writer.get_extra_info("socket")
    pid, _, _ = PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
    return pid


async def start_job_socket(daemon) -> Callable[[], Awaitable[None]]:
    """Serve the job socket of `daemon` (a NodeDaemon); returns the coroutine function that closes it."""
    path = daemon.config.job_socket
    path.unlink(missing_ok=True)
    conns: dict[asyncio.StreamWriter, str] = {}  # open connection -> its job
    rank0: dict[str, asyncio.StreamWriter] = {}  # job -> the connection of its rank 0 (the latest hello)

    def nudge(job_id: str) -> None:
        writer = rank0.get(job_id)
        if writer is not None and not writer.is_closing():
            writer.write(encode_frame({"type": "ok", "job_id": job_id, "seq": None, "nudge": True}))

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            pid = peer_pid(writer)
            job_id = daemon.job_of_pid(pid)
            if job_id is None:
                refusal = f"process {pid} belongs to no running job"
            elif len(conns) >= MAX_CONNECTIONS or sum(1 for j in conns.values() if j == job_id) >= MAX_PER_JOB:
                refusal = f"too many open connections for job {job_id}; close some"
            else:
                refusal = ""
            if refusal:
                await asyncio.wait_for(_reply(writer, {"type": "error", "error": refusal}), FRAME_TIMEOUT)
                return
            conns[writer] = job_id
            await _session(daemon, reader, writer, pid, rank0)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, OSError):
            pass
        finally:
            job_id = conns.pop(writer, None)
            if job_id is not None and rank0.get(job_id) is writer:
                del rank0[job_id]
            writer.close()

    server = await asyncio.start_unix_server(serve, path=str(path))
    os.chmod(path, 0o666)  # any local process may connect; SO_PEERCRED decides what it may say
    daemon.channel.nudge = nudge

    async def close() -> None:
        daemon.channel.nudge = lambda job_id: None
        server.close()
        for w in list(conns):
            w.close()
        await server.wait_closed()
        path.unlink(missing_ok=True)

    return close


async def _session(daemon, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pid: int,
                   rank0: dict[str, asyncio.StreamWriter]) -> None:
    rank: int | None = None  # said in `hello` by meshsched.job; directives go to rank 0's connection
    while True:
        durable: bool | None = None  # a result frame's: the end is durable (result.json exists)
        first = await asyncio.wait_for(reader.readexactly(1), IDLE_TIMEOUT)
        try:
            header = first + await asyncio.wait_for(reader.readexactly(HEADER.size - 1), FRAME_TIMEOUT)
            body = await asyncio.wait_for(reader.readexactly(frame_length(header)), FRAME_TIMEOUT)
            msg = decode_body(body)
        except ProtocolError as exc:
            await asyncio.wait_for(_reply(writer, {"type": "error", "error": str(exc)}), FRAME_TIMEOUT)
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
            if rank == 0 and msg.get("nudge"):  # a client that reads nudges (meshsched.job's reporter) said so
                rank0[job_id] = writer
            daemon.job_hello(job_id, bool(msg.get("sdk")), msg.get("steps"))
        elif kind == "report":
            extra = {k: float(msg[k]) for k in ("samples", "forward_time", "window", "age") if k in msg}
            try:
                daemon.job_report(job_id, float(msg["iterations"]), float(msg["step_time"]),
                                  rank=int(msg["rank"]) if "rank" in msg else None, **extra)
            except ReportRefused as exc:  # impossible figures: said to the rank, nothing recorded, connection kept
                await asyncio.wait_for(_reply(writer, {"type": "error", "error": str(exc), "job_id": job_id}),
                                       FRAME_TIMEOUT)
                continue
        elif kind == "checkpoint":
            daemon.job_checkpoint(job_id, float(msg["iterations"]))
        elif kind == "result":  # how the job ended, from its supervisor (the leader of the job's session) only
            if os.getsid(pid) != pid:
                await _reply(writer, {"type": "error", "error": "only the job's supervisor says how it ended"})
                return
            daemon.launcher.told(job_id, msg["status"], msg.get("reason") or "", msg.get("exit_code"))
            rec = daemon.records.get(job_id)
            durable = rec is not None and keep_result(Path(rec.job_dir), msg)
        seq = msg.get("seq")  # echoed only when it is a small int or string
        seq = seq if isinstance(seq, (int, str)) and not isinstance(seq, bool) and len(str(seq)) < 64 else None
        reply = {"type": "ok", "job_id": job_id, "seq": seq}
        if durable is not None:
            reply["durable"] = durable
        if rank == 0 and daemon.directives.get(job_id):
            reply["directives"] = daemon.take_directives(job_id)
        await asyncio.wait_for(_reply(writer, reply), FRAME_TIMEOUT)


async def _reply(writer: asyncio.StreamWriter, message: dict) -> None:
    writer.write(encode_frame(message))
    await writer.drain()


def keep_result(job_dir: Path, msg: dict) -> bool:
    """Make the end a supervisor told (`msg`, a result frame) durable: True once the job's result.json exists (the
    supervisor's, or the one written here for it: meshd's writes may use what the job's user may not), False while
    the disk refuses it too. Written by a name of meshd's own and a rename, never following a link, and given to
    the job directory's owner, as the supervisor's own would be."""
    path = job_dir / "result.json"
    with suppress(OSError):
        if stat.S_ISREG(os.lstat(path).st_mode):
            return True
    result = {"status": msg["status"], "rank": msg.get("rank"), "exit_code": msg.get("exit_code"),
              "reason": msg.get("reason") or ""}
    if isinstance(msg.get("restart"), int):
        result["restart"] = msg["restart"]
    data, tmp = json.dumps(result).encode(), job_dir / "result.json.meshd"
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            with suppress(OSError):
                owner = os.stat(job_dir)
                os.fchown(fd, owner.st_uid, owner.st_gid)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False
    return True
