"""A partition between one meshd and etcd without killing anything: each meshd reaches etcd through its own
loopback TCP proxy (`StallProxy`, running in a thread), which can black-hole its traffic (`stall`: connections are
accepted, nothing passes either way, as behind a dead link) and let it through again (`heal`)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from meshsched.cli.mesh_local import LocalMesh, MeshNode
from meshsched.daemon.etcd_local import ETCD, NO_ETCD, free_port

from tests.support.mesh import mesh_up


class StallProxy:
    """127.0.0.1:port -> 127.0.0.1:upstream. stall(): every byte either way is dropped (connections stay open, so
    the client hangs until its own timeout); heal(): the stalled connections are cut (their streams lost bytes)
    and new ones pass again."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.port = free_port()
        self.stalled = False
        self._conns: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name=f"proxy-{self.port}")
        self._thread.start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._relay, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_writer = None
        self._conns.add(writer)
        try:
            if self.stalled:  # a new connection during the partition: accepted, never answered
                while await reader.read(65536):
                    pass
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
            self._conns.add(up_writer)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except OSError:
            pass
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    self._conns.discard(w)
                    w.transport.abort()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                if self.stalled:
                    continue  # dropped
                dst.write(data)
                await dst.drain()
        finally:
            dst.transport.abort()

    def stall(self) -> None:
        self.stalled = True

    def heal(self) -> None:
        def cut() -> None:
            self.stalled = False
            for w in list(self._conns):
                w.transport.abort()

        self._loop.call_soon_threadsafe(cut)

    def close(self) -> None:
        def stop() -> None:
            self._server.close()
            for w in list(self._conns):
                w.transport.abort()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(10)


class ProxiedMesh(LocalMesh):
    """A LocalMesh whose every meshd reaches etcd through its own StallProxy (`proxies[node.name]`)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.proxies: dict[str, StallProxy] = {}

    def launch(self, node: MeshNode) -> None:
        if node.name not in self.proxies:
            proxy = self.proxies[node.name] = StallProxy(self.etcd.client_port)
            text = node.config.read_text()
            node.config.write_text(re.sub(r'endpoints = \["[^"]*"\]', f'endpoints = ["{proxy.url}"]', text))
        super().launch(node)

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            for proxy in self.proxies.values():
                proxy.close()


@contextlib.contextmanager
def proxied_mesh(nodes: int, prefix: str = "meshpx", **kw) -> Iterator[ProxiedMesh]:
    """`nodes` meshd over a real etcd, each through its own proxy, each up (skips where etcd is not installed)."""
    if ETCD is None:
        pytest.skip(NO_ETCD)
    with mesh_up(ProxiedMesh(Path(tempfile.mkdtemp(prefix=prefix)), nodes=nodes, **kw)) as m:
        yield m
