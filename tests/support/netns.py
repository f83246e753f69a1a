"""A mesh across network namespaces on one machine: each meshd (and etcd) in its own namespace with its own
address, joined by veth pairs to a bridge; partitions made by taking a namespace's link down or with `tc netem`.

The bridge lives in a hub namespace of its own, so nothing is added to the machine's own network: every address
(10.77.0.0/16) exists only inside the run's namespaces. Names carry a per-run suffix (`msh-{pid}-{random}-...`),
so two runs never collide; `Fabric.close()` kills what it started and deletes the namespaces (which removes
their veths and the bridge with them), and `sweep()` removes what a run that died (SIGKILL) left behind: the
namespaces whose pid is gone. Needs root and iproute2 (`ip`); `NetnsUnavailable` (one line) otherwise.

    with Fabric(4) as fab:              # namespaces 0..3; 0 holds etcd in NetnsMesh
        fab.popen(2, ["sleep", "1"])   # a process inside namespace 2
        fab.link_down(2); fab.link_up(2)
        fab.netem(2, loss=20, delay_ms=100); fab.clear_netem(2)

`NetnsMesh` is `cli/mesh_local.LocalMesh` with etcd in namespace 0 and meshd `n{i}` in namespace i, so the
benchmarks' code that drives a LocalMesh (benchmarks/failover.py's Bench) drives it unchanged.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from meshsched.cli.mesh_local import LocalMesh, MeshNode
from meshsched.daemon.etcd_local import ETCD, NO_ETCD

from tests.support.mesh import mesh_up

IP = shutil.which("ip")
PREFIX = "msh-"


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no `ip`, a kernel without netem): one line."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep() -> list[str]:
    """Delete the namespaces of runs whose process is gone (a run SIGKILLed before its cleanup); their names."""
    if IP is None:
        return []
    gone = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if name.startswith(PREFIX) and len(parts) >= 3 and parts[1].isdigit() and not _pid_alive(int(parts[1])):
            for pid in _ip("netns", "pids", name, check=False).stdout.split():
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid), 9)
            _ip("netns", "del", name, check=False)
            gone.append(name)
    return gone


def address(i: int) -> str:
    """Namespace i's address (10.77.0.10, 10.77.0.11, ...; up to 50,000 namespaces in the /16)."""
    return f"10.77.{(i + 10) // 250}.{(i + 10) % 250 + 1}"


@dataclass
class Fabric:
    """`count` namespaces on one bridge; `close()` (or leaving the `with`) removes everything."""

    count: int
    run: str = field(default_factory=lambda: f"{os.getpid()}-{secrets.token_hex(2)}")
    procs: list[subprocess.Popen] = field(default_factory=list)
    made: list[str] = field(default_factory=list)

    @property
    def hub(self) -> str:
        return f"{PREFIX}{self.run}-hub"

    def ns(self, i: int) -> str:
        return f"{PREFIX}{self.run}-{i}"

    def port(self, i: int) -> str:
        """The hub's end of namespace i's veth (15 characters at most: the pid and index keep it unique)."""
        return f"v{self.run.replace('-', '')[-9:]}x{i}"[:15]

    def __enter__(self) -> Fabric:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        if IP is None:
            raise NetnsUnavailable("no `ip` command (iproute2) to make network namespaces")
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root (CAP_NET_ADMIN)")
        sweep()
        self._add_ns(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for i in range(self.count):
            self._add_ns(self.ns(i))
            _ip("-n", self.hub, "link", "add", self.port(i), "type", "veth", "peer", "name", "eth0",
                "netns", self.ns(i))
            _ip("-n", self.hub, "link", "set", self.port(i), "master", "br0", "up")
            _ip("-n", self.ns(i), "addr", "add", f"{address(i)}/16", "dev", "eth0")
            _ip("-n", self.ns(i), "link", "set", "eth0", "up")
            _ip("-n", self.ns(i), "link", "set", "lo", "up")

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self.made.append(name)

    def popen(self, i: int, argv: list[str], **kw) -> subprocess.Popen:
        """`argv` inside namespace i (`ip netns exec` execs it: the Popen's pid is the command's own)."""
        proc = subprocess.Popen([IP, "netns", "exec", self.ns(i), *argv], **kw)
        self.procs.append(proc)
        return proc

    def run_in(self, i: int, argv: list[str], timeout: float = 10) -> subprocess.CompletedProcess:
        return subprocess.run([IP, "netns", "exec", self.ns(i), *argv], capture_output=True, text=True,
                              timeout=timeout, check=False)

    def link_down(self, i: int) -> None:
        """Cut namespace i off (its cable pulled at the bridge: the processes in it run on, unreachable)."""
        _ip("-n", self.hub, "link", "set", self.port(i), "down")

    def link_up(self, i: int) -> None:
        _ip("-n", self.hub, "link", "set", self.port(i), "up")

    def netem(self, i: int, loss: float = 0.0, delay_ms: float = 0.0) -> None:
        """Loss (percent) and delay on namespace i's outgoing packets (`tc qdisc ... netem`)."""
        tc = shutil.which("tc")
        argv = [tc or "tc", "qdisc", "replace", "dev", "eth0", "root", "netem", "delay", f"{delay_ms:g}ms",
                "loss", f"{loss:g}%"]
        done = self.run_in(i, argv) if tc else None
        if done is None or done.returncode != 0:
            why = "no `tc` command" if done is None else done.stderr.strip()
            raise NetnsUnavailable(f"tc netem cannot be applied here ({why}: the kernel needs sch_netem)")

    def clear_netem(self, i: int) -> None:
        self.run_in(i, ["tc", "qdisc", "del", "dev", "eth0", "root"])

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
        for name in reversed(self.made):
            for pid in _ip("netns", "pids", name, check=False).stdout.split():  # a job meshd left behind
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid), 9)
            _ip("netns", "del", name, check=False)
        self.made.clear()


