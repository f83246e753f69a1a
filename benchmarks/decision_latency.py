"""Castor's time per scheduling decision on a large snapshot: 1,024 GPUs (128 x 8 V100), every GPU busy
with one running job (so every GPU is a sharing candidate: the worst case for the search), 1,000 pending jobs.

    python benchmarks/decision_latency.py [--repeat 300]

Three figures, p50 and p99 over repetitions on the same snapshot (a pass only reads the state):
* arrival decision: one job arrives (Trigger.ARRIVAL): the exclusive-start pass over the queue plus
  Castor's sharing search (Algorithm 1 lines 9-17, Algorithm 2 per host) for the newcomer; measured twice:
  with the holders' arrays kept from the last pass (nothing moved since, as for a burst of arrivals) and
  after a state change (the arrays are rebuilt inside the timed call, as for the first pass after an event);
* release pass: GPUs came free (Trigger.RELEASE): the whole queue is walked; the first SHARE_SEARCH_DEPTH (64)
  pending jobs that do not fit on free GPUs get the sharing search, in queue order.
Target: arrival decision p99 < 5 ms (both figures). Not a test: numbers go to the README.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from meshsched import events as ev
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.perf import load_perf_model
from meshsched.perf.loader import load_interference
from meshsched.policies.base import Trigger
from meshsched.policies.castor import Castor
from meshsched.policies.registry import make_policy
from meshsched.state import ClusterState, JobSpec, NodeSpec


class _Hold:
    """Queues everything, starts nothing (to build the pending queue)."""

    name = "hold"

    def __init__(self, key) -> None:
        self.queue_key = key

    def schedule(self, view, now, trigger):
        return []

    def next_timer(self, view, now):
        return None


def build(seed: int = 0, nodes: int = 128, per_node: int = 8, pending: int = 1000) -> Engine:
    perf = load_perf_model()
    rng = random.Random(seed)
    eng = Engine(make_policy("sjf"), ProfileEstimator(perf), ClusterState())
    for i in range(nodes):
        eng.handle(ev.NodeJoined(f"j{i}", NodeSpec(f"n{i:03d}", per_node, "v100", 16384)), 0.0)
    multi = perf.models("v100", 2)
    anym = perf.models("v100", 1)

    def spec(jid, gpus, t):
        model = rng.choice(anym if gpus == 1 else multi)
        b = rng.choice(perf.profiled_batches(model, "v100"))
        return JobSpec(jid, gpus, model, b * gpus, rng.randint(1_000, 200_000), submit_time=t)

    left, n = nodes * per_node, 0
    while left:  # fill every GPU with one running job: sizes 1, 2, 4, 8
        g = min(left, rng.choice((1, 1, 1, 2, 2, 4, 8)))
        eng.handle(ev.JobSubmitted(f"s{n}", spec(f"r{n}", g, 0.0)), 0.0)
        n += 1
        left -= g
    for job_id in list(eng.state.jobs):
        eng.handle(ev.JobStarted(f"st-{job_id}", job_id), 60.0)
    assert eng.state.free_gpus == 0
    castor = Castor(perf=perf, interference=load_interference())
    eng.policy = _Hold(castor.queue_key)
    for k in range(pending):
        eng.handle(ev.JobSubmitted(f"p{k}", spec(f"p{k}", rng.choice((1, 1, 1, 2, 2, 4, 8, 16)), 100.0)), 100.0)
    eng.policy = castor
    return eng


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=300)
    a = ap.parse_args()
    eng = build()
    pol = eng.policy
    pending = [j.job_id for j in eng.queued()]
    pol.schedule(eng.view(pending[0]), 200.0, Trigger.ARRIVAL)  # warm caches (IR prefill, perf lru)
    rng = random.Random(1)
    arr, shared = [], 0
    for _ in range(a.repeat):
        jid = rng.choice(pending)
        t0 = time.perf_counter()
        d = pol.schedule(eng.view(jid), 200.0, Trigger.ARRIVAL)
        arr.append((time.perf_counter() - t0) * 1e3)
        shared += any(getattr(x, "job_id", None) == jid and hasattr(x, "gpus") for x in d)
    cold = []  # the same, after a state change: the holders' arrays (policies/occupancy.py) are rebuilt first
    for _ in range(a.repeat):
        jid = rng.choice(pending)
        eng.state.version += 1
        t0 = time.perf_counter()
        pol.schedule(eng.view(jid), 200.0, Trigger.ARRIVAL)
        cold.append((time.perf_counter() - t0) * 1e3)
    rel = []
    for _ in range(max(5, a.repeat // 30)):
        t0 = time.perf_counter()
        d = pol.schedule(eng.view(), 200.0, Trigger.RELEASE)
        rel.append((time.perf_counter() - t0) * 1e3)
    print(f"snapshot: {eng.state.total_gpus} GPUs, {len(list(eng.view().holding()))} running jobs, {len(pending)} pending")
    print(f"arrival decision: p50 {pct(arr, 50):.2f} ms, p99 {pct(arr, 99):.2f} ms, mean {statistics.mean(arr):.2f} ms "
          f"({a.repeat} decisions, {shared} of them start the newcomer on shared GPUs)")
    print(f"arrival decision after a state change (arrays rebuilt): p50 {pct(cold, 50):.2f} ms, p99 {pct(cold, 99):.2f} ms")
    print(f"release pass ({len(pending)} pending, up to 64 sharing searches): p50 {pct(rel, 50):.1f} ms, p99 {pct(rel, 99):.1f} ms; "
          f"{len(d)} decisions in the last pass; per pending job {pct(rel, 50) / len(pending):.3f} ms")


if __name__ == "__main__":
    main()
