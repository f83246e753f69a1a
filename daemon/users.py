"""Many local users on one root-run meshd: who an API request comes from, what they may do, and whose identity
a job's files and processes take.

With `submit_users` set (meshd as root), `api.sock` is open to every local user and meshd decides per request
from SO_PEERCRED: root and meshd's own user are operators (everything); a listed user may submit, list the
queue, and show, read the logs of, wait for, cancel, hold, release or requeue only their own jobs (403 with
one line otherwise); anyone else gets 403 on every route but /v1/health. A job submitted by a user runs as
that user, with their primary group and supplementary groups, in a job directory they own (0700).
"""

from __future__ import annotations

import os
import pwd
import socket
from dataclasses import dataclass
from pathlib import Path

from meshsched.daemon.jobsock import PEERCRED

SHARED_DIR_MODE = 0o711  # others may pass through to their own job directory and the sockets, never list


@dataclass(frozen=True, slots=True)
class Peer:
    """Who sent an API request: a local user (SO_PEERCRED), or a TCP client holding the bearer token (uid None)."""

    uid: int | None
    name: str

    @property
    def operator(self) -> bool:
        return self.uid is None or self.uid in (0, os.geteuid())


@dataclass(frozen=True, slots=True)
class Owner:
    """The identity a job runs under."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str
    home: str
    shell: str

    def argument(self) -> str:
        """The supervisor's --as-user value: UID:GID:G1,G2,..."""
        return f"{self.uid}:{self.gid}:{','.join(map(str, self.groups))}"


def peer(request) -> Peer:
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None or sock.family != socket.AF_UNIX:
        return Peer(None, "remote")
    _, uid, _ = PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))
    try:
        return Peer(uid, pwd.getpwuid(uid).pw_name)
    except KeyError:
        return Peer(uid, str(uid))


def owner_of(uid: int) -> Owner:
    """The user `uid` with their groups as the system knows them now (looked up at each launch, as Slurm does)."""
    pw = pwd.getpwuid(uid)
    groups = tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))))
    return Owner(uid, pw.pw_gid, groups, pw.pw_name, pw.pw_dir, pw.pw_shell)


def user_env(owner: Owner) -> dict[str, str]:
    """The login variables a job running as `owner` gets instead of meshd's."""
    return {"HOME": owner.home, "USER": owner.name, "LOGNAME": owner.name, "SHELL": owner.shell or "/bin/sh"}


def share_dirs(*paths: Path) -> None:
    """Let other users pass through meshd's directories (to their job directories and the sockets)."""
    for path in paths:
        os.chmod(path, SHARED_DIR_MODE)


def refusal(who: Peer, recs: list) -> str | None:
    """Why `who` may not act on these jobs (None: they may)."""
    if who.operator:
        return None
    foreign = next((r for r in recs if r.uid != who.uid), None)
    if foreign is None:
        return None
    return f"job {foreign.job_id} belongs to {foreign.user}; only its owner or an operator may act on it or read it"
