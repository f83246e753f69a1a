"""A job.State that saves JSON and can fail mid-save (checkpoint tests, in-process and in a subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

from meshsched.job import State


class JsonState(State):
    def __init__(self, name: str, value=None, fail: str = "") -> None:
        super().__init__(name)
        self.value, self.fail = value, fail

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state) -> None:
        self.value = state["value"]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.state_dict())[: 5 if self.fail else None])  # a partial file first
        if self.fail == "raise":
            raise OSError("disk full")

    def load(self, path: Path) -> None:
        self.load_state_dict(json.loads(path.read_text()))
