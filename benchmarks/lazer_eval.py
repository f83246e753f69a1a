"""Lazer against SRTF, periodic SRTF and SJF on Philly, in both overhead regimes (issue 12's Table 2).

    python benchmarks/lazer_eval.py [--json] [--jobs 2000] [--nodes 8] [--window busiest|first|full]
                                    [--regimes measured,lazer] [--policies srtf,srtf@60,srtf@360,sjf,lazer]
                                    [--workers 1]
    python benchmarks/lazer_eval.py --window full --nodes 64 --policies srtf,sjf,lazer   # the full trace

The slice: the busiest 2,000-job window of Philly (the arrivals from 729.865 h on, as benchmarks/castor_eval.py),
its first N jobs, or the whole trace (`full`, 82,247 jobs: use --nodes 64, the 512 GPUs of docs/results/lazer.md), on
NODES x 8 V100 (default 8 x 8 = 64 GPUs, where SRTF preempts a lot), seed 1, load 1x.
Regimes: `measured` (our models' loads of 20-30 s, pauses 5-15 s) and `lazer` (profiles/overheads_lazer.json:
loads of ~2 min, pauses ~8 s, scaled to Lazer section 3.2). The same replays as `mesh simulate --overheads R`.

Per run: mean / p50 / p95 JCT, mean wait, preemptions, futile preemptions (a job preempted while loading) and
their GPU-time, and the scheduling pass's wall time (`decision delay`) p50 / p99 / mean over the passes that
decided a preemption or a deferral (a Defer or an Evict: where Lazer predicts X, or acts when X ends) with
their mean CPU time (steadier than wall time on a shared machine), over all arrival passes, and (JSON) over
all passes. Futile preemptions are split by how the victim's thrown-away load began: `chain` = it was loading
because jobs had been preempted for it (Lazer Eq. 2's j_k+1, the case Lazer's deferral targets), `completion` =
it was started from the wait queue on GPUs a completion freed (or a pause that was not for it), `free` = at its
arrival on free GPUs (read from the decisions: an Evict's reason names the job it was for). After the table, the
issue's targets: Lazer's futile GPU time / SRTF's, its median JCT / SRTF's, its mean JCT / SJF's, per regime,
and the `unpaid` loads: preemptions of a running job that had trained for less time than its load took (not
futile by Eq. 2, but most of that load is lost too: the check that sparing loading jobs does not just move
the waste past the load's end).
`lazer-oracle` (not a policy: a bound) is Lazer whose X is, at every decision, the hindsight F of Eq. 4 computed
from the trace's future arrivals: what a perfect deferral predictor would do with Lazer's objective.
`lazer:loading=spare` is Lazer whose orchestrator never picks a job still loading, `loading=last` picks one
only if the others do not suffice, after the running jobs that have not yet trained as long as their load
took (both beyond the paper; meshsched/policies/lazer.py). GP fits are not in the pass: the simulator runs them as
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
POLICIES = ("srtf", "srtf@60", "srtf@360", "sjf", "lazer", "lazer:loading=spare", "lazer:loading=last", "lazer-oracle")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def run_one(task: tuple[str, str, int, int, str]) -> dict:
    import torch

    torch.set_num_threads(1)  # one intra-op thread for the GP (lazer_opt's advice)
    from meshsched.loaders.profiles import load_perf_model
    from meshsched.policies.base import Defer, Evict, Start, Trigger
    from meshsched.policies.registry import make_policy
    from meshsched.policies.stack import PolicyHandle
    from meshsched.sim.loop import ClusterSpec, simulate
    from meshsched.sim.metrics import summarise, summary_dict
    from meshsched.loaders.traces import TraceOptions, load_trace
    from meshsched.sim.world import SimWorld
    from meshsched.state import JobState

    regime, policy, n_jobs, nodes, window = task
    perf = load_perf_model(overheads=regime)
    opts = TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, first_n=None if window == "full" else n_jobs,
                        window=BUSIEST if window == "busiest" else None)
    jobs = load_trace("philly", perf, opts).jobs
    stack = make_policy("lazer" if policy == "lazer-oracle" else policy, PolicyHandle(perf=perf, seed=1))
    clock = [0.0]  # the pass's time, for the oracle
    if policy == "lazer-oracle":
        stack.preemption._opt = HindsightDeferral(jobs, perf, clock)  # noqa: SLF001 (a bound, not a policy)
    passes: dict[str, list[float]] = {"decision": [], "decision_cpu": [], "arrival": [], "all": []}
    inner = stack.schedule
    origin: dict[str, str] = {}  # job -> how its current load began
    beneficiaries: set[str] = set()  # jobs something was preempted for, not started since
    futile = {k: [0, 0.0] for k in ("chain", "completion", "free")}  # origin -> [count, GPU-hours]
    unpaid = [0, 0.0]  # preempted running before training as long as its load took: [count, GPU-hours of load]

    def timed(view, now, trigger):
        clock[0] = now
        t, c = time.perf_counter(), time.process_time()
        out = inner(view, now, trigger)
        dt, dc = (time.perf_counter() - t) * 1e3, (time.process_time() - c) * 1e3
        passes["all"].append(dt)
        if trigger is Trigger.ARRIVAL:
            passes["arrival"].append(dt)
        if any(isinstance(d, (Defer, Evict)) for d in out):  # a preemption was decided or deferred
            passes["decision"].append(dt)
            passes["decision_cpu"].append(dc)
        for d in out:
            if isinstance(d, Evict):
                v = view.job(d.job_id)
                if v.state is JobState.LOADING:
                    cell = futile[origin.get(v.job_id, "completion")]
                    cell[0] += 1
                    cell[1] += (now - v.since) * v.spec.gpus / 3600.0
                elif v.state is JobState.RUNNING and now - v.since < (load := perf.load_time(v.spec.model)):
                    unpaid[0] += 1  # not futile (Eq. 2), but it trained for less time than it had just loaded
                    unpaid[1] += load * v.spec.gpus / 3600.0
                beneficiaries.add(d.reason.rsplit(" ", 1)[-1])  # "...: preempted for JOB"
            elif isinstance(d, Start):
                j = view.job(d.job_id)
                if d.job_id in beneficiaries:
                    origin[d.job_id] = "chain"
                    beneficiaries.discard(d.job_id)
                else:
                    origin[d.job_id] = "free" if j.restarts == 0 and j.spec.submit_time == now else "completion"
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
    for k, (n, gh) in futile.items():
        doc[f"futile_{k}"] = {"count": n, "gpu_h": round(gh, 3)}
    doc["unpaid_load"] = {"count": unpaid[0], "gpu_h": round(unpaid[1], 3)}
    doc["fits"] = len(fits)
    doc["fit_seconds"] = round(sum(fits), 1)
    mem = r.engine.memory
    if mem is not None:
        doc["observations"] = len(mem.optimizer.observations)
        doc["exploiting"] = mem.optimizer.exploiting
        doc["deferrals"] = sum(1 for e in r.engine.log if e.message.startswith("deferred"))
    return doc


class HindsightDeferral:
    """Stands in for Lazer's DeferralOptimizer: X = F of Eq. 4 in hindsight (lazer_opt.ideal_deferral over the
    trace's later arrivals with a shorter remaining time than the newcomer); learns nothing, fits nothing."""

    def __init__(self, jobs, perf, clock: list[float]) -> None:
        import bisect

        from meshsched.estimate import ProfileEstimator
        from meshsched.perf.placement import ideal_placement
        from meshsched.policies.lazer_opt import DeferralOptimizer

        est = ProfileEstimator(perf)
        arrivals = sorted((s.submit_time, s.iterations * est.step_time(s, "v100", ideal_placement(s.gpus, 8)))
                          for s in jobs)
        self._times = [t for t, _ in arrivals]
        self._arrivals, self._clock, self._bisect = arrivals, clock, bisect.bisect_right
        self._inner = DeferralOptimizer()  # only for state(): an empty optimiser

    def decide(self, ctx):
        from meshsched.policies.lazer_opt import HIGH_S, Stage, Suggestion, ideal_deferral

        t0, horizon = self._clock[0], HIGH_S + ctx.max_pause_s + ctx.load_s
        i, later = self._bisect(self._times, t0), []
        while i < len(self._arrivals) and self._arrivals[i][0] - t0 <= horizon:
            if self._arrivals[i][1] < ctx.remaining_s:
                later.append(self._arrivals[i][0] - t0)
            i += 1
        return Suggestion(ideal_deferral(later, ctx.max_pause_s, ctx.load_s), Stage.BOOTSTRAP)

    def observe(self, context, x: float, f: float) -> bool:
        return False

    def needs_fit(self) -> bool:
        return False

    def state(self):
        return self._inner.state()

    @property
    def observations(self) -> tuple:
        return ()


