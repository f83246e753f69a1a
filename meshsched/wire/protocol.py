"""Wire formats: job-socket frames (length-prefixed msgpack) and the HTTP API's request bodies, with validation.

Pure code: no sockets here. A job-socket frame is a 4-byte big-endian length followed by a msgpack map
that carries the protocol version `v` and a message `type`. A frame longer than `MAX_FRAME` or that does
not decode to a valid message raises `ProtocolError`; the server then closes that one connection.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
MAX_FRAME = 64 * 1024  # bytes of msgpack body
HEADER = struct.Struct(">I")
MESSAGE_TYPES = ("hello", "report", "checkpoint", "ping", "result")  # job -> meshd ("result": its supervisor's)
RESULT_STATUSES = ("completed", "failed", "terminated", "preempted")  # how a supervisor says its job ended
MAX_REASON = 4096  # characters of a result's reason
REPLY_TYPES = ("ok", "error")  # meshd -> job; an "ok" may carry "directives" (list of maps with "kind")
# an "ok" to a "result" frame carries "durable": False while meshd holds the end but cannot make it durable yet
DEFAULT_ITERATIONS = 100  # a job's expected iterations when neither `mesh submit --iters` nor its script says
MAX_NAME = 128  # characters of a job name or model name (they are columns of `mesh ls`)
MAX_ENV_BYTES = 128 * 1024  # a job's exported environment, NAME=VALUE\0 counted (cli/jobs.py says it before sending)
MAX_EXPORT = 4096  # characters of `--export`'s mode as recorded (ALL, NONE, or the names it listed)


class ProtocolError(ValueError):
    """A frame or message the peer must not have sent; the connection is closed."""


def encode_frame(message: dict[str, Any]) -> bytes:
    """Frame `message` (adds the protocol version)."""
    body = msgpack.packb({"v": PROTOCOL_VERSION, **message}, use_bin_type=True)
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(body)} bytes exceeds the maximum of {MAX_FRAME}")
    return HEADER.pack(len(body)) + body


def frame_length(header: bytes) -> int:
    """The body length announced by a 4-byte header; ProtocolError when over MAX_FRAME."""
    (n,) = HEADER.unpack(header)
    if n > MAX_FRAME:
        raise ProtocolError(f"frame of {n} bytes exceeds the maximum of {MAX_FRAME}")
    return n


def decode_body(body: bytes, allowed: tuple[str, ...] = MESSAGE_TYPES) -> dict[str, Any]:
    """Decode and validate one frame body into a message dict whose type is in `allowed`."""
    try:
        msg = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"undecodable frame: {exc}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("a frame must hold a map")
    if msg.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {msg.get('v')!r} (speak {PROTOCOL_VERSION})")
    kind = msg.get("type")
    if kind not in allowed:
        raise ProtocolError(f"unknown message type {kind!r}")
    if kind in ("report", "checkpoint"):
        _number(msg, "iterations", minimum=0.0)
        if kind == "report":
            _number(msg, "step_time", minimum=0.0)
            for key in ("rank", "samples", "forward_time", "window", "age"):  # optional, sent by meshsched.job
                if key in msg:
                    _number(msg, key, minimum=0.0)
            if "rank" in msg and msg["rank"] != int(msg["rank"]):
                raise ProtocolError(f"report: rank must be an integer, got {msg['rank']!r}")
    if kind == "hello" and "steps" in msg:  # optional: the script's total steps (meshsched.job's attach)
        steps = msg["steps"]
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ProtocolError("hello: steps must be an integer >= 1")
    if kind == "result":
        _result(msg)
    if "job_id" in msg and not isinstance(msg["job_id"], str):
        raise ProtocolError("job_id must be a string")
    return msg


def _result(msg: dict[str, Any]) -> None:
    """A supervisor's result frame: {"status", "reason", "exit_code", "rank"}, as in its result.json."""
    if msg.get("status") not in RESULT_STATUSES:
        raise ProtocolError(f"result: status must be one of {', '.join(RESULT_STATUSES)}")
    if not isinstance(msg.get("reason", ""), str) or len(msg.get("reason", "")) > MAX_REASON:
        raise ProtocolError(f"result: reason must be a string of at most {MAX_REASON} characters")
    for key in ("exit_code", "rank", "restart"):  # restart (optional): the run that ended (LaunchSpec.restart)
        value = msg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or abs(value) > 1 << 31):
            raise ProtocolError(f"result: {key} must be an integer or nil")


