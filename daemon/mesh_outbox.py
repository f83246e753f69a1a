"""OutboxFile: the file behind a mesh node's outbox (`mesh-outbox.jsonl`). A proposal is appended before meshd
acknowledges it and marked done once etcd has it; the next meshd takes back what was never marked, in order."""

from __future__ import annotations

import json
import os
from pathlib import Path


class OutboxFile:
    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: the outbox lives in memory only
        self._fd: int | None = None

    def take_back(self) -> dict[str, str]:
        """The proposals (key -> value) a previous meshd left unmarked, in their order; the file is open after."""
        pending: dict[str, str] = {}
        if self.path is None:
            return pending
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                item = json.loads(line)
                if "done" in item:
                    pending.pop(item["done"], None)
                else:
                    pending[str(item["key"])] = str(item["value"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a crash: its proposal was never acknowledged
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return pending

    def write(self, item: dict) -> None:
        if self._fd is not None:
            os.write(self._fd, (json.dumps(item, separators=(",", ":")) + "\n").encode())

    def rewrite(self, outbox) -> None:
        """The file holds exactly `outbox` ((key, value) pairs) again."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        for key, value in outbox:
            self.write({"key": key, "value": value})

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
