"""A small blocking client for meshd's HTTP API over its Unix socket (stdlib http.client: fast start-up)."""

from __future__ import annotations

import http.client
import json
import os
import socket
from pathlib import Path
from typing import Any

from meshsched.daemon.config import default_runtime_dir


class DaemonUnavailable(ConnectionError):
    """No meshd answers on the socket."""


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class DaemonForbidden(ApiError):
    """The API socket exists but this user may not connect to it (the CLI prints the one line)."""


def default_socket() -> Path:
    """$MESH_API_SOCKET, else the API socket in meshd's default runtime dir ($MESHD_RUNTIME_DIR honoured)."""
    env = os.environ
    if env.get("MESH_API_SOCKET"):
        return Path(env["MESH_API_SOCKET"])
    runtime = Path(env["MESHD_RUNTIME_DIR"]) if env.get("MESHD_RUNTIME_DIR") else default_runtime_dir(env)
    return runtime / "api.sock"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("meshd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        owner = os.lstat(self._path).st_uid  # FileNotFoundError: no daemon
        if owner not in (os.geteuid(), 0):  # someone else's socket may serve fake answers
            raise DaemonForbidden(403, f"{self._path} belongs to uid {owner}, neither you nor root; not using it")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class Client:
    def __init__(self, path: Path | None = None, timeout: float = 10.0) -> None:
        self.path = path or default_socket()
        self.timeout = timeout

    def raw(self, method: str, url: str, body: Any = None) -> tuple[int, dict[str, str], bytes]:
        conn = _UnixConnection(str(self.path), self.timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, url, body=data, headers=headers)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonUnavailable(str(exc)) from None
        except PermissionError:
            raise DaemonForbidden(
                403, f"permission denied on {self.path}: meshd serves only its own user there "
                "(run mesh as that user, or ask its operator)"
            ) from None
        except TimeoutError:
            raise ApiError(504, f"meshd did not answer on {self.path} within {self.timeout:g} s") from None
        finally:
            conn.close()

    def call(self, method: str, url: str, body: Any = None) -> Any:
        status, _, data = self.raw(method, url, body)
        try:
            payload = json.loads(data) if data else None
        except ValueError:
            payload = {"error": data.decode(errors="replace")}
        if status >= 400:
            msg = payload.get("error") if isinstance(payload, dict) else None
            raise ApiError(status, msg or f"meshd answered HTTP {status}")
        return payload
