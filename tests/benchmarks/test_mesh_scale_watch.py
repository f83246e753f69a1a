"""benchmarks/mesh_scale.py stops a run whose mesh no longer follows its log (a meshd task that died) in one
line instead of waiting for ever: the 32-node run of 5,000 jobs hung so when every node's `_follow` died on one
entry (W6, 2026-11-27)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("mesh_scale", ROOT / "benchmarks" / "mesh_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_dead_meshd_task_is_found_in_its_log():
    task_death = _load().task_death
    log = ("meshd: job n1.1 (fake): PENDING -> LOADING\n"
           "meshd: mesh: _follow failed: ValueError('node n15 already joined')\n"
           "Traceback (most recent call last):\n")
    assert task_death(log) == "_follow failed: ValueError('node n15 already joined')"
    quiet = ("meshd: mesh: writing the snapshot at entry 1000: etcd at http://10.77.0.11:2379 does not answer: "
             "timed out (tried for 1 s)\nmeshd: mesh: sequencing stopped: etcd does not answer\n")
    assert task_death(quiet) is None
