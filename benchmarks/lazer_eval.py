"""Lazer against SRTF, periodic SRTF and SJF on a Philly slice, in both overhead regimes (issue 12's Table 2).

    python benchmarks/lazer_eval.py [--json] [--jobs 2000] [--nodes 8] [--window busiest|first]
                                    [--regimes measured,lazer] [--policies srtf,srtf@60,srtf@360,sjf,lazer]
                                    [--workers 1]

The slice: the busiest 2,000-job window of Philly (the arrivals from 729.865 h on, as benchmarks/castor_eval.py)
or its first N jobs, on NODES x 8 V100 (default 8 x 8 = 64 GPUs, where SRTF preempts a lot), seed 1, load 1x.
Regimes: `measured` (our models' loads of 20-30 s, pauses 5-15 s) and `lazer` (profiles/overheads_lazer.json:
loads of ~2 min, pauses ~8 s, scaled to Lazer section 3.2). The same replays as `mesh simulate --overheads R`.

Per run: mean / p50 / p95 JCT, mean wait, preemptions, futile preemptions (a job preempted while loading) and
their GPU-time, and the scheduling pass's wall time (`decision delay`) p50 / p99 / mean over the passes that
decided a preemption or a deferral (a Defer or an Evict: where Lazer predicts X, or acts when X ends) with
their mean CPU time (steadier than wall time on a shared machine), over all arrival passes, and (JSON) over
all passes. `lazer:loading=spare` is Lazer whose orchestrator never picks a job still loading (beyond the paper). GP fits are not in the pass: the simulator runs them as
FitModel actions (meshd runs them in a worker process); their count and total seconds are reported apart.
Timings on a shared 2-core machine are noisy. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

BUSIEST = (729.865 * 3600, 740 * 3600)
POLICIES = ("srtf", "srtf@60", "srtf@360", "sjf", "lazer", "lazer:loading=spare")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def run_one(task: tuple[str, str, int, int, str]) -> dict:
    import torch

    torch.set_num_threads(1)  # one intra-op thread for the GP (lazer_opt's advice)
    from meshsched.perf import load_perf_model
    from meshsched.policies.base import Defer, Evict, Trigger
    from meshsched.policies.registry import make_policy
    from meshsched.policies.stack import PolicyHandle
    from meshsched.sim.loop import ClusterSpec, simulate
    from meshsched.sim.metrics import summarise, summary_dict
    from meshsched.sim.traces import TraceOptions, load_trace
    from meshsched.sim.world import SimWorld

    regime, policy, n_jobs, nodes, window = task
    perf = load_perf_model(overheads=regime)
    opts = TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, first_n=n_jobs,
                        window=BUSIEST if window == "busiest" else None)
    jobs = load_trace("philly", perf, opts).jobs
    stack = make_policy(policy, PolicyHandle(perf=perf, seed=1))
    passes: dict[str, list[float]] = {"decision": [], "decision_cpu": [], "arrival": [], "all": []}
    inner = stack.schedule

    def timed(view, now, trigger):
        t, c = time.perf_counter(), time.process_time()
        out = inner(view, now, trigger)
        dt, dc = (time.perf_counter() - t) * 1e3, (time.process_time() - c) * 1e3
        passes["all"].append(dt)
        if trigger is Trigger.ARRIVAL:
            passes["arrival"].append(dt)
        if any(isinstance(d, (Defer, Evict)) for d in out):  # a preemption was decided or deferred
            passes["decision"].append(dt)
            passes["decision_cpu"].append(dc)
        return out

    stack.schedule = timed  # the engine calls the stack's schedule once per pass
    fits: list[float] = []
    fit_inner = SimWorld._fit

    def timed_fit(world, action, now):
        t = time.perf_counter()
        fit_inner(world, action, now)
        fits.append(time.perf_counter() - t)

    SimWorld._fit = timed_fit  # this worker process only
    try:
        t0 = time.perf_counter()
        r = simulate(jobs, stack, perf, ClusterSpec(nodes, 8, "v100", perf.gpu_memory_mb("v100")))
        wall = time.perf_counter() - t0
    finally:
        SimWorld._fit = fit_inner
    doc = dict(summary_dict(summarise(r, policy)), regime=regime, sim_seconds=round(wall, 1))
    for kind, xs in passes.items():
        doc[f"pass_{kind}_ms"] = {"p50": _pct(xs, 50), "p99": _pct(xs, 99),
                                  "mean": statistics.fmean(xs) if xs else float("nan"), "count": len(xs)}
    doc["fits"] = len(fits)
    doc["fit_seconds"] = round(sum(fits), 1)
    mem = r.engine.memory
    if mem is not None:
        doc["observations"] = len(mem.optimizer.observations)
        doc["exploiting"] = mem.optimizer.exploiting
        doc["deferrals"] = sum(1 for e in r.engine.log if e.message.startswith("deferred"))
    return doc


def table(docs: list[dict]) -> str:
    head = ("| regime | policy | JCT mean h | p50 h | p95 h | wait mean h | preempt | futile | futile GPU-h "
            "| decision ms p50 / p99 / mean (n) | its CPU ms mean | arrival pass ms p50 / p99 / mean | fits (s) | sim s |")
    lines = [head, "|---" * 14 + "|"]
    for d in docs:
        a, p, c = d["pass_arrival_ms"], d["pass_decision_ms"], d["pass_decision_cpu_ms"]
        lines.append(
            f"| {d['regime']} | {d['policy']} | {d['jct_mean_h']:.3f} | {d['jct_p50_h']:.3f} | {d['jct_p95_h']:.2f} "
            f"| {d['wait_mean_h']:.3f} | {d['preemptions']} | {d['futile_preemptions']} | {d['futile_gpu_h']:.2f} "
            f"| {p['p50']:.2f} / {p['p99']:.2f} / {p['mean']:.2f} ({p['count']}) | {c['mean']:.2f} | {a['p50']:.2f} / {a['p99']:.2f} / {a['mean']:.2f} "
            f"| {d['fits']} ({d['fit_seconds']}) | {d['sim_seconds']} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--jobs", type=int, default=2000, help="jobs in the slice (default 2000)")
    ap.add_argument("--nodes", type=int, default=8, help="8-GPU V100 servers (default 8)")
    ap.add_argument("--window", choices=("busiest", "first"), default="busiest")
    ap.add_argument("--regimes", default="measured,lazer")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    if a.jobs < 1 or a.nodes < 1 or a.workers < 1:
        ap.error("--jobs, --nodes and --workers must be >= 1")
    tasks = [(r, p, a.jobs, a.nodes, a.window) for r in a.regimes.split(",") for p in a.policies.split(",")]
    with ProcessPoolExecutor(a.workers) as ex:
        docs = list(ex.map(run_one, tasks))
    if a.json:
        print(json.dumps({"slice": {"jobs": a.jobs, "nodes": a.nodes, "gpus": a.nodes * 8, "window": a.window},
                          "runs": docs}, indent=1))
    else:
        print(f"Philly {a.window} window, {a.jobs} jobs, {a.nodes} x 8 V100, seed 1, load 1x")
        print(table(docs))


if __name__ == "__main__":
    main()
