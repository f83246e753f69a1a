"""The coordinator seam: leadership, membership and the mesh's shared records (Patroni's DCS, for meshd).

`Coordinator` is the Protocol meshd talks to. `LocalCoordinator` is the embedded default (one server, its
own leader, records in memory); `meshsched.daemon.etcd.EtcdCoordinator` is the many-server backend.
`coordinator_backends.open_coordinator` picks one by `CoordinatorConfig.backend` (in daemon/config.py). A
leadership has a term, an int that only grows (the leader key's create revision in etcd); a write or command
carrying a term older than the current leader's is refused (fencing). Record keys are relative paths such as `jobs/42` or `decisions/7`.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

LOG = logging.getLogger("meshd.coordinator")


class CoordinatorError(Exception):
    """A coordinator operation failed; the message is one line and names the endpoint when there is one."""


class CoordinatorUnavailable(CoordinatorError):
    """The coordinator's store did not answer within retry_timeout."""


class StaleTerm(CoordinatorError):
    """A write or command carried a term older than the current leader's (fencing)."""


class WatchCompacted(CoordinatorError):
    """A watch asked for changes the store no longer keeps: list again and watch from the listing."""


def check_key(key: str) -> str:
    """A record key: a relative path of non-empty, printable parts (`jobs/42`)."""
    parts = key.split("/")
    if not key or any(p in ("", ".", "..") for p in parts) or not key.isprintable():
        raise ValueError(f"bad record key {key!r}: want a relative path like 'jobs/42'")
    return key


@dataclass(frozen=True, slots=True)
class Member:
    """A node of the mesh as it registers itself: GPUs by local index (their model names)."""

    name: str
    address: str
    gpus: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "address": self.address, "gpus": list(self.gpus)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Member:
        data = json.loads(text)
        return cls(str(data["name"]), str(data["address"]), tuple(str(g) for g in data.get("gpus", ())))


@dataclass(frozen=True, slots=True)
class Leadership:
    name: str  # the leader's node name
    term: int  # grows with every new leadership; commands carry it


