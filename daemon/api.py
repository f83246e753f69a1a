"""meshd's HTTP API (aiohttp) on a Unix socket for `mesh`, optionally on TCP with a bearer token.

Routes: GET /v1/health, GET/POST /v1/jobs (?all=0|1; ?format=table: `mesh ls`'s table, text, ?fields=id,user,..
and ?unfold=1; ?job=ID[,ID]: those jobs or arrays only, 404 when none exists, X-Unknown-Jobs naming those that do
not; ?state= ?user= ?mine=1 ?name=: daemon/jobformat.py), GET /v1/jobs/{id}, POST /v1/jobs/{id}/cancel|hold|release|requeue (an array id: every
task), POST /v1/jobs/cancel (many jobs by ids and filters, or --signal them), GET /v1/jobs/{id}/wait?timeout=S (until the job or every task of the array ended; long poll),
GET /v1/jobs/{id}/logs?rank=N&offset=B, GET /v1/jobs/{id}/explain, GET /v1/nodes, GET /metrics,
GET /v1/acct?since&until&user&state&summary=1 (ended jobs' accounting rows; a non-operator's own only),
GET /v1/drains, POST /v1/drain|resume {"node", "gpus", "reason"} (operators only; meshsched/drain.py).
POST /v1/jobs takes job control's fields besides SubmitRequest's (daemon/control.py): one request submits
a whole array (daemon/submission.py).
Errors are JSON {"error": "..."} with a 4xx status; a full disk is 507 and any other failure to write
meshd's state 503, each with one line saying so -- never aiohttp's bare 500.
"""

from __future__ import annotations

import errno
import hmac
import json
import logging
import os
import signal
import socket
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from meshsched.daemon.control import ControlRequest
from meshsched.daemon.journal import TERMINAL
from meshsched.daemon import jobformat, users
from meshsched.daemon.metrics import render_metrics
from meshsched.daemon.privacy import owner_reason
from meshsched.wire.protocol import SubmitRequest

DAEMON_KEY = web.AppKey("daemon", object)
LOG_CHUNK = 1 << 20
MAX_WAIT = 300.0  # seconds one wait request may block
LOG = logging.getLogger("meshd")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _peer_user(request: web.Request) -> str:
    return users.peer(request).name


def _record(request: web.Request):
    daemon = request.app[DAEMON_KEY]
    job_id = request.match_info["job_id"]
    rec = daemon.records.get(job_id)
    if rec is None:
        tasks = daemon.control.targets(job_id)
        why = (f"{job_id} is an array of {len(tasks)} tasks ({tasks[0].job_id} ..); name one task, or list them "
               f"with `mesh ls {job_id}`") if tasks else f"unknown job {job_id[:64]}"
        raise web.HTTPNotFound(text=json.dumps({"error": why}), content_type="application/json")
    return daemon, rec


async def health(request: web.Request) -> web.Response:
    d = request.app[DAEMON_KEY]
    return web.json_response({"status": d.status.value, "node": d.config.node_name, "pid": os.getpid()})


async def list_jobs(request: web.Request) -> web.Response:
    d = request.app[DAEMON_KEY]
    who, q, headers = users.peer(request), request.query, {}
    try:  # ?state= ?user= ?mine=1 ?name= ?fields=id,user,... (daemon/jobformat.py)
        recs = jobformat.select(d.records.values(), q, who.name)
        names = jobformat.parse_format(q["fields"]) if q.get("fields") else jobformat.DEFAULT
    except ValueError as exc:
        return _error(400, str(exc))
    if q.get("job"):  # some jobs (an array id: its tasks); an id that names none is an error (squeue's)
        asked = [j for j in q["job"].split(",") if j]
        found = {j: d.control.targets(j) for j in asked}
        unknown = [j[:64] for j in asked if not found[j]]
        if unknown and len(unknown) == len(asked):
            return _error(404, f"invalid job id {', '.join(unknown)}")
        if unknown:
            headers["X-Unknown-Jobs"] = ",".join(unknown).encode("ascii", "replace").decode()
        wanted = {r.job_id for tasks in found.values() for r in tasks}
        recs = [r for r in recs if r.job_id in wanted]
    if q.get("format") == "table":  # `mesh ls`: the squeue columns
        return web.Response(body=d.listings.table(recs, who.uid, who.operator, names, q.get("unfold") == "1"),
                            content_type="text/plain", charset="utf-8", headers=headers)
    return web.Response(body=d.listings.views(recs, who.uid, who.operator), content_type="application/json",
                        headers=headers)