def table(docs: list[dict]) -> str:
    head = ("| regime | policy | JCT mean h | p50 h | p95 h | wait mean h | preempt | futile | futile GPU-h "
            "| of which chain / completion / free GPU-h | decision ms p50 / p99 / mean (n) | its CPU ms mean "
            "| arrival pass ms p50 / p99 / mean | fits (s) | sim s |")
    lines = [head, "|---" * 15 + "|"]
    for d in docs:
        a, p, c = d["pass_arrival_ms"], d["pass_decision_ms"], d["pass_decision_cpu_ms"]
        split = " / ".join(f"{d[f'futile_{k}']['gpu_h']:.2f} ({d[f'futile_{k}']['count']})"
                           for k in ("chain", "completion", "free"))
        lines.append(
            f"| {d['regime']} | {d['policy']} | {d['jct_mean_h']:.3f} | {d['jct_p50_h']:.3f} | {d['jct_p95_h']:.2f} "
            f"| {d['wait_mean_h']:.3f} | {d['preemptions']} | {d['futile_preemptions']} | {d['futile_gpu_h']:.2f} "
            f"| {split} | {p['p50']:.2f} / {p['p99']:.2f} / {p['mean']:.2f} ({p['count']}) | {c['mean']:.2f} "
            f"| {a['p50']:.2f} / {a['p99']:.2f} / {a['mean']:.2f} "
            f"| {d['fits']} ({d['fit_seconds']}) | {d['sim_seconds']} |"
        )
    return "\n".join(lines)


