"""systemd's notify protocol (READY=1, WATCHDOG=1, STOPPING=1) over $NOTIFY_SOCKET; a no-op without systemd."""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        self._addr = "\0" + addr[1:] if addr.startswith("@") else addr
        usec = env.get("WATCHDOG_USEC", "")
        self.watchdog_interval = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 else None
        self._sock: socket.socket | None = None
        if self._addr:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, message: str) -> None:
        if self._sock is not None:
            try:
                self._sock.sendto(message.encode(), self._addr)
            except OSError:
                pass

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
