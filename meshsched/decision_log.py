"""The engine's decision log: one line per decision or change, with its stimulus (what `mesh explain` prints)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from functools import partial
from typing import NamedTuple


class LogEntry(NamedTuple):
    """One line of the decision log, as read (kept as a plain tuple: `DecisionLog`; two or three per event)."""

    time: float
    stimulus_id: str
    job_id: str
    message: str


_entry = partial(tuple.__new__, LogEntry)  # a line as kept -> its LogEntry


class DecisionLog(deque):
    """The bounded decision log. It holds plain tuples, which the cyclic collector stops tracking (a named tuple it
    tracks for good: 100,000 kept lines re-read by every full collection), and hands out `LogEntry`s when read."""

    __slots__ = ()

    def __iter__(self) -> Iterator[LogEntry]:
        return map(_entry, deque.__iter__(self))

    def __reversed__(self) -> Iterator[LogEntry]:
        return map(_entry, deque.__reversed__(self))

    def __getitem__(self, i: int) -> LogEntry:
        return _entry(deque.__getitem__(self, i))