def targets(docs: list[dict]) -> list[dict]:
    """Issue 12's "Done when", per regime and Lazer variant: futile GPU time <= 1/10 of SRTF's (also on the
    chain alone), median JCT <= SRTF's, mean JCT < SJF's."""
    out = []
    by = {(d["regime"], d["policy"]): d for d in docs}
    for (regime, policy), d in by.items():
        srtf, sjf = by.get((regime, "srtf")), by.get((regime, "sjf"))
        if not policy.startswith("lazer") or srtf is None:
            continue

        def ratio(a: float, b: float) -> float | None:
            return round(a / b, 3) if b > 0 else None

        t = {"regime": regime, "policy": policy,
             "futile_gpu_h_vs_srtf": ratio(d["futile_gpu_h"], srtf["futile_gpu_h"]),
             "futile_chain_gpu_h_vs_srtf": ratio(d["futile_chain"]["gpu_h"], srtf["futile_chain"]["gpu_h"]),
             "jct_p50_vs_srtf": ratio(d["jct_p50_h"], srtf["jct_p50_h"])}
        if sjf is not None:
            t["jct_mean_vs_sjf"] = ratio(d["jct_mean_h"], sjf["jct_mean_h"])
        t["met"] = {"futile<=0.1x": t["futile_gpu_h_vs_srtf"] is not None and t["futile_gpu_h_vs_srtf"] <= 0.1,
                    "p50<=srtf": t["jct_p50_vs_srtf"] is not None and t["jct_p50_vs_srtf"] <= 1.0}
        if t.get("jct_mean_vs_sjf") is not None:
            t["met"]["mean<sjf"] = t["jct_mean_vs_sjf"] < 1.0
        out.append(t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--jobs", type=int, default=2000, help="jobs in the slice (default 2000)")
    ap.add_argument("--nodes", type=int, default=8, help="8-GPU V100 servers (default 8)")
    ap.add_argument("--window", choices=("busiest", "first", "full"), default="busiest",
                    help="busiest 2,000-job window, the first --jobs jobs, or the whole trace (with --nodes 64)")
    ap.add_argument("--regimes", default="measured,lazer")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    if a.jobs < 1 or a.nodes < 1 or a.workers < 1:
        ap.error("--jobs, --nodes and --workers must be >= 1")
    tasks = [(r, p, a.jobs, a.nodes, a.window) for r in a.regimes.split(",") for p in a.policies.split(",")]
    with ProcessPoolExecutor(a.workers) as ex:
        docs = list(ex.map(run_one, tasks))
    jobs = "all" if a.window == "full" else a.jobs
    if a.json:
        print(json.dumps({"slice": {"jobs": jobs, "nodes": a.nodes, "gpus": a.nodes * 8, "window": a.window},
                          "runs": docs, "targets": targets(docs)}, indent=1))
    else:
        print(f"Philly {a.window} window, {jobs} jobs, {a.nodes} x 8 V100, seed 1, load 1x")
        print(table(docs))
        for t in targets(docs):
            met = ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in t["met"].items())
            d = next(d for d in docs if (d["regime"], d["policy"]) == (t["regime"], t["policy"]))
            print(f"{t['regime']} {t['policy']}: unpaid loads {d['unpaid_load']['count']} "
                  f"({d['unpaid_load']['gpu_h']:.2f} GPU-h)")
            print(f"{t['regime']} {t['policy']}: futile GPU-h {t['futile_gpu_h_vs_srtf']}x SRTF's "
                  f"(chain alone {t['futile_chain_gpu_h_vs_srtf']}x), median JCT {t['jct_p50_vs_srtf']}x SRTF's"
                  + (f", mean JCT {t['jct_mean_vs_sjf']}x SJF's" if "jct_mean_vs_sjf" in t else "") + f": {met}")


if __name__ == "__main__":
    main()
