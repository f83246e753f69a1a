"""EtcdCoordinator: the coordinator over etcd's v3 JSON gateway (aiohttp), leadership as in Patroni's etcd3 DCS.

Key layout under `prefix` (keys and values travel base64-encoded, as the gateway wants):
  {prefix}/leader          the leader's node name, under the leader's lease; its create revision is the term
  {prefix}/members/{name}  a Member as JSON, under that node's lease (it vanishes when the node stops renewing)
  {prefix}/records/{key}   job records and decisions (`Coordinator.put/get/delete/list/watch`)

One lease per node, granted at `start()` and kept alive every loop_wait by a background task; the leader key
is created only if absent (txn on create_revision == 0). A node believes it leads only until its lease could
have expired (the moment its last successful keepalive was *sent* plus the TTL), so a deposed leader stops
before another node can take over. Every call has a timeout and retries (across endpoints) for at most
retry_timeout; a store that does not answer gives `CoordinatorUnavailable`, one that is not etcd `NotEtcd`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from meshsched.daemon.config import CoordinatorConfig
from meshsched.daemon.coordinator import (
    Change,
    ChangeKind,
    CoordinatorError,
    CoordinatorUnavailable,
    Leadership,
    Listing,
    Member,
    StaleTerm,
    WatchCompacted,
    check_key,
)

LOG = logging.getLogger("meshd.coordinator")
MIN_VERSION = (3, 4)  # the /v3 gateway prefix
RETRYABLE_CODES = {4, 14}  # gRPC DeadlineExceeded, Unavailable (e.g. no raft leader yet)
LEASE_NOT_FOUND = "requested lease not found"


class NotEtcd(CoordinatorError):
    """The endpoint answered, but not as etcd's v3 JSON gateway does."""


class EtcdError(CoordinatorError):
    """etcd refused a request (a gRPC error from the gateway)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


def _range_end(prefix: str) -> str:
    """The end of etcd's key range holding every key that starts with `prefix` (base64)."""
    end = bytearray(prefix.encode())
    while end and end[-1] == 0xFF:
        end.pop()
    if not end:
        return _b64(b"\0")
    end[-1] += 1
    return _b64(bytes(end))


