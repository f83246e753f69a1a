"""A mesh on one machine: an etcd and N meshd processes on fake GPUs, each with its own state and runtime
dirs and a `[coordinator]` config naming the etcd (for tests and `benchmarks/failover.py`). It talks to them as
`mesh` does, through the CLI's client: meshd itself never imports the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from meshsched.cli.client import Client, DaemonUnavailable
from meshsched.daemon.etcd_local import EtcdServer, start_etcd


@dataclass
class MeshNode:
    name: str
    state: Path
    runtime: Path
    config: Path
    proc: subprocess.Popen | None = None

    @property
    def socket(self) -> Path:
        return self.runtime / "api.sock"


@dataclass
class LocalMesh:
    root: Path
    nodes: int = 3
    gpus: int = 4
    ttl: int = 3
    node_grace: float = 60.0
    policy: str = "sjf"
    cpus: tuple[int, ...] = ()  # each node's node_cpus, in order (default: the machine's, as meshd reads it)
    etcd: EtcdServer | None = None
    members: list[MeshNode] = field(default_factory=list)

    def start(self) -> LocalMesh:
        self.etcd = start_etcd(self.root)
        for i in range(1, self.nodes + 1):
            base = Path(tempfile.mkdtemp(prefix=f"mn{i}", dir="/tmp"))  # Unix socket paths stay short
            node = MeshNode(f"n{i}", base / "s", base / "r", base / "meshd.toml")
            node.config.write_text(
                f'node_name = "{node.name}"\nfake_gpus = {self.gpus}\npolicy = "{self.policy}"\n'
                f'kill_grace = 1.0\nnode_grace = {self.node_grace}\nmesh_address = "127.0.0.1"\n'
                f'checkpoint_root = "{self.root / "checkpoints"}"\n'
                f"\n[coordinator]\nbackend = \"etcd\"\n"
                f'endpoints = ["{self.etcd.url}"]\nttl = {self.ttl}\nloop_wait = {self.ttl / 3:g}\n'
                f"retry_timeout = {self.ttl / 3:g}\n")
            if i <= len(self.cpus):
                node.config.write_text(f"node_cpus = {self.cpus[i - 1]}\n" + node.config.read_text())
            self.members.append(node)
            self.launch(node)
        return self

    def launch(self, node: MeshNode) -> None:
        log = open(node.config.parent / "meshd.log", "ab")
        node.proc = subprocess.Popen(
            [sys.executable, "-m", "meshsched.daemon.main", "--config", str(node.config), "--state-dir",
             str(node.state), "--runtime-dir", str(node.runtime)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def client(self, node: MeshNode) -> Client:
        return Client(node.socket)

    def wait_up(self, node: MeshNode, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.client(node).call("GET", "/v1/health")["status"] == "running":
                    return
            except DaemonUnavailable:
                if node.proc is not None and node.proc.poll() is not None:
                    raise RuntimeError(f"meshd {node.name} exited: {self.log(node)[-2000:]}") from None
            time.sleep(0.05)
        raise RuntimeError(f"meshd {node.name} did not serve in {timeout:g} s")

    def log(self, node: MeshNode) -> str:
        return (node.config.parent / "meshd.log").read_text(errors="replace")

    def nodes_view(self, node: MeshNode) -> list[dict]:
        return self.client(node).call("GET", "/v1/nodes")

    def leader(self) -> MeshNode | None:
        """The node that says it leads (None while nobody does)."""
        for node in self.members:
            if node.proc is None or node.proc.poll() is not None:
                continue
            try:
                if self.nodes_view(node)[0].get("leader"):
                    return node
            except Exception:  # noqa: BLE001 - a node coming up or going down
                continue
        return None

    def kill(self, node: MeshNode) -> None:
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait(10)

    def stop(self) -> None:
        for node in self.members:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.terminate()
        for node in self.members:
            if node.proc is not None:
                try:
                    node.proc.wait(10)
                except subprocess.TimeoutExpired:
                    node.proc.kill()
        for node in self.members:  # jobs outlive meshd by design: stop what the test left running
            for pidfile in node.state.glob("jobs/*/supervisor.pid"):
                try:
                    os.killpg(int(pidfile.read_text().split()[0]), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        if self.etcd is not None:
            self.etcd.stop()