async def submit(request: web.Request) -> web.Response:
    d = request.app[DAEMON_KEY]
    try:
        ctl, body = ControlRequest.split(await request.json())
        req = SubmitRequest.from_json(body)
        who = users.peer(request)
        recs = d.submission.submit(req, ctl, who.name, None if who.operator else who.uid)
    except ValueError as exc:  # RequestError, SubmitError, bad JSON, JobSpec validation
        return _error(400, str(exc))
    warnings = {"warnings": said} if (said := d.submission.batch_warnings(req)) else {}  # speed extrapolated
    if not ctl.tasks:
        return web.json_response(d.listings.view_for(recs[0], who.uid, who.operator) | warnings, status=201)
    return web.json_response({"array_id": recs[0].array_id, "job_ids": [r.job_id for r in recs], "tasks": len(recs),
                              "array_limit": ctl.array_limit} | warnings, status=201)


async def show(request: web.Request) -> web.Response:
    d, rec = _record(request)
    who = users.peer(request)  # the owner or an operator (_users_guard refuses anyone else)
    view = d.listings.view_for(rec, who.uid, who.operator)
    view["history"] = d.journal.history(rec.job_id)
    if not who.operator:  # the transitions' reasons, as the view's: without meshd's own paths
        view["history"] = [(t, s, owner_reason(r, d.listings.server_dirs, rec.job_dir)) for t, s, r in view["history"]]
    return web.json_response(view)


async def cancel(request: web.Request) -> web.Response:
    d = request.app[DAEMON_KEY]
    job_id = request.match_info["job_id"]
    if job_id not in d.records and d.control.targets(job_id):  # an array: every task of it
        return web.json_response({"array_id": job_id, "tasks": _cancel_all(d, d.control.targets(job_id))})
    d, rec = _record(request)
    before = rec.state  # `mesh cancel` says when the job had already ended and nothing was done
    who = users.peer(request)
    return web.json_response(dict(d.listings.view_for(d.cancel(rec.job_id), who.uid, who.operator),
                                  previous_state=before))


async def bulk_cancel(request: web.Request) -> web.Response:
    """POST /v1/jobs/cancel {"job_ids", "state", "name", "user", "mine", "signal"}: cancel (or signal) every
    unfinished job they select, in one request; a user who is not an operator selects among their own jobs."""
    d = request.app[DAEMON_KEY]
    who = users.peer(request)
    try:
        query = await request.json()
        recs = d.control.select(query, who)
        signum = _signal(query.get("signal"))
    except LookupError as exc:
        return _error(404, str(exc.args[0]))
    except ValueError as exc:
        return _error(400, str(exc))
    if not who.operator:  # ids of other users' jobs are refused, not skipped in silence
        why = users.refusal(who, [r for i in query.get("job_ids") or [] for r in d.control.targets(i)])
        if why:
            return _error(403, why)
    if signum is not None:
        return web.json_response({"signal": signum, "jobs": d.control.signal(recs, signum)})
    return web.json_response({"jobs": _cancel_all(d, recs)})


def _cancel_all(d, recs: list) -> list[dict]:
    """Cancel every job of `recs` in one batch (one scheduling pass after the last: `NodeDaemon.cancel_many`); each
    job's id, state after and state before."""
    before = [rec.state for rec in recs]
    after = d.cancel_many([rec.job_id for rec in recs])
    return [{"job_id": rec.job_id, "state": _shown(rec), "previous_state": was} for rec, was in zip(after, before)]