def _one_line(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    cause = getattr(exc, "os_error", None) or exc
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    return _one_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def _parse(endpoint: str, path: str, status: int, content_type: str, body: bytes) -> dict:
    """The JSON object etcd answered, or the one-line error that says what was wrong."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict):
        snippet = _one_line(body[:200].decode(errors="replace")) or "an empty body"
        raise NotEtcd(f"{endpoint} is not etcd: {path} answered HTTP {status} "
                      f"{content_type or 'without a content type'} ({snippet!r}), not etcd's JSON")
    error = data.get("error")
    if status >= 400 or error:
        if isinstance(error, dict):  # an error inside a stream
            code, message = error.get("grpc_code"), error.get("message")
        else:
            code, message = data.get("code"), data.get("message") or error
        if not isinstance(code, int):
            raise NotEtcd(f"{endpoint} is not etcd: {path} answered HTTP {status} with JSON that is not a gRPC error")
        raise EtcdError(f"etcd at {endpoint}: {path}: {_one_line(str(message))} (gRPC code {code})", code)
    return data


class Gateway:
    """HTTP/JSON calls to etcd's gateway: one ClientSession, a timeout on every call, endpoint failover and
    retries bounded by retry_timeout."""

    def __init__(self, endpoints: tuple[str, ...], retry_timeout: float, idle: float) -> None:
        self.endpoints = tuple(e.rstrip("/") for e in endpoints)
        self.retry_timeout = retry_timeout
        self.idle = idle  # a stream silent this long is ended (and re-opened by its owner): no half-open hangs
        self.version = ""
        self._current = 0
        self._session: aiohttp.ClientSession | None = None
        self._streams: set[aiohttp.ClientResponse] = set()  # open watches: closing the session leaves them

    @property
    def endpoint(self) -> str:
        return self.endpoints[self._current]

    async def open(self) -> None:
        """Connect and check that the endpoint is etcd >= 3.4; raises NotEtcd or CoordinatorUnavailable."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        try:
            data = await self._retrying("GET", "/version", None)
            server = data.get("etcdserver")
            if not isinstance(server, str):
                raise NotEtcd(f"{self.endpoint} is not etcd: /version answered JSON without 'etcdserver'")
            try:
                version = tuple(int(x) for x in server.split(".")[:2])
            except ValueError:
                raise NotEtcd(f"{self.endpoint} is not etcd: /version says etcdserver={server!r}") from None
            if version < MIN_VERSION:
                raise NotEtcd(f"etcd at {self.endpoint} is {server}; meshsched needs etcd >= 3.4 (the /v3 gateway)")
            self.version = server
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        session, self._session = self._session, None
        for resp in list(self._streams):
            resp.close()
        if session is not None:
            await session.close()

    async def call(self, path: str, body: dict) -> dict:
        data = await self._retrying("POST", path, body)
        if "header" not in data and "header" not in data.get("result", {}):
            raise NotEtcd(f"{self.endpoint} is not etcd: {path} answered JSON without etcd's response header")
        return data

    async def _retrying(self, method: str, path: str, body: dict | None) -> dict:
        if self._session is None:
            raise CoordinatorUnavailable(f"etcd at {self.endpoint}: the coordinator is not started or closed")
        deadline = time.monotonic() + self.retry_timeout
        delay = 0.05
        while True:
            session, endpoint = self._session, self.endpoint
            if session is None:
                raise CoordinatorUnavailable(f"etcd at {endpoint}: the coordinator is closed")
            remaining = deadline - time.monotonic()
            attempt = max(min(remaining, self.retry_timeout / 2), 0.05)  # a dead pooled connection costs half
            try:
                async with session.request(method, endpoint + path, json=body,
                                                 timeout=aiohttp.ClientTimeout(total=attempt)) as resp:
                    raw = await resp.read()
                    return _parse(endpoint, path, resp.status, resp.content_type, raw)
            except EtcdError as exc:
                if exc.code not in RETRYABLE_CODES:
                    raise
                reason = str(exc)
                self._current = (self._current + 1) % len(self.endpoints)
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                reason = _reason(exc)
                self._current = (self._current + 1) % len(self.endpoints)
            if time.monotonic() + delay >= deadline:
                where = endpoint if len(self.endpoints) == 1 else ", ".join(self.endpoints)
                raise CoordinatorUnavailable(f"etcd at {where} does not answer: {reason} "
                                             f"(tried for {self.retry_timeout:g} s)")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def stream(self, path: str, body: dict) -> AsyncIterator[dict]:
        """The messages of a streaming call (watch) until the stream ends or stays silent for `idle` seconds;
        one attempt, no retry: CoordinatorUnavailable when it cannot be opened or breaks."""
        if self._session is None:
            raise CoordinatorUnavailable(f"etcd at {self.endpoint}: the coordinator is not started or closed")
        endpoint = self.endpoint
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.retry_timeout, sock_read=self.idle)
        resp = None
        try:
            async with self._session.post(endpoint + path, json=body, timeout=timeout) as resp:
                self._streams.add(resp)
                if resp.status != 200:
                    _parse(endpoint, path, resp.status, resp.content_type, await resp.read())
                    raise NotEtcd(f"{endpoint} is not etcd: {path} answered HTTP {resp.status}")
                buffer = b""
                chunks = resp.content.iter_any()
                while True:
                    try:
                        chunk = await anext(chunks)
                    except (StopAsyncIteration, TimeoutError):  # ended, or silent for `idle` seconds
                        return
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield _parse(endpoint, path, 200, resp.content_type, line)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._current = (self._current + 1) % len(self.endpoints)
            raise CoordinatorUnavailable(f"etcd at {endpoint}: {path} stream broke: {_reason(exc)}") from None
        finally:
            if resp is not None:
                self._streams.discard(resp)


