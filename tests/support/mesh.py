"""A started LocalMesh (etcd and meshd processes) for the mesh tests, stopped and removed afterwards."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from meshsched.cli.mesh_local import LocalMesh
from meshsched.daemon.etcd_local import ETCD, NO_ETCD

from tests.support.daemon import remove

M = TypeVar("M", bound=LocalMesh)


@contextlib.contextmanager
def local_mesh(nodes: int, prefix: str = "mesh", **kw) -> Iterator[LocalMesh]:
    """`nodes` meshd over a real etcd, each up (skips where etcd is not installed); `kw`: LocalMesh's settings."""
    if ETCD is None:
        pytest.skip(NO_ETCD)
    with mesh_up(LocalMesh(Path(tempfile.mkdtemp(prefix=prefix)), nodes=nodes, **kw)) as m:
        yield m


@contextlib.contextmanager
def mesh_up(m: M) -> Iterator[M]:
    """Start `m` (a LocalMesh or a subclass), wait until each meshd is up; stop it and remove its folders after."""
    try:
        m.start()
        for node in m.members:
            m.wait_up(node)
        yield m
    finally:
        m.stop()
        remove(m.root, *(n.config.parent for n in m.members))
