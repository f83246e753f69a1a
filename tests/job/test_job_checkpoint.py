"""Atomic checkpoints: complete or absent, never half-written; resume, pruning, and State objects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from meshsched.job import Checkpointer
from tests.support.job import JsonState


def test_save_load_latest_and_prune(tmp_path):
    ck = Checkpointer(tmp_path, keep=2)
    assert ck.latest() is None
    for step in (10, 20, 30):
        ck.save(step, [JsonState("a", step), JsonState("b", -step)])
    assert [c.step for c in ck.list()] == [20, 30]  # pruned to `keep`
    a, b = JsonState("a"), JsonState("b")
    meta = ck.load(ck.latest(), [a, b])
    assert (a.value, b.value, meta["step"], meta["states"]) == (30, -30, 30, ["a", "b"])


def test_an_exception_while_writing_leaves_the_previous_checkpoint(tmp_path):
    ck = Checkpointer(tmp_path)
    ck.save(5, [JsonState("a", 5)])
    with pytest.raises(OSError):
        ck.save(6, [JsonState("a", 6), JsonState("b", 6, fail="raise")])
    assert ck.latest().step == 5 and sorted(p.name for p in tmp_path.iterdir()) == ["step-00000005"]


CRASH = """
import os, sys
from pathlib import Path
from meshsched.job import Checkpointer
from tests.support.job import JsonState
from tests.support.job import JsonState

class Dies(JsonState):
    def save(self, path: Path) -> None:
        super().save(path)
        os._exit(9)  # the process dies mid-checkpoint: no cleanup, no exception handler runs

Checkpointer(sys.argv[1]).save(int(sys.argv[2]), [JsonState("a", 1), Dies("b", 2, fail="crash")])
"""


def test_a_crash_during_writing_never_leaves_a_checkpoint_that_resume_loads(tmp_path):
    root = Path(__file__).resolve().parents[2]
    ck = Checkpointer(tmp_path)
    ck.save(3, [JsonState("a", 3), JsonState("b", 3)])
    for step in (4, 3):  # a new step, and the same step again
        proc = subprocess.run([sys.executable, "-c", CRASH, str(tmp_path), str(step)], cwd=root)
        assert proc.returncode == 9
        assert any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())  # the debris is there ...
        latest = ck.latest()  # ... and never chosen
        a, b = JsonState("a"), JsonState("b")
        ck.load(latest, [a, b])
        assert (latest.step, a.value, b.value) == (3, 3, 3)
    ck.save(7, [JsonState("a", 7)])
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())  # swept by the next save


def test_a_directory_without_meta_is_not_a_checkpoint(tmp_path):
    (tmp_path / "step-00000009").mkdir()
    (tmp_path / "step-00000009" / "a.pt").write_text("{}")
    assert Checkpointer(tmp_path).latest() is None


def test_state_names_are_file_names():
    with pytest.raises(ValueError):
        JsonState("../evil")


def test_torch_states_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    from meshsched.job import RngState, TorchState

    m = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.ones(1, 3)).sum().backward()
    opt.step()
    ck = Checkpointer(tmp_path)
    ck.save(1, [TorchState("model", m), TorchState("opt", opt), RngState()])
    expected = torch.rand(4)
    m2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
    ck.load(ck.latest(), [TorchState("model", m2), TorchState("opt", opt2), RngState()])
    torch.testing.assert_close(m2.weight, m.weight)
    assert opt2.state_dict()["state"][0]["momentum_buffer"].shape == (2, 3)
    torch.testing.assert_close(torch.rand(4), expected)  # the RNG continues where it was saved