def _shown(rec) -> str:
    """A job's state as `mesh` shows it: COMPLETING while a cancelled job's processes are still exiting."""
    return "COMPLETING" if rec.cancelling and rec.state in ("LOADING", "RUNNING", "PAUSING") else rec.state


def _signal(value: object) -> int | None:
    """A signal by name (USR1, SIGUSR1) or number; None when none was given."""
    if value in (None, ""):
        return None
    text = str(value).upper()
    try:
        return int(signal.Signals(int(text))) if text.isdigit() else int(signal.Signals[text if text.startswith("SIG") else "SIG" + text])
    except (KeyError, ValueError):
        raise ValueError(f"--signal {str(value)[:20]!r}: not a signal (give a name like USR1 or a number)") from None


async def control(request: web.Request) -> web.Response:
    """hold / release / requeue a job, or every task of an array it applies to."""
    d = request.app[DAEMON_KEY]
    job_id, action = request.match_info["job_id"], request.match_info["action"]
    try:
        done = getattr(d.control, action)(job_id)
    except LookupError as exc:
        return _error(404, str(exc.args[0]))
    except ValueError as exc:
        return _error(409, str(exc))
    return web.json_response({"job_ids": done})


async def wait(request: web.Request) -> web.Response:
    """Answer once the job (every task of the array) ended, or after ?timeout= seconds: {"done", "jobs"}."""
    d = request.app[DAEMON_KEY]
    job_id = request.match_info["job_id"]
    recs = d.control.targets(job_id)
    if not recs:
        return _error(404, f"unknown job {job_id[:64]}")
    try:
        timeout = min(MAX_WAIT, max(0.0, float(request.query.get("timeout", "30"))))
    except ValueError:
        return _error(400, "timeout must be a number of seconds")
    await d.control.wait(recs, timeout)
    who = users.peer(request)  # the owner or an operator (_users_guard refuses anyone else)
    shown = (lambda r: r.reason) if who.operator else (
        lambda r: owner_reason(r.reason, d.listings.server_dirs, r.job_dir))
    return web.json_response({"done": all(r.state in TERMINAL for r in recs), "jobs": [
        {"job_id": r.job_id, "state": r.state, "reason": shown(r), "exit_code": r.exit_code} for r in recs]})


async def explain(request: web.Request) -> web.Response:
    d, rec = _record(request)
    return web.json_response([
        {"time": e.time, "stimulus": e.stimulus_id, "message": e.message} for e in d.engine.explain(rec.job_id)
    ])


async def logs(request: web.Request) -> web.Response:
    d, rec = _record(request)
    rank_text, offset_text = request.query.get("rank", "0"), request.query.get("offset", "0")
    if not (rank_text.isascii() and rank_text.isdigit() and offset_text.isascii() and offset_text.isdigit()):
        return _error(400, f"rank and offset must be non-negative integers, got rank={rank_text[:40]!r} "
                           f"offset={offset_text[:40]!r}")
    rank, offset = int(rank_text), int(offset_text)
    if not rank < rec.gpus:
        return _error(400, f"rank must be in [0, {rec.gpus})")
    node, local = d.rank_home(rec, rank)
    if node != d.config.node_name:
        return _error(404, f"job {rec.job_id}: rank {rank} ran on node {node}; its log is there "
                           f"(ask that node's meshd: MESH_API_SOCKET=<its runtime dir>/api.sock mesh logs ...)")
    path = Path(rec.job_dir) / "logs" / f"rank{local}.log"
    data, size = b"", 0
    truncated = False
    try:
        with open(path, "rb", opener=_no_follow) as fh:
            st = os.fstat(fh.fileno())
            if rec.uid is not None and st.st_uid != rec.uid:  # a link its user planted to someone else's file
                return _error(403, f"job {rec.job_id}: its log is not owned by {rec.user}; not reading it")
            size = st.st_size
            if offset > size:  # the log was rotated since the client's last read: start again from its head
                offset, truncated = 0, True
            fh.seek(offset)
            data = fh.read(LOG_CHUNK)
    except (FileNotFoundError, NotADirectoryError):
        pass
    rotated = path.with_name(path.name + ".1").exists()
    headers = {"X-Log-Offset": str(offset + len(data)), "X-Log-Size": str(size), "X-Job-State": rec.state,
               "X-Log-Rotated": "1" if rotated else "0", "X-Log-Restarted": "1" if truncated else "0"}
    return web.Response(body=data, headers=headers, content_type="text/plain")