class FrameDecoder:
    """Incremental decoder: feed bytes, get complete messages (for clients and tests)."""

    def __init__(self, allowed: tuple[str, ...] = MESSAGE_TYPES) -> None:
        self._buf = bytearray()
        self._allowed = allowed

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        out: list[dict[str, Any]] = []
        while len(self._buf) >= HEADER.size:
            n = frame_length(bytes(self._buf[: HEADER.size]))
            if len(self._buf) < HEADER.size + n:
                break
            body = bytes(self._buf[HEADER.size : HEADER.size + n])
            del self._buf[: HEADER.size + n]
            out.append(decode_body(body, self._allowed))
        return out


def _label(key: str, value: Any) -> str:
    """A name shown in listings: a string of at most MAX_NAME printable characters (no newline, no escape)."""
    if not isinstance(value, str):
        raise RequestError(f"{key} must be a string")
    if len(value) > MAX_NAME:
        raise RequestError(f"{key} is {len(value)} characters long; at most {MAX_NAME}")
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise RequestError(f"{key} must not contain control characters (found {bad!r})")
    return value


def _number(msg: dict[str, Any], key: str, minimum: float) -> float:
    value = msg.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProtocolError(f"{msg.get('type')}: {key} must be a finite number")
    if value < minimum:
        raise ProtocolError(f"{msg.get('type')}: {key} must be >= {minimum}")
    return float(value)


class ReportRefused(ProtocolError):
    """A well-formed report whose figures cannot be true: answered with an error reply, nothing recorded."""


REPORT_SLACK_S = 1.0  # seconds of delivery jitter allowed between two reports of one rank


@dataclass(frozen=True, slots=True)
class ReportContext:
    """What meshd knows of the reporting rank when its report arrives: the job's world size and, when this
    rank already reported in this run, that report's step count and the seconds since it arrived."""

    world_size: int
    last_iterations: float | None = None
    elapsed_s: float | None = None


def check_report(iterations: float, step_time: float, rank: float | None, forward_time: float | None,
                 ctx: ReportContext) -> None:
    """Refuse (ReportRefused) a report with impossible figures: a step count or time that is negative or not
    finite, a forward pass longer than its step, a rank outside the job, a step count going backwards, or one
    from the future: more steps since the rank's last report than the time since then allows at the step time
    it reports (n x step_time > 2 x (elapsed + step_time) + REPORT_SLACK_S; the steps of a flush may have begun
    before the previous one, hence the step_time and the factor 2). A rank's first report in a run has no
    previous one to compare with: only its own figures are checked. Calibration must not move on a refusal."""

    def refuse(why: str) -> None:
        raise ReportRefused(f"report refused: {why}")

    for key, value in (("iterations", iterations), ("step_time", step_time), ("forward_time", forward_time)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 0):
            refuse(f"{key} must be a finite number >= 0, got {value!r}")
    if forward_time is not None and forward_time > step_time:
        refuse(f"forward_time {forward_time:g} s is longer than the whole step ({step_time:g} s)")
    if rank is not None:
        if isinstance(rank, bool) or not isinstance(rank, (int, float)) or rank != int(rank):
            refuse(f"rank must be an integer, got {rank!r}")
        if not 0 <= rank < ctx.world_size:
            refuse(f"rank {int(rank)} is outside the job (ranks 0..{ctx.world_size - 1})")
    if ctx.last_iterations is None:
        return
    if iterations < ctx.last_iterations:
        refuse(f"step {iterations:g} goes back from the {ctx.last_iterations:g} reported before")
    elapsed = max(0.0, ctx.elapsed_s or 0.0)
    if (iterations - ctx.last_iterations) * step_time > 2.0 * (elapsed + step_time) + REPORT_SLACK_S:
        refuse(f"step {iterations:g} is from the future: {iterations - ctx.last_iterations:g} steps of "
               f"{step_time:g} s in {elapsed:.1f} s since the last report")


# ----------------------------------------------------------------------------- HTTP API


