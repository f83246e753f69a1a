"""A small blocking client for meshd's HTTP API over its Unix socket.

HTTP/1.1 by hand on a plain socket (one request per connection, `Connection: close`): `http.client` pulls
in the email package, which costs more start-up time than a whole `mesh ls` may take.
"""

from __future__ import annotations

import os

try:  # the C module behind `socket`: the same calls, without socket.py's 2 ms of enum set-up at import
    import _socket as socket
except ImportError:  # an interpreter without it
    import socket

SOCKET_HELP = "point mesh at a running one: MESH_API_SOCKET=RUNTIME_DIR/api.sock or MESHD_RUNTIME_DIR=RUNTIME_DIR"
SERVICE_HELP = "is its service up? `systemctl status meshd` (its log: `journalctl -u meshd`)"
RECONNECT_SECONDS = 60.0  # how long `--wait`, `logs -f` and `top` wait for a meshd that went away to come back


class DaemonUnavailable(ConnectionError):
    """No meshd answers on the socket."""


class DaemonGone(DaemonUnavailable):
    """meshd went away during a command that rides through restarts, and did not come back in time."""


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class DaemonForbidden(ApiError):
    """The API socket exists but this user may not (or should not) use it (the CLI prints the one line)."""


def default_socket(env: dict[str, str] | None = None) -> str:
    """$MESH_API_SOCKET, else api.sock in $MESHD_RUNTIME_DIR, else in meshd's default runtime dir.

    The default mirrors meshd's (daemon/config.py, `default_runtime_dir`): /run/meshsched as root, else
    $XDG_RUNTIME_DIR/meshsched, else /tmp/meshsched-$UID. Kept here, not imported: importing the daemon's
    configuration module costs the CLI more than its whole request (a test checks the two agree)."""
    env = os.environ if env is None else env
    if env.get("MESH_API_SOCKET"):
        return env["MESH_API_SOCKET"]
    if env.get("MESHD_RUNTIME_DIR"):
        runtime = env["MESHD_RUNTIME_DIR"]
    elif os.geteuid() == 0:
        runtime = "/run/meshsched"
    elif env.get("XDG_RUNTIME_DIR"):
        runtime = os.path.join(env["XDG_RUNTIME_DIR"], "meshsched")
    else:
        runtime = f"/tmp/meshsched-{os.getuid()}"
    return os.path.join(runtime, "api.sock")


class Client:
    def __init__(self, path: str | os.PathLike | None = None, timeout: float = 10.0) -> None:
        self.path = os.fspath(path) if path is not None else default_socket()
        self.timeout = timeout

    def raw(self, method: str, url: str, body: object = None) -> tuple[int, dict[str, str], bytes]:
        """One request; returns (status, headers with lower-case names, body)."""
        if body is None:
            data = b""
        else:
            from meshsched.cli.jsonc import dumps  # here: a GET whose JSON is passed through never needs it

            data = dumps(body).encode()
        head = f"{method} {url} HTTP/1.1\r\nHost: meshd\r\nConnection: close\r\nContent-Length: {len(data)}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            try:
                owner = os.lstat(self.path).st_uid
                if owner not in (os.geteuid(), 0):  # someone else's socket may serve fake answers
                    raise DaemonForbidden(403, f"{self.path} belongs to uid {owner}, neither you nor root; not using it")
                sock.connect(self.path)
            except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as exc:
                raise DaemonUnavailable(exc.strerror or str(exc)) from None
            except PermissionError:
                raise DaemonForbidden(
                    403, f"permission denied on {self.path}: meshd serves only its own user there "
                    "(run mesh as that user, or ask its operator)"
                ) from None
            try:
                sock.sendall(head.encode() + b"\r\n" + data)
                return _read_response(sock)
            except TimeoutError:
                raise ApiError(504, f"meshd did not answer on {self.path} within {self.timeout:g} s") from None
            except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError) as exc:  # meshd went mid-answer
                raise DaemonUnavailable(f"the connection was lost: {exc.strerror or exc}") from None
        finally:
            sock.close()

    def call(self, method: str, url: str, body: object = None) -> object:
        """One request; the decoded JSON answer, or ApiError with meshd's message."""
        return decode(*self.raw(method, url, body))


def decode(status: int, headers: dict[str, str], data: bytes) -> object:
    """An answer's JSON, or the ApiError an error answer means."""
    from meshsched.cli.jsonc import loads  # json's C scanner without `import json` (its re: ~5 ms)

    if status >= 400:
        raise error_of(status, data)
    try:
        return loads(data) if data else None
    except ValueError:
        raise ApiError(status, f"meshd answered something that is not JSON: {data[:80]!r}") from None


class Riding:
    """A client that rides through a restart of meshd (an upgrade, systemd's Restart=): a request that finds no
    meshd (refused, reset, closed, socket missing) is tried again until meshd answers or `within` seconds
    passed (then DaemonGone), with one notice on stderr when it went and one when it is back. Only once meshd
    has answered (`contacted`): a first request that finds none fails at once, as with a plain Client. For
    requests that may be repeated (reads, long-poll waits), never for a submit."""

    def __init__(self, client: Client, within: float = RECONNECT_SECONDS, contacted: bool = False) -> None:
        self.client, self.within, self.contacted = client, within, contacted
        self.path = client.path

    def raw(self, method: str, url: str, body: object = None) -> tuple[int, dict[str, str], bytes]:
        import time

        gone_at, pause = None, 0.1
        while True:
            try:
                answer = self.client.raw(method, url, body)
            except DaemonUnavailable as exc:
                if not self.contacted:
                    raise
                now = time.monotonic()
                if gone_at is None and self.within > 0:
                    gone_at = now
                    _notice(f"meshd went away ({exc}); reconnecting for up to {self.within:g} s ...")
                if gone_at is None or now - gone_at >= self.within:
                    raise DaemonGone(f"meshd at {self.path} went away and did not come back within "
                                     f"{self.within:g} s ({exc}); {SERVICE_HELP}") from None
                time.sleep(min(pause, gone_at + self.within - now))
                pause = min(1.0, pause * 2)
                continue
            self.contacted = True
            if gone_at is not None:
                _notice("reconnected to meshd")
            return answer

    def call(self, method: str, url: str, body: object = None) -> object:
        return decode(*self.raw(method, url, body))


def _notice(text: str) -> None:
    import sys

    sys.stderr.write(f"mesh: {text}\n")
    sys.stderr.flush()


def error_of(status: int, data: bytes) -> ApiError:
    """The ApiError an error answer means (meshd's errors are JSON {"error": "..."})."""
    from meshsched.cli.jsonc import loads

    try:
        payload = loads(data)
    except ValueError:
        payload = None
    msg = payload.get("error") if isinstance(payload, dict) else None
    return ApiError(status, msg or f"meshd answered HTTP {status}")


def _read_response(sock) -> tuple[int, dict[str, str], bytes]:
    buf = bytearray()
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise DaemonUnavailable("meshd closed the connection without an answer")
        buf += chunk
    end = buf.index(b"\r\n\r\n")
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    body = buf[end + 4 :]
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        raise DaemonUnavailable(f"not an HTTP answer: {lines[0][:80]!r}") from None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length")
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    while length is None or len(body) < int(length):
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        body += chunk
    if chunked:
        body = _dechunk(bytes(body))
    return status, headers, bytes(body)


def _dechunk(data: bytes) -> bytes:
    out, pos = bytearray(), 0
    while True:
        eol = data.index(b"\r\n", pos)
        size = int(data[pos:eol].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[eol + 2 : eol + 2 + size]
        pos = eol + 4 + size
