"""Errors raised by the performance model (what is unknown, and what is known instead)."""

from __future__ import annotations

from collections.abc import Iterable


class UnknownProfile(KeyError):
    """A model, GPU type or configuration has no profile; the message lists what is known."""

    def __init__(self, what: str, known: Iterable[str]) -> None:
        self.what = what
        self.known = tuple(sorted(known))
        super().__init__(what)

    def __str__(self) -> str:  # KeyError would repr() the message; keep it one readable line
        return f"{self.what}; known: {', '.join(self.known) if self.known else '(none)'}"