class ChangeKind(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class Change:
    kind: ChangeKind
    key: str  # relative record key
    value: str | None  # None for DELETE
    revision: int


@dataclass(frozen=True, slots=True)
class Listing:
    items: dict[str, str]  # relative key -> value
    revision: int  # watch(prefix, since=revision) continues without a gap


class Coordinator(Protocol):
    """What meshd needs from the mesh's store. acquire/renew/release_leadership never raise because the
    store is away (they answer None, or the term while it is surely still held: local-first); leader(),
    is_current() and the record calls raise CoordinatorUnavailable, so the caller can keep a write in its
    local journal and hand it over later."""

    name: str

    @property
    def term(self) -> int | None:
        """This node's current term while it holds leadership (and its lease is surely alive), else None."""

    async def start(self) -> None: ...

    async def acquire_leadership(self) -> int | None: ...

    async def renew_leadership(self) -> int | None: ...

    async def release_leadership(self) -> None: ...

    async def leader(self) -> Leadership | None: ...

    async def is_current(self, term: int) -> bool: ...

    async def wait_leader_change(self, timeout: float) -> bool: ...

    async def register(self, member: Member) -> None: ...

    async def members(self) -> list[Member]: ...

    async def put(self, key: str, value: str, term: int | None = None) -> int: ...

    async def get(self, key: str) -> str | None: ...

    async def delete(self, key: str, term: int | None = None) -> bool: ...

    async def delete_range(self, start: str, end: str, term: int | None = None) -> int: ...

    async def list(self, prefix: str = "") -> Listing: ...

    async def append(self, term: int, puts: list[tuple[str, str]], deletes: list[str]) -> int:
        """Put `puts` and delete the records `deletes` names in ONE transaction, only while `term` is current
        (StaleTerm otherwise): all or none. The revision."""

    async def compact(self, revision: int) -> None:
        """Drop the store's change history before `revision` (watches from before it get WatchCompacted)."""

    def watch(self, prefix: str = "", since: int | None = None) -> AsyncIterator[Change]: ...

    async def close(self, release: bool = True) -> None: ...


@dataclass
class LocalCoordinator:
    """The embedded default: one server, always its own leader (term 1), records in memory.

    `initial` seeds the records (e.g. from the journal); `on_change` sees every change as it is made (e.g.
    to mirror it into the journal). Watches replay from a bounded history, like etcd before compaction.
    """

    name: str
    on_change: Callable[[Change], None] | None = None
    initial: Mapping[str, str] = field(default_factory=dict)
    history: int = 10_000
    _records: dict[str, str] = field(init=False, default_factory=dict)
    _log: deque[Change] = field(init=False)
    _revision: int = field(init=False, default=0)
    _term: int | None = field(init=False, default=None)
    _terms: int = field(init=False, default=0)
    _members: dict[str, Member] = field(init=False, default_factory=dict)
    _wakeup: asyncio.Event = field(init=False, default_factory=asyncio.Event)
    _closed: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self._log = deque(maxlen=self.history)
        self._records = {check_key(k): v for k, v in self.initial.items()}

    @property
    def term(self) -> int | None:
        return self._term

    async def start(self) -> None:
        self._closed = False

    async def acquire_leadership(self) -> int | None:
        if self._closed:
            return None
        if self._term is None:
            self._terms += 1
            self._term = self._terms
            self._notify()
        return self._term

    async def renew_leadership(self) -> int | None:
        return self._term

    async def release_leadership(self) -> None:
        if self._term is not None:
            self._term = None
            self._notify()

    async def leader(self) -> Leadership | None:
        return Leadership(self.name, self._term) if self._term is not None else None

    async def is_current(self, term: int) -> bool:
        return self._term is not None and term >= self._term

    async def wait_leader_change(self, timeout: float) -> bool:
        event = self._wakeup
        try:
            async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can swallow a cancellation
                await event.wait()
        except TimeoutError:
            return False
        return not self._closed

    async def register(self, member: Member) -> None:
        if member.name != self.name:
            raise ValueError(f"this coordinator is {self.name!r}; cannot register {member.name!r}")
        self._members[member.name] = member

    async def members(self) -> list[Member]:
        return sorted(self._members.values(), key=lambda m: m.name)

    def _fence(self, term: int | None) -> None:
        if term is not None and (self._term is None or term < self._term):
            raise StaleTerm(f"term {term} is not current (current term: {self._term})")

    def _change(self, kind: ChangeKind, key: str, value: str | None) -> int:
        self._revision += 1
        change = Change(kind, key, value, self._revision)
        self._log.append(change)
        if self.on_change is not None:
            self.on_change(change)
        self._notify()
        return self._revision

    def _notify(self) -> None:
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    async def put(self, key: str, value: str, term: int | None = None) -> int:
        self._fence(term)
        self._records[check_key(key)] = value
        return self._change(ChangeKind.PUT, key, value)

    async def get(self, key: str) -> str | None:
        return self._records.get(check_key(key))

    async def delete(self, key: str, term: int | None = None) -> bool:
        self._fence(term)
        if self._records.pop(check_key(key), None) is None:
            return False
        self._change(ChangeKind.DELETE, key, None)
        return True

    async def delete_range(self, start: str, end: str, term: int | None = None) -> int:
        self._fence(term)
        doomed = [k for k in self._records if check_key(start) <= k < check_key(end)]
        for key in doomed:
            del self._records[key]
            self._change(ChangeKind.DELETE, key, None)
        return len(doomed)

    async def append(self, term: int, puts: list[tuple[str, str]], deletes: list[str]) -> int:
        self._fence(term)
        for key in [k for k, _ in puts] + deletes:
            check_key(key)  # all or none
        for key, value in puts:
            await self.put(key, value)
        for key in deletes:
            await self.delete(key)
        return self._revision

    async def compact(self, revision: int) -> None:
        while self._log and self._log[0].revision < revision:
            self._log.popleft()

    async def list(self, prefix: str = "") -> Listing:
        return Listing({k: v for k, v in sorted(self._records.items()) if k.startswith(prefix)}, self._revision)

    async def watch(self, prefix: str = "", since: int | None = None) -> AsyncIterator[Change]:
        seen = self._revision if since is None else since
        while not self._closed:
            if seen >= self._revision:
                await self._wakeup.wait()
                continue
            oldest = self._log[0].revision if self._log else self._revision + 1
            if seen + 1 < oldest:
                raise WatchCompacted(f"local coordinator: changes after revision {seen} are no longer kept "
                                     f"(oldest kept: {oldest})")
            for change in [c for c in self._log if c.revision > seen]:
                seen = change.revision
                if change.key.startswith(prefix):
                    yield change

    async def close(self, release: bool = True) -> None:
        self._closed = True
        self._term = None
        self._members.clear()
        self._notify()
