"""The one contract for carrying out the engine's actions, kept by the simulated world and by meshd alike.

An executor maps every action type to a handler (`ACTION_TYPES` is the whole vocabulary) and raises
`UnknownAction` for anything else: an action nobody handles is a bug, never silently dropped. Tests check
that the simulator and the daemon handle exactly the same set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from meshsched.actions import Action, FitModel, Kill, Launch, Preempt, Reconfigure, ScheduleTimer, SignalJob

ACTION_TYPES: frozenset[type] = frozenset({Launch, Preempt, Kill, Reconfigure, ScheduleTimer, FitModel, SignalJob})


class UnknownAction(TypeError):
    """An executor was handed an action it has no handler for."""


class Executor(Protocol):
    def execute(self, actions: Sequence[Action | ScheduleTimer | FitModel], now: float) -> None: ...


def check_handlers(owner: str, handlers: Mapping[type, Callable]) -> None:
    """Refuse an executor that does not handle exactly `ACTION_TYPES`."""
    missing, extra = ACTION_TYPES - set(handlers), set(handlers) - ACTION_TYPES
    if missing or extra:
        names = lambda ts: ", ".join(sorted(t.__name__ for t in ts)) or "none"  # noqa: E731
        raise UnknownAction(f"{owner}: handlers do not match the action vocabulary (missing: {names(missing)}; "
                            f"unknown: {names(extra)})")


def dispatch(owner: str, handlers: Mapping[type, Callable], action: object, *args) -> None:
    h = handlers.get(type(action))
    if h is None:
        raise UnknownAction(f"{owner} cannot carry out {type(action).__name__}: {action!r}")
    h(action, *args)
