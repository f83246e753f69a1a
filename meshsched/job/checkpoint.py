"""Atomic checkpoints: `State` objects written by rank 0 into a temporary directory, then renamed.

Layout under MESH_CHECKPOINT_DIR: `step-00000040/` holds one `<name>.pt` per State and `meta.json`
(written last). A checkpoint is written into `.tmp-step-00000040-<pid>/`, every file fsynced, then the
directory is renamed into place and the parent fsynced: a crash at any point leaves either the complete
new directory or none, and `.tmp-*` leftovers are never loaded (they are removed on the next save).
`latest()` picks the highest step whose directory has `meta.json`; older ones beyond `keep` are pruned.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKPOINT_RE = re.compile(r"^step-(\d{8,})$")


class State:
    """A named piece of training state; subclasses (or `TorchState`) give `state_dict`/`load_state_dict`."""

    def __init__(self, name: str) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"state name {name!r}: letters, digits, '_', '-', '.' only")
        self.name = name

    def state_dict(self) -> Any:
        raise NotImplementedError

    def load_state_dict(self, state: Any) -> None:
        raise NotImplementedError

    def save(self, path: Path) -> None:
        import torch

        torch.save(self.state_dict(), path)

    def load(self, path: Path) -> None:
        import torch

        self.load_state_dict(torch.load(path, map_location="cpu", weights_only=False))


class TorchState(State):
    """Wraps anything with state_dict/load_state_dict: a module, an optimizer, a scheduler, a sampler."""

    def __init__(self, name: str, obj: Any) -> None:
        super().__init__(name)
        self.obj = obj

    def state_dict(self) -> Any:
        return self.obj.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.obj.load_state_dict(state)


class RngState(State):
    """Python's, NumPy's and torch's (CPU and CUDA) random generators."""

    def __init__(self, name: str = "rng") -> None:
        super().__init__(name)

    def state_dict(self) -> Any:
        import random

        import numpy as np
        import torch

        out = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            out["cuda"] = torch.cuda.get_rng_state_all()
        return out

    def load_state_dict(self, state: Any) -> None:
        import random

        import numpy as np
        import torch

        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])


@dataclass(frozen=True, slots=True)
class Checkpoint:
    step: int
    path: Path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Checkpointer:
    """Saves and finds checkpoints in one directory (call `save` on one rank only)."""

    def __init__(self, root: str | Path, keep: int = 2) -> None:
        self.root = Path(root)
        self.keep = max(1, keep)

    def list(self) -> list[Checkpoint]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        out = []
        for entry in self.root.iterdir():
            m = CHECKPOINT_RE.match(entry.name)
            if m and entry.is_dir() and (entry / "meta.json").is_file():
                out.append(Checkpoint(int(m.group(1)), entry))
        return sorted(out, key=lambda c: c.step)

    def latest(self) -> Checkpoint | None:
        found = self.list()
        return found[-1] if found else None

    def save(self, step: int, states: list[State], meta: dict | None = None) -> Checkpoint:
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        final = self.root / f"step-{step:08d}"
        tmp = self.root / f".tmp-{final.name}-{os.getpid()}"
        tmp.mkdir()
        try:
            for state in states:
                state.save(tmp / f"{state.name}.pt")
            (tmp / "meta.json").write_text(json.dumps({"step": step, "states": [s.name for s in states],
                                                       **(meta or {})}))
            for f in tmp.iterdir():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            _fsync_dir(tmp)
            if final.exists():  # the same step saved twice (e.g. periodic + exit): keep the first
                shutil.rmtree(tmp)
            else:
                os.rename(tmp, final)
                _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.prune()
        return Checkpoint(step, final)

    def load(self, checkpoint: Checkpoint, states: list[State]) -> dict:
        """Load every State from `checkpoint`; returns its meta.json."""
        meta = json.loads((checkpoint.path / "meta.json").read_text())
        for state in states:
            state.load(checkpoint.path / f"{state.name}.pt")
        return meta

    def prune(self) -> None:
        for old in self.list()[: -self.keep]:
            shutil.rmtree(old.path, ignore_errors=True)
