"""The coordinator seam: LocalCoordinator, and EtcdCoordinator against a real etcd on loopback.

etcd runs as a child process on free loopback ports with its data in tmp_path and is killed at teardown.
Without the `etcd` binary the etcd tests are skipped with a reason that says how to install it (.ci/run
installs it, so they run in CI). Short leases (ttl 3 s, loop_wait 1 s, retry_timeout 1 s) keep this quick.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time

import pytest
from aiohttp import web
from meshsched.daemon.config import ConfigError, CoordinatorConfig
from meshsched.daemon.coordinator import (
    ChangeKind,
    CoordinatorError,
    CoordinatorUnavailable,
    LocalCoordinator,
    Member,
    StaleTerm,
    WatchCompacted,
)
from meshsched.daemon.coordinator_backends import open_coordinator
from meshsched.daemon.etcd import EtcdCoordinator, NotEtcd
from meshsched.daemon.etcd_local import ETCD, NO_ETCD, EtcdServer, free_port, start_etcd  # noqa: F401

needs_etcd = pytest.mark.skipif(ETCD is None, reason=NO_ETCD)
TTL, LOOP_WAIT, RETRY = 3, 1.0, 1.0


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    if ETCD is None:
        pytest.skip(NO_ETCD)
    server = start_etcd(tmp_path_factory.mktemp("etcd"))
    yield server
    server.stop()


@pytest.fixture
def own_etcd(tmp_path):
    if ETCD is None:
        pytest.skip(NO_ETCD)
    server = start_etcd(tmp_path)
    yield server
    server.stop()


def config(endpoint: str, prefix: str, **kw) -> CoordinatorConfig:
    return CoordinatorConfig(backend="etcd", endpoints=(endpoint,), ttl=TTL, loop_wait=LOOP_WAIT,
                             retry_timeout=RETRY, prefix=prefix, **kw)


@pytest.fixture
def prefix(request) -> str:
    return "/" + re.sub(r"\W", "_", request.node.name)


@pytest.fixture
async def coordinators():
    """make(endpoint, prefix, name) -> a started EtcdCoordinator, closed at teardown."""
    made: list[EtcdCoordinator] = []

    async def make(endpoint: str, prefix: str, name: str) -> EtcdCoordinator:
        coord = EtcdCoordinator(config(endpoint, prefix), name)
        made.append(coord)
        await coord.start()
        return coord

    yield make
    for coord in made:
        await coord.close()


class TcpProxy:
    """A loopback TCP relay to cut one node off etcd while the others still reach it, or to freeze its open
    connections (half-open, as behind a dead NAT entry) while new ones still pass."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.frozen: set[asyncio.StreamWriter] = set()
        self.hangs: set[asyncio.Future] = set()

    def freeze(self) -> None:
        self.frozen |= self.writers

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def heal(self) -> None:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def cut(self) -> None:
        self.server.close()
        for w in list(self.writers):
            w.transport.abort()
        for hang in self.hangs:
            hang.cancel()
        await self.server.wait_closed()

    async def _relay(self, reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self.writers |= {writer, up_writer}

        async def pipe(src, dst):
            try:
                while data := await src.read(65536):
                    if dst in self.frozen or writer in self.frozen:
                        hang = asyncio.get_running_loop().create_future()
                        self.hangs.add(hang)
                        await hang
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except asyncio.CancelledError:
            pass
        self.writers -= {writer, up_writer}


async def first_changes(watch, n: int, timeout: float = 10.0) -> list:
    async def take():
        got = []
        async for change in watch:
            got.append(change)
            if len(got) == n:
                return got
    return await asyncio.wait_for(take(), timeout)


# ---------------------------------------------------------------- configuration


def test_timing_rule_is_checked_with_one_clear_line():
    with pytest.raises(ConfigError) as err:
        EtcdCoordinator(CoordinatorConfig(backend="etcd", ttl=10, loop_wait=5, retry_timeout=5), "n1")
    assert str(err.value) == ("coordinator: loop_wait + 2 * retry_timeout must be <= ttl, "
                              "got 5 + 2 * 5 = 15 > 10")
    CoordinatorConfig(backend="etcd", ttl=30, loop_wait=10, retry_timeout=10).validate()  # Patroni's defaults


def test_config_from_mapping():
    cfg = CoordinatorConfig.from_mapping(
        {"backend": "etcd", "endpoints": "http://10.0.0.1:2379, http://10.0.0.2:2379/", "ttl": "12",
         "loop_wait": 4, "retry_timeout": "4", "prefix": "/mesh-a"}, "meshd.toml")
    assert cfg.endpoints == ("http://10.0.0.1:2379", "http://10.0.0.2:2379")
    assert (cfg.ttl, cfg.loop_wait, cfg.retry_timeout, cfg.prefix) == (12, 4.0, 4.0, "/mesh-a")
    bad = [({"backend": "zookeeper"}, "backend must be one of local, etcd"),
           ({"ttl": "2.5"}, "coordinator.ttl has a bad value"),
           ({"endpoints": "etcd:2379"}, "is not http(s)://HOST:PORT"),
           ({"prefix": "mesh/"}, "prefix must look like /name"),
           ({"ttl": 20, "loop_wait": 10, "retry_timeout": 10}, "must be <= ttl"),
           ({"tll": 3}, "unknown coordinator key 'tll'")]
    for values, message in bad:
        with pytest.raises(ConfigError, match=re.escape(message)) as err:
            CoordinatorConfig.from_mapping(values, "meshd.toml")
        assert str(err.value).startswith("meshd.toml: ")


def test_open_coordinator_picks_the_backend_by_name():
    assert isinstance(open_coordinator(CoordinatorConfig(), "n1"), LocalCoordinator)
    assert isinstance(open_coordinator(config("http://127.0.0.1:2379", "/m"), "n1"), EtcdCoordinator)


# ---------------------------------------------------------------- LocalCoordinator


async def test_local_coordinator_is_its_own_leader():
    seen = []
    coord = LocalCoordinator("n1", on_change=seen.append, initial={"jobs/1": "{}"})
    await coord.start()
    assert coord.term is None and await coord.leader() is None
    assert await coord.acquire_leadership() == 1
    assert await coord.renew_leadership() == 1 and coord.term == 1
    assert (await coord.leader()).name == "n1"
    assert await coord.is_current(1) and not await coord.is_current(0)
    await coord.register(Member("n1", "10.0.0.1:7070", ("V100",) * 8))
    assert await coord.members() == [Member("n1", "10.0.0.1:7070", ("V100",) * 8)]
    with pytest.raises(ValueError):
        await coord.register(Member("n2", "x", ()))
    assert (await coord.list("jobs/")).items == {"jobs/1": "{}"}
    await coord.put("jobs/2", "b", term=1)
    with pytest.raises(StaleTerm):
        await coord.put("jobs/3", "c", term=0)
    assert [(c.kind, c.key) for c in seen] == [(ChangeKind.PUT, "jobs/2")]
    await coord.release_leadership()
    assert await coord.acquire_leadership() == 2  # a new leadership never reuses a term
    with pytest.raises(StaleTerm):
        await coord.delete("jobs/2", term=1)
    with pytest.raises(ValueError, match="bad record key"):
        await coord.put("/abs", "x")
    await coord.close()
    assert coord.term is None and await coord.members() == []


async def test_local_watch_reports_a_gap_it_cannot_replay():
    coord = LocalCoordinator("n1", history=2)
    since = (await coord.list()).revision
    for i in range(3):
        await coord.put(f"k{i}", "v")
    with pytest.raises(WatchCompacted):
        await first_changes(coord.watch("", since=since), 1)
    assert [c.key for c in await first_changes(coord.watch("", since=since + 1), 2)] == ["k1", "k2"]
    await coord.close()


# ---------------------------------------------------------------- both backends


@pytest.fixture(params=["local", "etcd"])
async def backend(request, prefix):
    if request.param == "local":
        coord = LocalCoordinator("n1")
    else:
        server = request.getfixturevalue("etcd")
        coord = EtcdCoordinator(config(server.url, prefix), "n1")
    await coord.start()
    yield coord
    await coord.close()


async def test_records_put_get_list_delete_watch(backend):
    coord = backend
    start = await coord.list()
    assert start.items == {}
    watch = coord.watch("jobs/", since=start.revision)
    r1 = await coord.put("jobs/1", '{"state":"PENDING"}')
    await coord.put("decisions/1", "start jobs/1 on n1")
    r2 = await coord.put("jobs/1", '{"state":"RUNNING"}')
    await coord.put("jobs/2", "x")
    assert await coord.delete("jobs/2") and not await coord.delete("jobs/2")
    assert r2 > r1
    assert await coord.get("jobs/1") == '{"state":"RUNNING"}' and await coord.get("jobs/2") is None
    listing = await coord.list("jobs/")
    assert listing.items == {"jobs/1": '{"state":"RUNNING"}'} and listing.revision >= r2
    assert (await coord.list()).items.keys() == {"jobs/1", "decisions/1"}
    changes = await first_changes(watch, 4)
    assert [(c.kind, c.key, c.value) for c in changes] == [
        (ChangeKind.PUT, "jobs/1", '{"state":"PENDING"}'), (ChangeKind.PUT, "jobs/1", '{"state":"RUNNING"}'),
        (ChangeKind.PUT, "jobs/2", "x"), (ChangeKind.DELETE, "jobs/2", None)]
    assert changes[0].revision == r1 and changes[1].revision == r2
    await watch.aclose()
    live = coord.watch("jobs/")  # from now on: only what comes after
    task = asyncio.ensure_future(first_changes(live, 1))
    await asyncio.sleep(0.3)  # let the watch be set up before the write it must see
    await coord.put("jobs/3", "new")
    assert [(c.key, c.value) for c in await task] == [("jobs/3", "new")]


async def test_fenced_writes(backend):
    coord = backend
    term = await coord.acquire_leadership()
    assert term is not None and coord.term == term
    await coord.put("decisions/1", "d", term=term)
    with pytest.raises(StaleTerm, match=f"term {term - 1} is not current"):
        await coord.put("decisions/2", "d", term=term - 1)
    assert await coord.get("decisions/2") is None
    await coord.release_leadership()
    assert coord.term is None and await coord.leader() is None
    with pytest.raises(StaleTerm):
        await coord.delete("decisions/1", term=term)
    assert await coord.get("decisions/1") == "d"


# ---------------------------------------------------------------- etcd


@needs_etcd
@pytest.mark.slow
async def test_election_among_three(etcd, prefix, coordinators):
    nodes = [await coordinators(etcd.url, prefix, f"n{i}") for i in range(3)]
    for i, node in enumerate(nodes):
        await node.register(Member(node.name, f"10.0.0.{i}:7070", ("A100",) * (i + 1)))
    terms = await asyncio.gather(*(n.acquire_leadership() for n in nodes))
    winners = [n for n, t in zip(nodes, terms) if t is not None]
    assert len(winners) == 1
    leader = await nodes[0].leader()
    assert leader.name == winners[0].name and leader.term == winners[0].term
    for node in nodes:
        assert await node.leader() == leader
        assert await node.is_current(leader.term) and not await node.is_current(leader.term - 1)
        assert await node.acquire_leadership() == (leader.term if node is winners[0] else None)
    await asyncio.sleep(TTL + LOOP_WAIT)  # longer than a lease: keepalives hold leadership and membership
    assert winners[0].term == leader.term and await winners[0].renew_leadership() == leader.term
    assert [await n.acquire_leadership() for n in nodes if n is not winners[0]] == [None, None]
    members = await nodes[1].members()
    assert [(m.name, m.address, len(m.gpus)) for m in members] == [
        ("n0", "10.0.0.0:7070", 1), ("n1", "10.0.0.1:7070", 2), ("n2", "10.0.0.2:7070", 3)]


@needs_etcd
@pytest.mark.slow
async def test_cut_off_leader_steps_down_before_another_takes_over(etcd, prefix, coordinators):
    proxy = TcpProxy(etcd.client_port)
    await proxy.heal()
    old = await coordinators(proxy.url, prefix, "old")
    others = [await coordinators(etcd.url, prefix, f"n{i}") for i in range(2)]
    old_term = await old.acquire_leadership()
    assert old_term is not None and all([await o.acquire_leadership() is None for o in others])
    seen = []

    async def consume():  # old's watch, through the proxy: it must resume where it stopped, not at "now"
        async for change in old.watch("decisions/"):
            seen.append((change.key, change.value))

    consumer = asyncio.ensure_future(consume())
    await asyncio.sleep(0.3)
    await old.put("decisions/1", "from old", term=old_term)

    await proxy.cut()  # old can no longer keep its lease alive; it does not know whether anyone took over
    cut_at = time.monotonic()
    stepped_down_at = None

    async def follower(node: EtcdCoordinator) -> EtcdCoordinator:
        while await node.acquire_leadership() is None:
            await node.wait_leader_change(LOOP_WAIT)
        assert old.term is None, "two leaders at once"
        return node

    async def watch_old():
        nonlocal stepped_down_at
        while old.term is not None:
            await asyncio.sleep(0.05)
        stepped_down_at = time.monotonic()

    watcher = asyncio.ensure_future(watch_old())
    done, pending = await asyncio.wait([asyncio.ensure_future(follower(o)) for o in others],
                                       timeout=TTL + LOOP_WAIT + 5, return_when=asyncio.FIRST_COMPLETED)
    takeover = time.monotonic() - cut_at
    for task in pending:
        task.cancel()
    assert done, f"no takeover within {TTL + LOOP_WAIT + 5} s"
    new = done.pop().result()
    await asyncio.wait_for(watcher, 1)
    assert takeover <= TTL + LOOP_WAIT, f"takeover took {takeover:.1f} s > ttl + loop_wait"
    assert stepped_down_at - cut_at <= TTL + 0.2  # the lease it last renewed before the cut ran out by then
    new_term = new.term
    assert new_term > old_term
    assert not await new.is_current(old_term) and await new.is_current(new_term)

    await new.put("decisions/2", "from new", term=new_term)

    await proxy.heal()  # the deposed leader comes back: its term is refused everywhere
    with pytest.raises(StaleTerm, match=f"current leader is {new.name}, term {new_term}"):
        await old.put("decisions/3", "from old", term=old_term)
    assert await old.acquire_leadership() is None
    assert (await old.list("decisions/")).items == {"decisions/1": "from old", "decisions/2": "from new"}
    deadline = time.monotonic() + 10
    while len(seen) < 2:
        assert time.monotonic() < deadline, f"old's watch did not resume: {seen}"
        await asyncio.sleep(0.1)
    assert seen == [("decisions/1", "from old"), ("decisions/2", "from new")]
    consumer.cancel()
    await proxy.cut()


@needs_etcd
@pytest.mark.slow
async def test_crashed_leader_is_replaced_and_members_follow_their_leases(etcd, prefix, coordinators):
    a, b, c = [await coordinators(etcd.url, prefix, n) for n in ("a", "b", "c")]
    for node in (a, b, c):
        await node.register(Member(node.name, f"{node.name}:7070", ("V100",)))
    term = await a.acquire_leadership()
    assert term is not None

    await c.close()  # a clean stop hands its lease back: c is gone at once
    assert [m.name for m in await a.members()] == ["a", "b"]

    await a.close(release=False)  # as a crash: nothing handed back, the lease runs out
    closed_at = time.monotonic()
    assert [m.name for m in await b.members()] == ["a", "b"]
    assert (await b.leader()).name == "a"
    while await b.acquire_leadership() is None:
        assert time.monotonic() - closed_at < TTL + LOOP_WAIT + 5, "b never took over"
        await b.wait_leader_change(LOOP_WAIT)
    took = time.monotonic() - closed_at
    assert took <= TTL + LOOP_WAIT, f"takeover took {took:.1f} s > ttl + loop_wait"
    assert b.term > term and await b.leader() == type(await b.leader())("b", b.term)
    assert [m.name for m in await b.members()] == ["b"]


@needs_etcd
@pytest.mark.slow
async def test_etcd_down_then_back(own_etcd, prefix, coordinators):
    errors = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
    a = await coordinators(own_etcd.url, prefix, "a")
    b = await coordinators(own_etcd.url, prefix, "b")
    await a.register(Member("a", "a:7070", ("V100",)))
    term = await a.acquire_leadership()
    assert term is not None
    seen = []

    async def consume():
        async for change in a.watch("jobs/"):
            seen.append((change.key, change.value))

    consumer = asyncio.ensure_future(consume())
    await asyncio.sleep(0.3)  # the watch is set up
    await a.put("jobs/1", "before")

    own_etcd.stop()
    stopped_at = time.monotonic()
    while a.term is not None:  # the leader reports the loss by the time its lease could have expired
        assert time.monotonic() - stopped_at <= TTL + 0.5
        await asyncio.sleep(0.05)
    assert await a.renew_leadership() is None and await a.acquire_leadership() is None
    with pytest.raises(CoordinatorUnavailable) as err:
        await a.put("jobs/2", "during")
    assert str(err.value) == f"etcd at {own_etcd.url} does not answer: connection refused (tried for 1 s)"

    late = EtcdCoordinator(config(own_etcd.url, prefix), "late")
    with pytest.raises(CoordinatorUnavailable):  # a node starting while etcd is down hears one line ...
        await late.start()

    own_etcd.start()  # same ports, same data
    await late.start()  # ... and may start again once it is back
    await late.close()
    await b.put("jobs/3", "after")  # most likely before a's watch is back: it must resume, not restart at "now"
    deadline = time.monotonic() + 20
    while not any([await a.acquire_leadership(), await b.acquire_leadership()]):
        assert time.monotonic() < deadline, "nobody leads again after etcd came back"
        await asyncio.sleep(0.2)
    leader = a if a.term is not None else b
    assert leader.term >= term
    await leader.put("jobs/4", "fenced", term=leader.term)
    while len(seen) < 3:
        assert time.monotonic() < deadline + 10, f"the watch did not resume: {seen}"
        await asyncio.sleep(0.1)
    assert seen == [("jobs/1", "before"), ("jobs/3", "after"), ("jobs/4", "fenced")]
    assert [m.name for m in await b.members()] == ["a"]
    assert not consumer.done() and all(not t.done() for t in a._tasks + b._tasks)
    consumer.cancel()
    assert errors == []


@needs_etcd
async def test_lease_lost_in_etcd_means_new_lease_and_member_again(etcd, prefix, coordinators):
    a = await coordinators(etcd.url, prefix, "a")
    await a.register(Member("a", "a:7070", ()))
    term = await a.acquire_leadership()
    # an operator (or an etcd restore) drops a's lease: the leader key and the member entry go with it
    await a._gateway.call("/v3/lease/revoke", {"ID": str(a._lease)})
    assert await a.leader() is None and await a.members() == []
    assert await a.renew_leadership() is None and a.term is None
    deadline = time.monotonic() + LOOP_WAIT + RETRY + 2
    while [m.name for m in await a.members()] != ["a"]:  # the keepalive finds out, takes a lease, registers
        assert time.monotonic() < deadline, "a did not register again under a new lease"
        await asyncio.sleep(0.1)
    assert await a.acquire_leadership() > term


# ---------------------------------------------------------------- bad endpoints


async def test_endpoint_that_does_not_answer():
    refused = f"http://127.0.0.1:{free_port()}"
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (kernel backlog) but never answers
    mute = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        for endpoint, why in ((refused, "connection refused"), (mute, "timed out")):
            coord = EtcdCoordinator(config(endpoint, "/m"), "n1")
            started = time.monotonic()
            with pytest.raises(CoordinatorUnavailable) as err:
                await coord.start()
            assert time.monotonic() - started < RETRY + 2
            assert str(err.value) == f"etcd at {endpoint} does not answer: {why} (tried for 1 s)"
            assert coord.term is None and await coord.acquire_leadership() is None
            await coord.close()
    finally:
        silent.close()


@pytest.fixture
async def not_etcd():
    """An HTTP server that is not etcd: an HTML 404 everywhere, HTML on /version under /html."""

    async def handler(request: web.Request) -> web.Response:
        if request.path.startswith("/html"):
            return web.Response(text="<html><body>Welcome to nginx!</body></html>", content_type="text/html")
        if request.path.startswith("/json"):
            return web.json_response({"status": "ok"})
        return web.Response(status=404, text="<html><h1>404 Not Found</h1></html>", content_type="text/html")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_endpoint_that_is_not_etcd(not_etcd):
    coord = EtcdCoordinator(config(not_etcd, "/m"), "n1")
    with pytest.raises(NotEtcd) as err:
        await coord.start()
    assert str(err.value) == (f"{not_etcd} is not etcd: /version answered HTTP 404 text/html "
                              "('<html><h1>404 Not Found</h1></html>'), not etcd's JSON")
    assert isinstance(err.value, CoordinatorError)
    # a page that answers 200 with HTML, or JSON that is not etcd's, is refused just as clearly
    from meshsched.daemon.etcd import Gateway

    for base, message in ((f"{not_etcd}/html", "answered HTTP 200 text/html"),
                          (f"{not_etcd}/json", "answered JSON without 'etcdserver'")):
        with pytest.raises(NotEtcd, match=re.escape(message)) as err:
            await Gateway((base,), RETRY, idle=TTL).open()
        assert "\n" not in str(err.value)


async def test_wait_leader_change_can_be_cancelled_as_the_change_lands():
    """A follower loop cancelled just as the leader key changes must stop, not go on to acquire leadership
    (asyncio.wait_for on Python 3.11 can swallow that cancellation)."""
    coord = LocalCoordinator("n1")
    for _ in range(20):
        waiter = asyncio.ensure_future(coord.wait_leader_change(10))
        await asyncio.sleep(0)
        await coord.acquire_leadership() if coord.term is None else await coord.release_leadership()
        waiter.cancel()  # the wait is woken up and cancelled in the same turn of the loop
        with pytest.raises(asyncio.CancelledError):
            await waiter


async def test_close_ends_watches(backend):
    seen = []

    async def consume():
        async for change in backend.watch():
            seen.append(change.key)

    consumer = asyncio.ensure_future(consume())
    await asyncio.sleep(0.3)
    await backend.put("jobs/1", "x")
    while not seen:
        await asyncio.sleep(0.05)
    await backend.close()
    await asyncio.wait_for(consumer, 5)  # ends quietly: no error, no hang
    assert seen == ["jobs/1"]


@needs_etcd
@pytest.mark.slow
async def test_watch_through_a_half_open_connection_reopens(etcd, prefix, coordinators):
    """A watch whose connection silently stops (no FIN, no RST) is re-opened after ttl of silence, from
    where it stopped: nothing is lost and nothing hangs."""
    proxy = TcpProxy(etcd.client_port)
    await proxy.heal()
    reader = await coordinators(proxy.url, prefix, "reader")
    writer = await coordinators(etcd.url, prefix, "writer")
    seen = []

    async def consume():
        async for change in reader.watch("jobs/"):
            seen.append(change.key)

    consumer = asyncio.ensure_future(consume())
    await asyncio.sleep(0.3)
    await writer.put("jobs/1", "x")
    while not seen:
        await asyncio.sleep(0.05)
    proxy.freeze()  # every connection open now goes silent, the watch's among them
    await writer.put("jobs/2", "x")
    await writer.put("jobs/3", "x")
    deadline = time.monotonic() + TTL + 5
    while len(seen) < 3:
        assert time.monotonic() < deadline, f"the watch hung on its dead connection: {seen}"
        await asyncio.sleep(0.1)
    assert seen == ["jobs/1", "jobs/2", "jobs/3"]
    assert await reader.get("jobs/3") == "x"  # calls get past the frozen pooled connections too
    consumer.cancel()
    await proxy.cut()


@needs_etcd
@pytest.mark.slow
async def test_release_while_cut_off_still_frees_leadership(etcd, prefix, coordinators):
    """A leader that steps down while etcd does not answer must not leave its key behind under a lease
    its keepalive goes on renewing once etcd answers again: nobody else could ever lead."""
    proxy = TcpProxy(etcd.client_port)
    await proxy.heal()
    a = await coordinators(proxy.url, prefix, "a")
    b = await coordinators(etcd.url, prefix, "b")
    await a.register(Member("a", "a:7070", ()))
    term = await a.acquire_leadership()
    assert term is not None
    await proxy.cut()
    await a.release_leadership()  # does not raise; etcd did not hear it
    assert a.term is None
    await proxy.heal()
    released_at = time.monotonic()
    while await b.acquire_leadership() is None:
        assert time.monotonic() - released_at < TTL + LOOP_WAIT + 3, "a's key outlived its release"
        await b.wait_leader_change(LOOP_WAIT)
    assert b.term > term
    deadline = time.monotonic() + LOOP_WAIT + RETRY + 2
    while "a" not in [m.name for m in await b.members()]:  # a stays a member, under a new lease
        assert time.monotonic() < deadline, "a did not register again"
        await asyncio.sleep(0.1)
    await proxy.cut()
