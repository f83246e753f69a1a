"""A throwaway one-member etcd on loopback (free ports, data in a given dir): for the tests and benchmarks
that run many meshd daemons on one machine. Needs the `etcd` binary (Debian: `apt-get install etcd-server`).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ETCD = shutil.which("etcd")
NO_ETCD = "etcd is not installed: `apt-get install etcd-server` (Debian/Ubuntu; .ci/run does it)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    """One etcd member on loopback; stop() and start() again keep its ports and data."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.client_port, self.peer_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = open(self.root / "etcd.log", "ab")
        self.proc = subprocess.Popen(
            [ETCD, "--name", "t", "--data-dir", str(self.root / "data"),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", f"t={peer}",
             "--logger", "zap", "--log-level", "error"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}: {(self.root / 'etcd.log').read_text()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
                    if b'"true"' in resp.read():
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("etcd did not become healthy in 20 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def start_etcd(root: Path) -> EtcdServer:
    for _ in range(3):  # a free port can be taken between free_port() and etcd's bind: try new ones
        server = EtcdServer(root)
        try:
            server.start()
            return server
        except RuntimeError:
            server.stop()
            shutil.rmtree(root / "data", ignore_errors=True)
    raise RuntimeError("etcd would not start")