class EtcdCoordinator:
    """The Coordinator over etcd (see the module docstring for keys, leases and fencing)."""

    def __init__(self, config: CoordinatorConfig, name: str) -> None:
        config.validate()  # Patroni's timing rule among the rest: one clear line
        if not name or "/" in name:
            raise ValueError(f"bad node name {name!r}")
        self.name = name
        self.config = config
        self._gateway = Gateway(config.endpoints, config.retry_timeout, idle=config.ttl)
        self._leader_key = f"{config.prefix}/leader"
        self._members_prefix = f"{config.prefix}/members/"
        self._records_prefix = f"{config.prefix}/records/"
        self._lease: int | None = None
        self._lease_until = 0.0  # monotonic: our lease surely lives until then
        self._lease_lock = asyncio.Lock()
        self._term: int | None = None
        self._member: Member | None = None
        self._member_lease: int | None = None  # the lease the member entry was last put under
        self._leader_changed = asyncio.Event()
        self._leader_state: tuple[int, int] | None = None  # (create revision, lease) of the leader key seen
        self._tasks: list[asyncio.Task] = []
        self._closed = False
        self._outage = False  # logged once per outage

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Connect, check that it is etcd, take a lease; raises NotEtcd / CoordinatorUnavailable (one line)."""
        if self._tasks:
            return
        self._closed = False
        await self._gateway.open()
        try:
            await self._ensure_lease()
        except BaseException:
            await self._gateway.close()
            raise
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keepalive_loop()), loop.create_task(self._leader_watch_loop())]
        LOG.info("coordinator: etcd %s at %s, lease %x", self._gateway.version, self._gateway.endpoint, self._lease)

    async def close(self, release: bool = True) -> None:
        """Stop. With release (a clean stop) the leader key and the lease go at once, so members see this
        node leave now; without it (as after a crash) they go when the lease expires."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if release and self._lease is not None:
            try:  # the leader key and the member entry hang on the lease: revoking it deletes both
                await self._gateway.call("/v3/lease/revoke", {"ID": str(self._lease)})
            except CoordinatorError as exc:
                if LEASE_NOT_FOUND not in str(exc):
                    LOG.warning("coordinator: could not hand back lease: %s", exc)
        self._term = None
        self._lease = None
        self._notify_leader_change()
        await self._gateway.close()

    # ---------------------------------------------------------------- lease

    async def _ensure_lease(self) -> int:
        async with self._lease_lock:
            if self._lease is None:
                sent = time.monotonic()
                data = await self._gateway.call("/v3/lease/grant", {"TTL": str(self.config.ttl)})
                self._lease = int(data["ID"])
                self._lease_until = sent + int(data.get("TTL", self.config.ttl))
            return self._lease

    async def _keepalive(self) -> None:
        """Renew the lease now (a lease etcd no longer knows means leadership is gone: take a new one), and
        make sure the member entry hangs on the lease we hold."""
        lease = await self._ensure_lease()
        sent = time.monotonic()
        data = await self._gateway.call("/v3/lease/keepalive", {"ID": str(lease)})
        ttl = int(data.get("result", {}).get("TTL", 0))
        if ttl > 0:
            if self._lease == lease:
                self._lease_until = sent + ttl
            await self._ensure_member()
            return
        if self._lease == lease:  # not already replaced by a concurrent caller
            LOG.warning("coordinator: lease %x expired%s", lease, "; leadership lost" if self._term else "")
            if self._term is not None:
                self._term = None
                self._notify_leader_change()
            self._lease = None
        await self._ensure_lease()
        await self._ensure_member()

    async def _keepalive_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.loop_wait)
            had_term = self.term
            try:
                await self._keepalive()
                if self._outage:
                    LOG.info("coordinator: etcd answers again")
                    self._outage = False
            except Exception as exc:  # noqa: BLE001 - the loop outlives any one failure (local-first)
                if not self._outage:
                    LOG.warning("coordinator: keepalive: %s", exc if isinstance(exc, CoordinatorError) else repr(exc))
                    self._outage = True
            if had_term is not None and self.term is None:
                LOG.warning("coordinator: leadership of term %d lost (lease not renewed in time)", had_term)
                self._term = None
                self._notify_leader_change()

    # ---------------------------------------------------------------- leadership

    @property
    def term(self) -> int | None:
        if self._term is not None and time.monotonic() < self._lease_until:
            return self._term
        return None

    async def acquire_leadership(self) -> int | None:
        """Become leader if nobody is (the key is created only if absent); the term, or None."""
        if self._closed:
            return None
        try:
            try:
                self._term = await self._try_acquire(await self._ensure_lease())
            except EtcdError as exc:
                if LEASE_NOT_FOUND not in str(exc):
                    raise
                self._lease = None  # etcd dropped our lease (e.g. while it was down): take a new one
                self._term = await self._try_acquire(await self._ensure_lease())
        except CoordinatorError as exc:
            LOG.debug("coordinator: acquire: %s", exc)
            return self.term
        return self.term

    async def _try_acquire(self, lease: int) -> int | None:
        key = _b64(self._leader_key)
        data = await self._gateway.call("/v3/kv/txn", {
            "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": _b64(self.name), "lease": str(lease)}}],
            "failure": [{"request_range": {"key": key}}],
        })
        if data.get("succeeded"):
            term = int(data["header"]["revision"])
            LOG.info("coordinator: %s is the leader, term %d", self.name, term)
            return term
        kvs = data["responses"][0]["response_range"].get("kvs", [])
        if kvs and int(kvs[0].get("lease", 0)) == lease:
            return int(kvs[0]["create_revision"])  # already ours
        return None

    async def renew_leadership(self) -> int | None:
        """Keep alive now and check that the leader key is still ours; the term, or None once it is gone.
        While etcd does not answer, the term holds until the lease could have expired, then None."""
        if self._term is None or self._closed:
            return None
        try:
            await self._keepalive()
            current = await self._leader_kv()
            if self._term is not None and (current is None or int(current.get("lease", 0)) != self._lease
                                           or int(current["create_revision"]) != self._term):
                LOG.warning("coordinator: leadership of term %d lost (the leader key is gone)", self._term)
                self._term = None
                self._notify_leader_change()
        except CoordinatorError as exc:
            LOG.debug("coordinator: renew: %s", exc)
        return self.term

    async def release_leadership(self) -> None:
        """Delete the leader key if it is still this term's. If etcd does not answer, give up the lease
        instead (a new one is taken for the member entry): the key then expires within ttl, as it must,
        rather than live on under a lease the keepalive would renew."""
        term, lease, self._term = self._term, self._lease, None
        if term is None:
            return
        self._notify_leader_change()
        key = _b64(self._leader_key)
        try:
            await self._gateway.call("/v3/kv/txn", {
                "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": str(term)}],
                "success": [{"request_delete_range": {"key": key}}],
            })
        except CoordinatorError as exc:
            LOG.warning("coordinator: could not delete the leader key (%s); giving up lease %x", exc, lease)
            async with self._lease_lock:
                if self._lease == lease:
                    self._lease = None

    async def _leader_kv(self) -> dict | None:
        data = await self._gateway.call("/v3/kv/range", {"key": _b64(self._leader_key)})
        kvs = data.get("kvs", [])
        return kvs[0] if kvs else None

    async def leader(self) -> Leadership | None:
        kv = await self._leader_kv()
        return Leadership(_unb64(kv.get("value", "")), int(kv["create_revision"])) if kv else None

    async def is_current(self, term: int) -> bool:
        """Whether a command of `term` may be obeyed: it is not older than the current leader key's."""
        current = await self.leader()
        return current is not None and term >= current.term

    def _notify_leader_change(self) -> None:
        self._leader_changed.set()
        self._leader_changed = asyncio.Event()

    async def wait_leader_change(self, timeout: float) -> bool:
        """Wait until the leader key changes (or this node's leadership is lost) or timeout; True if it did."""
        event = self._leader_changed
        try:
            async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can swallow a cancellation
                await event.wait()
        except TimeoutError:
            return False
        return True

    async def _leader_watch_loop(self) -> None:
        key = _b64(self._leader_key)
        while True:
            try:
                data = await self._gateway.call("/v3/kv/range", {"key": key})
                kvs = data.get("kvs", [])
                self._saw_leader_key(kvs[0] if kvs else None)  # it may have changed while nobody watched
                start = int(data["header"]["revision"]) + 1
                async for message in self._gateway.stream("/v3/watch", {
                        "create_request": {"key": key, "start_revision": str(start)}}):
                    for event in message.get("result", {}).get("events", []):
                        self._saw_leader_key(None if event.get("type") == "DELETE" else event["kv"])
                continue  # the stream went quiet for `ttl` seconds: open it again at once
            except CoordinatorError as exc:
                LOG.debug("coordinator: leader watch: %s", exc)
            except Exception as exc:  # noqa: BLE001 - the watch outlives any one failure
                LOG.warning("coordinator: leader watch: %r", exc)
            await asyncio.sleep(self.config.loop_wait)

    def _saw_leader_key(self, kv: dict | None) -> None:
        state = (int(kv["create_revision"]), int(kv.get("lease", 0))) if kv else None
        if state == self._leader_state:
            return
        self._leader_state = state
        if self._term is not None and state != (self._term, self._lease):
            LOG.warning("coordinator: leadership of term %d lost (leader key changed)", self._term)
            self._term = None
        self._notify_leader_change()

    # ---------------------------------------------------------------- members

    async def register(self, member: Member) -> None:
        """Publish this node under its lease; re-published whenever a new lease is taken."""
        if member.name != self.name:
            raise ValueError(f"this coordinator is {self.name!r}; cannot register {member.name!r}")
        self._member, self._member_lease = member, None
        await self._ensure_lease()
        await self._ensure_member()

    async def _ensure_member(self) -> None:
        lease = self._lease
        if self._member is None or lease is None or self._member_lease == lease:
            return
        await self._gateway.call("/v3/kv/put", {"key": _b64(self._members_prefix + self._member.name),
                                                "value": _b64(self._member.to_json()), "lease": str(lease)})
        self._member_lease = lease

    async def members(self) -> list[Member]:
        data = await self._gateway.call("/v3/kv/range", {"key": _b64(self._members_prefix),
                                                         "range_end": _range_end(self._members_prefix)})
        return [Member.from_json(_unb64(kv.get("value", ""))) for kv in data.get("kvs", [])]

    # ---------------------------------------------------------------- records

    def _fenced(self, term: int, *requests: dict) -> dict:
        return {"compare": [{"key": _b64(self._leader_key), "target": "CREATE", "result": "EQUAL",
                             "create_revision": str(term)}], "success": list(requests)}

    async def _refuse(self, term: int) -> StaleTerm:
        current = await self.leader()
        now = f"the current leader is {current.name}, term {current.term}" if current else "there is no leader"
        return StaleTerm(f"term {term} is not current: {now}")

    async def put(self, key: str, value: str, term: int | None = None) -> int:
        """Write a record; with `term`, only while that term's leader key still exists. The revision."""
        request = {"key": _b64(self._records_prefix + check_key(key)), "value": _b64(value)}
        if term is None:
            return int((await self._gateway.call("/v3/kv/put", request))["header"]["revision"])
        return await self.append(term, [(key, value)], [])

    async def get(self, key: str) -> str | None:
        data = await self._gateway.call("/v3/kv/range", {"key": _b64(self._records_prefix + check_key(key))})
        kvs = data.get("kvs", [])
        return _unb64(kvs[0].get("value", "")) if kvs else None

    async def delete(self, key: str, term: int | None = None) -> bool:
        request = {"key": _b64(self._records_prefix + check_key(key))}
        if term is None:
            data = await self._gateway.call("/v3/kv/deleterange", request)
            return int(data.get("deleted", 0)) > 0
        data = await self._gateway.call("/v3/kv/txn", self._fenced(term, {"request_delete_range": request}))
        if not data.get("succeeded"):
            raise await self._refuse(term)
        return int(data["responses"][0]["response_delete_range"].get("deleted", 0)) > 0

    async def delete_range(self, start: str, end: str, term: int | None = None) -> int:
        """Delete every record with start <= key < end (one request; fenced by `term` when given); how many."""
        request = {"key": _b64(self._records_prefix + check_key(start)),
                   "range_end": _b64(self._records_prefix + check_key(end))}
        if term is None:
            return int((await self._gateway.call("/v3/kv/deleterange", request)).get("deleted", 0))
        data = await self._gateway.call("/v3/kv/txn", self._fenced(term, {"request_delete_range": request}))
        if not data.get("succeeded"):
            raise await self._refuse(term)
        return int(data["responses"][0]["response_delete_range"].get("deleted", 0))

    async def append(self, term: int, puts: list[tuple[str, str]], deletes: list[str]) -> int:
        """Puts and deletes in ONE txn, fenced by `term` (etcd's --max-txn-ops, 128 by default, bounds them)."""
        ops = [{"request_put": {"key": _b64(self._records_prefix + check_key(k)), "value": _b64(v)}} for k, v in puts]
        ops += [{"request_delete_range": {"key": _b64(self._records_prefix + check_key(k))}} for k in deletes]
        data = await self._gateway.call("/v3/kv/txn", self._fenced(term, *ops))
        if not data.get("succeeded"):
            raise await self._refuse(term)
        return int(data["header"]["revision"])

    async def compact(self, revision: int) -> None:
        """etcd's history before `revision` dropped (all keys'; the space is reused, `defragment` returns it)."""
        try:
            await self._gateway.call("/v3/kv/compaction", {"revision": str(revision)})
        except EtcdError as exc:
            if exc.code != 11:  # OutOfRange: compacted there already (another leader's snapshot)
                raise

    async def list(self, prefix: str = "") -> Listing:
        full = self._records_prefix + prefix
        data = await self._gateway.call("/v3/kv/range", {"key": _b64(full), "range_end": _range_end(full)})
        skip = len(self._records_prefix)
        items = {_unb64(kv["key"])[skip:]: _unb64(kv.get("value", "")) for kv in data.get("kvs", [])}
        return Listing(items, int(data["header"]["revision"]))

    async def watch(self, prefix: str = "", since: int | None = None) -> AsyncIterator[Change]:
        """Changes of records under `prefix` after revision `since` (default: from now). Survives etcd
        outages (reconnects every loop_wait and resumes where it stopped); ends when the coordinator closes."""
        if not self._tasks and not self._closed:
            raise CoordinatorError(f"etcd at {self._gateway.endpoint}: watch before start()")
        full = self._records_prefix + prefix
        skip = len(self._records_prefix)
        following = None if since is None else since + 1
        while not self._closed:
            request: dict[str, Any] = {"key": _b64(full), "range_end": _range_end(full)}
            if following is not None:
                request["start_revision"] = str(following)
            try:
                async for message in self._gateway.stream("/v3/watch", {"create_request": request}):
                    result = message.get("result", {})
                    if int(result.get("compact_revision", 0)) > 0:
                        raise WatchCompacted(f"etcd at {self._gateway.endpoint}: changes of {full} after revision "
                                             f"{following} were compacted (oldest kept: {result['compact_revision']})")
                    if following is None:
                        following = int(result["header"]["revision"]) + 1
                    for event in result.get("events", []):
                        kv = event["kv"]
                        deleted = event.get("type") == "DELETE"
                        change = Change(ChangeKind.DELETE if deleted else ChangeKind.PUT, _unb64(kv["key"])[skip:],
                                        None if deleted else _unb64(kv.get("value", "")), int(kv["mod_revision"]))
                        following = change.revision + 1
                        yield change
                continue  # the stream went quiet for `ttl` seconds: open it again at once, from `following`
            except CoordinatorUnavailable as exc:
                if not self._closed:
                    LOG.debug("coordinator: watch %s: %s", full, exc)
            if not self._closed:
                await asyncio.sleep(self.config.loop_wait)