class RequestError(ValueError):
    """An HTTP request body that does not validate (answered with 400 and this message)."""


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """POST /v1/jobs: what `mesh submit` sends."""

    command: list[str]  # argv; command[0] is the interpreter or executable
    cwd: str
    gpus: int = 1
    batch_size: int = 32
    iterations: int | None = None  # None: the script's declared total (hello's `steps`), else DEFAULT_ITERATIONS
    model: str = "custom"
    name: str = ""
    deadline: float | None = None  # absolute UNIX time
    guaranteed: bool = False
    env: dict[str, str] = field(default_factory=dict)  # the job's environment (`--export`), meshd's variables aside
    export: str = ""  # ALL: `env` is the submitter's whole environment; else (NONE, the names listed, "") it goes over
    # a minimal PATH/HOME/USER/LANG for the job's user
    plan: str | None = None  # execution plan (meshsched.perf.plans string form: dp2-ga2-gc); the job's MESH_PLAN
    cpus: int | None = None  # CPU cores in all (None: the node's share per GPU)
    memory_gb: float | None = None  # host memory in all, GB (None: the node's share per GPU)
    tenant: str = "default"  # whose quota a guaranteed job uses

    @classmethod
    def from_json(cls, data: Any) -> SubmitRequest:
        if not isinstance(data, dict):
            raise RequestError("body must be a JSON object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise RequestError(f"unknown field(s): {', '.join(sorted(unknown))}")
        command = data.get("command")
        if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
            raise RequestError("command must be a non-empty list of strings")
        cwd = data.get("cwd")
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise RequestError("cwd must be an absolute path")
        ints = {}
        for key, default in (("gpus", 1), ("batch_size", 32), ("iterations", None)):
            value = data.get(key, default)
            if value is None and default is None:
                ints[key] = None
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RequestError(f"{key} must be an integer >= 1, got {value!r}")
            ints[key] = value
        deadline = data.get("deadline")
        if deadline is not None and (
            isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline)
        ):
            raise RequestError("deadline must be a finite UNIX time in seconds")
        env = data.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise RequestError("env must map strings to strings")
        for key in ("model", "name", "tenant"):
            _label(key, data.get(key, ""))
        if "tenant" in data and not str(data["tenant"]).strip():
            raise RequestError("tenant must not be empty")
        plan = _plan(data.get("plan"), ints["gpus"])
        cpus = data.get("cpus")
        if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1):
            raise RequestError(f"cpus must be an integer >= 1, got {cpus!r}")
        memory_gb = data.get("memory_gb")
        if memory_gb is not None and (isinstance(memory_gb, bool) or not isinstance(memory_gb, (int, float))
                                      or not math.isfinite(memory_gb) or memory_gb <= 0):
            raise RequestError(f"memory_gb must be a number of GB > 0, got {memory_gb!r}")
        if "\0" in cwd or any("\0" in a for a in command):
            raise RequestError("command and cwd must not contain NUL characters")
        if any("\0" in k or "=" in k or not k or "\0" in v for k, v in env.items()):
            raise RequestError("env names must be non-empty, without '=' or NUL; values without NUL")
        size = env_bytes(env)
        if size > MAX_ENV_BYTES:
            raise RequestError(f"the job's environment is {size} bytes, over the limit of {MAX_ENV_BYTES}; submit "
                               "with --export=NONE or --export=VAR,... (the variables the job needs)")
        export = data.get("export", "")
        if not isinstance(export, str) or len(export) > MAX_EXPORT or not export.isprintable():
            raise RequestError(f"export must be ALL, NONE or a list of names, at most {MAX_EXPORT} characters")
        return cls(
            command=list(command),
            cwd=cwd,
            model=data.get("model") or "custom",
            name=data.get("name", ""),
            deadline=None if deadline is None else float(deadline),
            guaranteed=bool(data.get("guaranteed", False)),
            env=dict(env),
            export=export,
            plan=plan,
            cpus=cpus,
            memory_gb=None if memory_gb is None else float(memory_gb),
            tenant=data.get("tenant") or "default",
            **ints,
        )


def env_bytes(env: dict[str, str]) -> int:
    """The size of an environment as execve counts it: NAME=VALUE and a NUL per variable, in UTF-8."""
    return sum(len(k.encode(errors="surrogateescape")) + len(v.encode(errors="surrogateescape")) + 2
               for k, v in env.items())


def _plan(value: Any, gpus: int) -> str | None:
    """An execution plan in its canonical string form (`dp2-tp1-pp1-ga2-gc`), checked against the GPUs asked for."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise RequestError("plan must be a string such as dp2-ga2-gc")
    from meshsched.perf.plans import ExecutionPlan, InvalidPlan

    try:
        plan = ExecutionPlan.parse(value)
    except InvalidPlan as exc:
        raise RequestError(f"--plan: {exc}") from None
    if plan.gpus != gpus:
        raise RequestError(f"--plan {value}: uses {plan.gpus} GPU(s) (dp x tp x pp) but the job asks for {gpus} "
                           f"(--gpus {plan.gpus}, or a plan whose dp x tp x pp is {gpus})")
    return str(plan)
