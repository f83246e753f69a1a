"""The Philly golden replays' setup shared by the simulator tests: the perf model, the trace, the cluster, the diff."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from meshsched.loaders.profiles import load_perf_model
from meshsched.loaders.traces import TraceOptions, load_trace
from meshsched.sim.loop import ClusterSpec

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "philly200.json"
GOLDEN_SETUP = {"trace": "philly", "first_n": 200, "nodes": 1, "gpus_per_node": 8, "gpu_type": "v100", "seed": 1}
POLICIES = ("fifo", "sjf", "srtf", "las", "srtf@360")


@functools.cache
def perf_model():
    return load_perf_model()


@functools.cache
def philly(first_n: int, seed: int = 1):
    return load_trace("philly", perf_model(), TraceOptions(gpu_type="v100", gpus_per_node=8, seed=seed, first_n=first_n))


def v100(nodes: int) -> ClusterSpec:
    return ClusterSpec(nodes, 8, "v100", perf_model().gpu_memory_mb("v100"))


def moved_metrics(policy: str, want: dict[str, object], got: dict[str, object]) -> list[str]:
    out = []
    for key, w in want.items():
        if key not in got:
            out.append(f"{policy}: metric {key!r} is gone from the summary")
            continue
        v = got[key]
        if isinstance(w, float) and not isinstance(w, bool):
            ok = isinstance(v, (int, float)) and v == pytest.approx(w, rel=1e-9)
        else:
            ok = v == w and type(v) is type(w)
        if not ok:
            out.append(f"{policy}: {key} moved: golden {w!r}, now {v!r}")
    return out