class NetnsEtcd:
    """One etcd member inside a namespace, on the namespace's address (fixed ports: the namespace is private)."""

    def __init__(self, fabric: Fabric, i: int, root: Path) -> None:
        self.fabric, self.i, self.root = fabric, i, root
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{address(self.i)}:2379"

    @property
    def db(self) -> Path:
        """etcd's backend database file (its size is etcd's dbSize)."""
        return self.root / "data" / "member" / "snap" / "db"

    def start(self) -> None:
        peer = f"http://{address(self.i)}:2380"
        log = open(self.root / "etcd.log", "ab")
        self.proc = self.fabric.popen(
            self.i, [ETCD, "--name", "t", "--data-dir", str(self.root / "data"), "--listen-client-urls", self.url,
                     "--advertise-client-urls", self.url, "--listen-peer-urls", peer,
                     "--initial-advertise-peer-urls", peer, "--initial-cluster", f"t={peer}", "--logger", "zap",
                     "--log-level", "error"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        probe = (f"import urllib.request,sys; sys.exit(0 if b'\"true\"' in "
                 f"urllib.request.urlopen('{self.url}/health', timeout=1).read() else 1)")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}: {(self.root / 'etcd.log').read_text()}")
            if self.fabric.run_in(self.i, [sys.executable, "-c", probe]).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError("etcd did not become healthy in 20 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


@dataclass
class NetnsMesh(LocalMesh):
    """LocalMesh across namespaces: etcd in namespace 0, meshd `n{i}` in namespace i (address(i))."""

    fabric: Fabric | None = None
    where: dict[str, int] = field(default_factory=dict)  # node name -> its namespace

    def start(self) -> NetnsMesh:
        assert self.fabric is not None and self.fabric.count > self.nodes
        (self.root / "etcd").mkdir(parents=True, exist_ok=True)
        self.etcd = NetnsEtcd(self.fabric, 0, self.root / "etcd")
        self.etcd.start()
        for i in range(1, self.nodes + 1):
            self.members.append(self.make_node(i))
            self.launch(self.members[-1])
        return self

    def make_node(self, i: int, name: str | None = None) -> MeshNode:
        base = Path(tempfile.mkdtemp(prefix=f"mn{i}", dir="/tmp"))  # Unix socket paths stay short
        node = MeshNode(name or f"n{i}", base / "s", base / "r", base / "meshd.toml")
        self.where[node.name] = i
        third = self.ttl / 3
        node.config.write_text(
            f'node_name = "{node.name}"\nfake_gpus = {self.gpus}\npolicy = "{self.policy}"\n'
            f'kill_grace = 1.0\nnode_grace = {self.node_grace}\nmesh_address = "{address(i)}"\n'
            f'checkpoint_root = "{self.root / "checkpoints"}"\n'
            f'\n[coordinator]\nbackend = "etcd"\nendpoints = ["{self.etcd.url}"]\nttl = {self.ttl}\n'
            f"loop_wait = {third:g}\nretry_timeout = {third:g}\n")
        return node

    def index(self, node: MeshNode) -> int:
        """The namespace node runs in."""
        return self.where[node.name]

    def launch(self, node: MeshNode) -> None:
        log = open(node.config.parent / "meshd.log", "ab")
        node.proc = self.fabric.popen(
            self.index(node), [sys.executable, "-m", "meshsched.daemon.main", "--config", str(node.config),
                               "--state-dir", str(node.state), "--runtime-dir", str(node.runtime)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()


@contextlib.contextmanager
def netns_mesh(nodes: int, spare: int = 0, **kw) -> Iterator[NetnsMesh]:
    """`nodes` meshd + etcd in namespaces, each up, plus `spare` empty namespaces for nodes started later;
    everything removed afterwards. Raises NetnsUnavailable (one line) where namespaces or etcd are missing."""
    if ETCD is None:
        raise NetnsUnavailable(NO_ETCD)
    root = Path(tempfile.mkdtemp(prefix="netmesh"))
    with Fabric(nodes + 1 + spare) as fabric:
        with mesh_up(NetnsMesh(root, nodes=nodes, fabric=fabric, **kw)) as m:
            yield m


def can_reach(fabric: Fabric, i: int, url: str) -> bool:
    """Whether namespace i reaches url (an HTTP GET answered at all)."""
    code = f"import urllib.request; urllib.request.urlopen('{url}', timeout=1)"
    return fabric.run_in(i, [sys.executable, "-c", code]).returncode == 0