async def nodes(request: web.Request) -> web.Response:
    return web.json_response(request.app[DAEMON_KEY].listings.nodes_view())


async def metrics(request: web.Request) -> web.Response:
    return web.Response(text=render_metrics(request.app[DAEMON_KEY]), content_type="text/plain")


# ---------------------------------------------------------------- drain and resume (operators only)

async def drains(request: web.Request) -> web.Response:
    """What is drained, per node: its GPUs, DRAINING (jobs still run there) or DRAINED, reason, by, since."""
    return web.json_response(request.app[DAEMON_KEY].engine.drains.all_status())


async def drain_change(request: web.Request) -> web.Response:
    """POST /v1/drain or /v1/resume {"node", "gpus": [local indices] (none: all), "reason"}: an engine event,
    journaled (one server) or carried in the mesh's log."""
    import time

    from meshsched import events as ev

    d, who = request.app[DAEMON_KEY], users.peer(request)
    on = request.match_info["action"] == "drain"
    if not who.operator:
        return _error(403, f"user {who.name} may not {request.match_info['action']} nodes: only an operator "
                           f"(root or meshd's own user) may")
    try:
        body = await request.json()
        name, gpus, reason = str(body["node"]), tuple(int(g) for g in body.get("gpus") or ()), str(body.get("reason", ""))
    except (ValueError, KeyError, TypeError):
        return _error(400, 'the body must be {"node": NAME, "gpus": [INDEX, ...], "reason": TEXT}')
    node = d.engine.state.nodes.get(name)
    if node is None:
        return _error(404, f"unknown node {name[:64]} (known: {', '.join(sorted(d.engine.state.nodes)) or 'none'})")
    bad = [g for g in gpus if not 0 <= g < node.size]
    if bad:
        return _error(400, f"node {name} has GPUs 0-{node.size - 1}; no GPU {bad[0]}")
    if on and not reason.strip():
        return _error(400, "say why with --reason TEXT (it is shown in `mesh nodes`)")
    event = ev.DrainChanged(d.loop.sid("drain"), name, gpus, on, reason[:200], who.name, time.time())
    d.loop.input(event)
    LOG.info("%s %s%s by %s: %s", "drain" if on else "resume", name, f":{list(gpus)}" if gpus else "", who.name, reason)
    return web.json_response({"node": name, "gpus": list(gpus), "drain": on, "applied": d.mesh is None,
                              "status": d.engine.drains.status(name)})


# ---------------------------------------------------------------- accounting (daemon/accounting.py)

async def acct(request: web.Request) -> web.Response:
    """GET /v1/acct?since=T&until=T&user=A,B&state=S,..&summary=1: accounting rows of ended jobs (by end time), or
    GPU-hours per user and tenant; a user who is not an operator gets their own rows only."""
    from meshsched.daemon.accounting import summary

    d, q, who = request.app[DAEMON_KEY], request.query, users.peer(request)
    try:
        since, until = (float(q[k]) if q.get(k) else None for k in ("since", "until"))
    except ValueError:
        return _error(400, "since and until are UNIX times")
    rows = d.accounting.rows(since, until, [u for u in q.get("user", "").split(",") if u],
                             [s for s in q.get("state", "").split(",") if s], None if who.operator else (who.uid, who.name))
    if q.get("summary") == "1":
        return web.json_response(dict(summary(rows), since=since, until=until))
    for row in rows:
        row.pop("uid", None)
    return web.json_response(rows)


