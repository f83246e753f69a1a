"""The job commands (`submit`, `logs`, `cancel`, `hold`, `release`, `requeue`, `nodes`): thin clients of meshd's
API (`ls` and `show` are in cli/views.py, `top` in cli/top.py).

Plain functions with keyword arguments, called by the lean parser (cli/fast.py) and by the typer app
(cli/app.py) alike. Module imports are stdlib only (no typer, no rich, no pathlib): a `mesh ls` pays only
for what it uses.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # `collections.abc` costs the fast path ~1.5 ms (collections); type checkers read it
if TYPE_CHECKING:
    from collections.abc import Mapping

from meshsched.cli.client import (RECONNECT_SECONDS, SERVICE_HELP, SOCKET_HELP, ApiError, Client, DaemonGone,
                                  DaemonUnavailable, Riding, error_of)
from meshsched.cli.output import fail, print_json, print_json_bytes
from meshsched.wire.jobtable import columns

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
NOTHING_TO_CANCEL = 3  # `mesh cancel` exit code when a job had already ended (documented in --help, README)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
JOB_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a job's PATH when none is exported
# (daemon/launcher.py's DEFAULT_PATH)
ENV_LIMIT = 128 * 1024  # bytes of exported environment meshd takes (meshsched.wire.protocol.MAX_ENV_BYTES)


def api_call(method: str, url: str, body: object = None, client: Client | Riding | None = None) -> object:
    """One API call; meshd not reachable or an API error becomes a one-line error and an exit."""
    client = client or Client()
    try:
        return client.call(method, url, body)
    except DaemonUnavailable as exc:
        unreachable(client, exc)
    except ApiError as exc:
        fail(str(exc), code=1)


def api_bytes(url: str) -> bytes:
    """GET `url` and return meshd's answer undecoded (JSON for --json, `mesh ls`'s table: passed through)."""
    client = Client()
    try:
        status, _, data = client.raw("GET", url)
    except DaemonUnavailable as exc:
        unreachable(client, exc)
    except ApiError as exc:  # someone else's socket, permission denied, no answer in time: one line, as api_call
        fail(str(exc), code=1)
    if status >= 400:
        fail(str(error_of(status, data)), code=1)
    return data


def unreachable(client: Client | Riding, exc: Exception) -> None:
    """The one line for no meshd: the socket tried, the service to look at, how to point mesh elsewhere."""
    if isinstance(exc, DaemonGone):  # it was there, went away, and did not come back in time
        fail(str(exc))
    fail(f"meshd is not running (no daemon at {client.path}: {exc}); {SERVICE_HELP}; or {SOCKET_HELP}")


def parse_deadline(text: str, now: float) -> float:
    """`2h`, `90m`, `30s`, `1d` from now, or an ISO date-time."""
    t = text.strip()
    if t[-1:] in _UNITS and t[:-1].replace(".", "", 1).isdigit():  # a plain number: no sign, nan or inf
        return now + float(t[:-1]) * _UNITS[t[-1]]
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        fail(f"--deadline {text!r}: give a duration like 2h / 90m or an ISO date-time")


def parse_begin(text: str, now: float) -> float:
    """Slurm's --begin: now+N (seconds), now+N{s,m,h,d} or now+N{minutes,hours,days}, HH:MM[:SS] (today, or
    tomorrow once past), or an ISO date[-time] -> UNIX time."""
    t = text.strip().lower()
    if t.startswith("now+"):
        amount = t[4:]
        for word, unit in (("minutes", "m"), ("minute", "m"), ("hours", "h"), ("hour", "h"), ("days", "d"),
                           ("day", "d"), ("seconds", "s"), ("second", "s")):
            if amount.endswith(word):
                amount = amount[: -len(word)] + unit
                break
        if amount.isdigit():
            amount += "s"
        if amount[-1:] in _UNITS and amount[:-1].isdigit():
            return now + int(amount[:-1]) * _UNITS[amount[-1]]
    from datetime import datetime, timedelta

    parts = t.split(":")
    if 2 <= len(parts) <= 3 and all(p.isdigit() for p in parts):
        h, m, s = (list(map(int, parts)) + [0])[:3]
        if h < 24 and m < 60 and s < 60:
            at = datetime.fromtimestamp(now).replace(hour=h, minute=m, second=s, microsecond=0)
            return (at if at.timestamp() > now else at + timedelta(days=1)).timestamp()
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        fail(f"--begin {text!r}: give now+N (seconds) / now+5m / now+2hours, HH:MM[:SS], or an ISO date-time")


def parse_time_limit(text: str, unlimited: bool = False) -> float:
    """Slurm's --time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS -> seconds (> 0). `unlimited`: 0 (no limit,
    as Slurm) for UNLIMITED, INFINITE or a zero time (0, 00:00, 0-0)."""
    if unlimited and text.strip().upper() in ("UNLIMITED", "INFINITE"):
        return 0.0
    days, dash, rest = text.strip().rpartition("-") if "-" in text else ("", "", text.strip())
    parts = rest.split(":")
    try:
        if any(not p.isdigit() for p in parts) or (dash and not days.isdigit()) or len(parts) > 3:
            raise ValueError
        nums = [int(p) for p in parts]
        if dash:  # D-HH[:MM[:SS]]
            h, m, s = (nums + [0, 0])[:3]
            seconds = int(days) * 86400 + h * 3600 + m * 60 + s
        else:  # MM, MM:SS, HH:MM:SS
            seconds = {1: lambda: nums[0] * 60, 2: lambda: nums[0] * 60 + nums[1],
                       3: lambda: nums[0] * 3600 + nums[1] * 60 + nums[2]}[len(nums)]()
    except ValueError:
        fail(f"--time {text!r}: give MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (as in 1:30:00)")
    if seconds <= 0 and not unlimited:
        fail(f"--time {text!r}: the limit must be longer than zero")
    return float(seconds)


def parse_signal(text: str) -> str:
    """sbatch's --signal: [B:]SIG[@SECONDS] (SIG a name, USR1 or SIGUSR1, or a number; SECONDS 0-65535, default 60)
    -> its canonical form, B:SIGUSR1@60 (meshd checks it again)."""
    from meshsched.wire.jobsignal import parse_job_signal

    try:
        return parse_job_signal(text).text
    except ValueError as exc:
        fail(f"--signal {text[:40]!r}: {exc}")


def parse_mem(text: str) -> float:
    """--mem in GB: `64`, `64G`, `64GB`, `0.5` -> 64.0 (> 0)."""
    t = text.strip().upper().removesuffix("B").removesuffix("G")
    try:
        gb = float(t)
    except ValueError:
        gb = -1.0
    if not (gb > 0 and gb != float("inf")):
        fail(f"--mem {text!r}: give host memory in GB, like 64 or 64G")
    return gb


def parse_export(text: str, environ: Mapping[str, str]) -> tuple[dict[str, str], str]:
    """sbatch's --export: ALL (this environment), NONE, or VAR[,VAR=value...] (after ALL: this environment and
    those) -> (the variables the job gets, the mode meshd records: ALL, NONE, or the names listed). A listed
    variable that is not set here and has no value is left out, as sbatch does."""
    items = [i.strip() for i in text.split(",")]
    if not text.strip() or not all(items):
        fail(f"--export {text!r}: give ALL, NONE, or VAR[,VAR=value...] (e.g. --export=ALL,CUDA_LAUNCH_BLOCKING=1)")
    head = items[0].upper()
    if head == "NONE" and len(items) == 1:
        return {}, "NONE"
    whole = head == "ALL"
    env = dict(environ) if whole else {}
    names = []
    for item in items[1:] if whole else items:
        name, eq, value = item.partition("=")
        if not name or not name.isprintable() or name.upper() in ("ALL", "NONE"):
            fail(f"--export {text!r}: {item!r} is no variable (ALL or NONE come alone, or first: ALL,VAR=value)")
        if eq:
            env[name] = value
        elif name in environ:
            env[name] = environ[name]
        names.append(name)
    return env, "ALL" if whole else ",".join(dict.fromkeys(names))


def _env_bytes(env: dict[str, str]) -> int:
    return sum(len(os.fsencode(k)) + len(os.fsencode(v)) + 2 for k, v in env.items())


def build_command(script: str, args: list[str], path_var: str = JOB_PATH) -> list[str]:
    """How the job runs `script`, as the submitter's shell would: an executable file is executed; a file with a
    #! line that is not executable runs through that line's interpreter; a .py file without one runs on the
    `python3` first on `path_var` (the job's PATH), never on mesh's own interpreter."""
    path = os.path.realpath(script)
    executable = os.access(path, os.X_OK)
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)  # as much of a #! line as Linux reads
    except OSError as exc:
        if not executable:
            fail(f"script {script} cannot be read: {exc.strerror}")
        return [path, *args]  # executable, not readable: executed
    if executable and head.startswith((b"#!", b"\x7fELF")):
        return [path, *args]
    if head.startswith(b"#!"):
        words = os.fsdecode(head[2:].split(b"\n", 1)[0]).strip().split(None, 1)  # the interpreter, one argument
        if not words:
            fail(f"script {script}: its #! line names no interpreter")
        return [*words, path, *args]
    if path.endswith(".py"):
        python = which("python3", path_var)
        if python is None:
            fail(f"no python3 on the job's PATH ({path_var}) to run {script}; activate the environment it needs, "
                 "or give the script a #! line")
        return [os.path.abspath(python), path, *args]
    if executable:  # no #! line: a shell runs it with sh
        return ["/bin/sh", path, *args]
    fail(f"script {script} is not executable and has no #! line: `chmod +x {script}`, or start it with "
         "a line such as #!/bin/bash")


def which(name: str, path_var: str) -> str | None:
    """The first executable `name` (not a directory) in the directories of `path_var`, as shutil.which finds it
    on POSIX, without importing shutil (it brings bz2, lzma, fnmatch: ~4 ms of every submit)."""
    seen = set()
    for directory in path_var.split(os.pathsep) if path_var else ():
        if directory in seen:
            continue
        seen.add(directory)
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def _out(lines: list[str]) -> None:
    sys.stdout.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------- commands


def submit(script: str, args: list[str] | None = None, gpus: int = 1, batch_size: int = 32, iters: int | None = None,
           model: str = "custom", name: str = "", deadline: str = "", guaranteed: bool = False,
           as_json: bool = False, array: str = "", dependency: str = "", time_limit: str = "", hold: bool = False,
           wait: bool = False, output: str = "", error: str = "", begin: str = "", plan: str = "",
           cpus: int | None = None, mem: str = "", tenant: str = "", reconnect: float = RECONNECT_SECONDS,
           export: str = "ALL", signal: str = "") -> None:
    """`mesh submit` with the options its command line gave over the script's #MESH directives (both parsers,
    cli/fast.py and cli/app.py, merge them first: cli/directives.py)."""
    if gpus < 1:
        fail(f"--gpus must be at least 1, got {gpus}")
    if iters is not None and iters < 1:
        fail(f"--iters must be at least 1, got {iters}")
    if os.path.isdir(script):
        fail(f"script {script} is a directory; give the training script (a python file or an executable)")
    if not os.path.isfile(script):
        fail(f"script {script} does not exist")
    env, exported = parse_export(export, os.environ)
    if _env_bytes(env) > ENV_LIMIT:
        fail(f"the environment to export is {_env_bytes(env) // 1024} KiB, over meshd's limit of {ENV_LIMIT // 1024} "
             "KiB; submit with --export=NONE or --export=VAR,... (the variables the job needs)")
    body = {
        "command": build_command(script, list(args or []), env.get("PATH", JOB_PATH)), "cwd": os.getcwd(),
        "env": env, "export": exported, "gpus": gpus,
        "batch_size": batch_size, "model": model, "name": name,
        "deadline": parse_deadline(deadline, time.time()) if deadline else None, "guaranteed": guaranteed,
    }  # fmt: skip
    if iters is not None:  # else meshd takes the total a meshsched.job script declares (or its default)
        body["iterations"] = iters
    for key, value in (("array", array), ("dependency", dependency), ("output", output), ("error", error)):
        if value:  # job control (meshd checks them and says what is wrong in one line)
            body[key] = value
    limit = parse_time_limit(time_limit, unlimited=True) if time_limit else 0.0
    if limit:  # 0, 00:00 (Slurm's UNLIMITED): no limit, as without --time
        body["time_limit"] = limit
    if signal:  # [B:]SIG[@SECONDS]: SIG to the ranks SECONDS before the time limit
        body["signal"] = parse_signal(signal)
    if hold:
        body["hold"] = True
    if begin:
        body["begin"] = parse_begin(begin, time.time())
    if cpus is not None and cpus < 1:
        fail(f"--cpus must be at least 1, got {cpus}")
    for key, value in (("plan", plan), ("cpus", cpus), ("memory_gb", parse_mem(mem) if mem else None),
                       ("tenant", tenant)):
        if value:  # meshd checks the plan and whether any node could ever hold the job
            body[key] = value
    job = api_call("POST", "/v1/jobs", body)
    job_id = job.get("array_id") or job["job_id"]
    for line in job.get("warnings") or ():  # meshd's (a batch outside the model's profiled range)
        sys.stderr.write(f"mesh: warning: {line}\n")
    if as_json:
        print_json(job)
    elif "job_ids" in job:
        ids = job["job_ids"]
        sys.stdout.write(f"Submitted array job {job_id} ({len(ids)} tasks: {ids[0]} .. {ids[-1]})\n")
    else:
        sys.stdout.write(f"Submitted job {job_id}\n")
    if wait:
        sys.stdout.flush()
        raise SystemExit(wait_for(job_id, reconnect))


def wait_for(job_id: str, reconnect: float = RECONNECT_SECONDS) -> int:
    """Block until the job (every task of an array) ended; its exit code: 0 COMPLETED, a failed rank's code
    (128+N for a rank killed by signal N, as a shell says), else 1 (FAILED without a code, CANCELLED, TIMEOUT); the highest over an array's tasks. Rides through a
    restart of meshd (up to `reconnect` seconds away): the job runs on meanwhile, and the wait with it."""
    client = Riding(Client(timeout=90.0), reconnect, contacted=True)  # the submit just reached meshd
    while True:
        answer = api_call("GET", f"/v1/jobs/{job_id}/wait?timeout=60", client=client)
        if answer["done"]:
            break
    code = 0
    for j in answer["jobs"]:
        if j["state"] == "COMPLETED":
            continue
        own = j.get("exit_code")  # negative: the signal that killed a rank, which a shell reports as 128+N
        if isinstance(own, int) and -128 < own < 0:
            own = 128 - own
        code = max(code, own if j["state"] == "FAILED" and isinstance(own, int) and 0 < own < 256 else 1)
        why = f" ({j['reason']})" if j.get("reason") else ""
        sys.stderr.write(f"mesh: job {j['job_id']} ended {j['state']}{why}\n")
    return code


def confinement(job: dict) -> dict[str, str]:
    """`mesh show`'s lines for the CPUs and memory limit of the job's (last) run on its node."""
    limit = job.get("memory_limit_gb")
    by = job.get("memory_enforced_by") or "not enforced on its node"
    return {"cpu ids": job.get("cpu_list", ""),
            "memory limit": f"{limit:g} GiB ({by})" if limit is not None else ""}


def logs(job_id: str, follow: bool = False, rank: int = 0, reconnect: float = RECONNECT_SECONDS) -> None:
    """Print a job's log; says so on stderr while the log is still empty (stdout stays the log alone). Rides
    through a restart of meshd once it has answered, and goes on from the byte offset it had."""
    client = Riding(Client(), reconnect)
    offset, end = 0, None
    said_empty = False
    while True:
        try:
            status, headers, data = client.raw("GET", f"/v1/jobs/{job_id}/logs?rank={rank}&offset={offset}")
        except DaemonUnavailable as exc:
            unreachable(client, exc)
        except ApiError as exc:  # someone else's socket, permission denied, no answer in time
            fail(str(exc), code=1)
        if status >= 400:
            fail(str(error_of(status, data)), code=1)
        state = headers.get("x-job-state", "")
        if not data and offset == 0 and not said_empty:
            more = "; waiting for output" if follow and state not in TERMINAL else ""
            sys.stderr.write(f"mesh: job {job_id} is {state}; its log (rank {rank}) is empty so far{more}\n")
            sys.stderr.flush()
            said_empty = True
        if (offset == 0 and headers.get("x-log-rotated") == "1") or headers.get("x-log-restarted") == "1":
            sys.stderr.write(f"mesh: job {job_id} rank {rank}: the log was rotated (it is capped); older output is "
                             f"in rank{rank}.log.1 in the job directory or was dropped\n")
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        offset = int(headers.get("x-log-offset", offset))
        end = int(headers.get("x-log-size", 0)) if end is None else end  # the log as it was when asked
        if not follow:
            if data and offset < end:
                continue  # the rest of it, chunk by chunk (no silent stop after the first MiB)
            return
        if not data and state in TERMINAL:
            return
        if not data:
            time.sleep(0.5)  # client-side follow, like tail -f


def cancel(job_ids: list[str] | None = None, state: str = "", name: str = "", user: str = "", me: bool = False,
           signal: str = "") -> None:
    """Cancel each job; exit 0 when every one was cancelled, NOTHING_TO_CANCEL when one had already ended.
    With filters or --signal, one request selects (and cancels or signals) every unfinished job they match."""
    job_ids = list(job_ids or [])
    if state or name or user or me or signal:
        return _bulk_cancel(job_ids, state, name, user, me, signal)
    if not job_ids:
        fail("name the jobs to cancel: ids, or a filter (--state, --name, --user, --me)")
    client = Client()
    code = 0
    for job_id in job_ids:
        try:
            job = client.call("POST", f"/v1/jobs/{job_id}/cancel")
        except DaemonUnavailable as exc:
            unreachable(client, exc)
        except ApiError as exc:
            sys.stderr.write(f"mesh: error: {exc}\n")
            code = max(code, 1)
            continue
        if "tasks" in job:  # an array: every task of it
            ended = sum(1 for t in job["tasks"] if t["previous_state"] in TERMINAL)
            sys.stdout.write(f"array {job_id}: cancelled {len(job['tasks']) - ended} task(s)"
                             f"{f'; {ended} had already ended' if ended else ''}\n")
            if ended == len(job["tasks"]):
                code = code or NOTHING_TO_CANCEL
            continue
        before = job.get("previous_state", "")
        if before in TERMINAL:
            sys.stdout.write(f"job {job_id} already {before}; nothing to cancel\n")
            code = code or NOTHING_TO_CANCEL
        else:
            sys.stdout.write(f"job {job_id}: {job['state']}\n")
    if code:
        raise SystemExit(code)


def _bulk_cancel(job_ids: list[str], state: str, name: str, user: str, me: bool, signal: str) -> None:
    body = {"job_ids": job_ids, "state": state, "name": name, "user": user, "mine": me, "signal": signal}
    client = Client()
    try:
        answer = client.call("POST", "/v1/jobs/cancel", body)
    except DaemonUnavailable as exc:
        unreachable(client, exc)
    except ApiError as exc:  # 400: a malformed filter (--state BOGUS, --signal NOPE) is a usage error
        fail(str(exc), code=2 if exc.status == 400 else 1)
    if signal:
        for j in answer["jobs"]:
            sys.stdout.write(f"job {j['job_id']}: {j['signalled']} rank(s) got signal {answer['signal']}\n")
    else:
        for j in answer["jobs"]:
            sys.stdout.write(f"job {j['job_id']}: {j['state']}\n")
    if not answer["jobs"]:
        sys.stdout.write("no unfinished job matched\n")
        raise SystemExit(NOTHING_TO_CANCEL)


def _control(action: str, job_ids: list[str]) -> None:
    """hold / release / requeue each job (an array id: every task it applies to); exit 1 if meshd refused one."""
    client = Client()
    code = 0
    for job_id in job_ids:
        try:
            done = client.call("POST", f"/v1/jobs/{job_id}/{action}")["job_ids"]
        except DaemonUnavailable as exc:
            unreachable(client, exc)
        except ApiError as exc:
            sys.stderr.write(f"mesh: error: {exc}\n")
            code = 1
            continue
        what = done[0] if done == [job_id] else f"{job_id}: {len(done)} task(s)"
        sys.stdout.write(f"{action} {what}\n")
    if code:
        raise SystemExit(code)


def hold(job_ids: list[str]) -> None:
    _control("hold", job_ids)


def release(job_ids: list[str]) -> None:
    _control("release", job_ids)


def requeue(job_ids: list[str]) -> None:
    _control("requeue", job_ids)


def nodes(as_json: bool = False) -> None:
    if as_json:
        print_json_bytes(api_bytes("/v1/nodes"))
        return
    data = api_call("GET", "/v1/nodes")  # each node's "drain": DRAINING / DRAINED, or null
    rows = [("NODE", "STATE", "GPUS", "FREE", "TYPE", "CPUS", "MEM(GB)", "BACKEND", "POLICY", "QUEUE")] + [
        (n["name"] + (" (leader)" if n.get("leader") else ""), _node_state(n), str(n["total_gpus"]),
         str(n["free_gpus"]), n["gpus"][0]["name"] if n["gpus"] else "-", str(n.get("cpus", "-")),
         f"{n['memory_gb']:g}" if "memory_gb" in n else "-", n["backend"], n["policy"], str(n["queue_length"]))
        for n in data
    ]  # fmt: skip
    notes = [f"{n['name']}: memory limits not enforced ({n['confinement'].get('why', 'no mechanism')})"
             for n in data if n.get("confinement", {}).get("memory") == "not enforced"]
    notes += [_drain_note(n["drain"]) for n in data if n.get("drain")]
    _out(columns(rows) + notes)


def _node_state(n: dict) -> str:
    d = n.get("drain")
    if not n["alive"] or d is None:
        return "up" if n["alive"] else "down"
    return d["state"] if d["whole"] else f"{d['state']}:{','.join(map(str, d['gpus']))}"


def _drain_note(d: dict) -> str:
    gpus = "" if d["whole"] else f" GPU(s) {','.join(map(str, d['gpus']))}"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d["since"]))
    return f"{d['node']}{gpus} {d['state']}: {d['reason']} (by {d['by']}, since {since})"