def _token_guard(token: str):
    @web.middleware
    async def guard(request: web.Request, handler):
        sock = request.transport.get_extra_info("socket") if request.transport else None
        if sock is not None and sock.family != socket.AF_UNIX:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return _error(401, "missing or wrong bearer token")
        return await handler(request)

    return guard


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW)


def _users_guard(config):
    """Many users (`submit_users`): who may use the API at all, and act on or read which jobs."""

    @web.middleware
    async def guard(request: web.Request, handler):
        who = users.peer(request)
        if who.operator or request.path == "/v1/health":
            return await handler(request)
        if not config.may_submit(who.name):
            return _error(403, f"user {who.name} may not use this meshd (its operator lists who may in submit_users)")
        job_id = request.match_info.get("job_id")
        if job_id is not None:
            why = users.refusal(who, request.app[DAEMON_KEY].control.targets(job_id))
            if why:
                return _error(403, why)
        return await handler(request)

    return guard


@web.middleware
async def _failures(request: web.Request, handler):
    """Failures of meshd's own I/O become one clear line; nothing reaches aiohttp's generic 500 page."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except (OSError, sqlite3.Error) as exc:
        full = getattr(exc, "errno", None) == errno.ENOSPC or "disk is full" in str(exc)
        if full:
            LOG.error("%s %s: disk full: %s", request.method, request.path, exc)
            return _error(507, f"meshd cannot write its state: the disk is full ({exc})")
        LOG.error("%s %s: %s", request.method, request.path, exc)
        return _error(503, f"meshd cannot read or write its state: {exc}")


def make_app(daemon) -> web.Application:
    app = web.Application(middlewares=[_failures, _token_guard(daemon.config.token), _users_guard(daemon.config)],
                          client_max_size=1 << 20)
    app[DAEMON_KEY] = daemon
    app.router.add_get("/v1/health", health)
    app.router.add_get("/v1/jobs", list_jobs)
    app.router.add_post("/v1/jobs", submit)
    app.router.add_get("/v1/jobs/{job_id}", show)
    app.router.add_post("/v1/jobs/cancel", bulk_cancel)
    app.router.add_post("/v1/jobs/{job_id}/cancel", cancel)
    app.router.add_post("/v1/jobs/{job_id}/{action:hold|release|requeue}", control)
    app.router.add_get("/v1/jobs/{job_id}/wait", wait)
    app.router.add_get("/v1/jobs/{job_id}/logs", logs)
    app.router.add_get("/v1/jobs/{job_id}/explain", explain)
    app.router.add_get("/v1/nodes", nodes)
    app.router.add_get("/v1/drains", drains)
    app.router.add_post("/v1/{action:drain|resume}", drain_change)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/acct", acct)
    return app


async def start_api(daemon) -> Callable[[], Awaitable[None]]:
    """Serve the API; returns the coroutine function that stops it."""
    runner = web.AppRunner(make_app(daemon), access_log=None)
    await runner.setup()
    path = daemon.config.api_socket
    path.unlink(missing_ok=True)
    await web.UnixSite(runner, str(path)).start()
    # one user: only meshd's user may use it; many (submit_users): everyone connects, _users_guard decides
    os.chmod(path, 0o666 if daemon.config.submit_users else 0o600)
    if daemon.config.http_tcp:
        host, _, port = daemon.config.http_tcp.rpartition(":")
        await web.TCPSite(runner, host or "127.0.0.1", int(port)).start()

    async def close() -> None:
        await runner.cleanup()
        path.unlink(missing_ok=True)

    return close
