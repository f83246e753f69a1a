"""X against X+gimbal on a Philly slice: mean JCT, deadline satisfaction, makespan, and what calibration cost.

    python benchmarks/gimbal_eval.py [--window 729.865:740] [--jobs 2000] [--load 1.5] [--nodes 64]
                                     [--gpus-per-node 8] [--placements sjf-ffs,castor,lucid]
                                     [--objectives jct,deadline,makespan] [--horizon drain] [--seed 1] [--json]

For each placement X: X alone, then X+gimbal:objective=O for each objective O (as the paper pairs them:
Lucid with JCT, Gandiva with deadlines, Gavel with makespan; here every X gets every O). The same replay as
`mesh simulate --trace philly --window A:B --jobs N --load L --nodes K --policy X+gimbal:objective=O`.
Columns: mean JCT (h), deadline satisfaction (jobs with a deadline that met it), makespan (h), how many jobs
started next to a partner, Gimbal's searches and Reconfigures, the LGRR (MPS-share) changes applied and the switch
time they cost in the simulator (3.6 s each, the paper's measured switch with a CUDA context pool; in meshd
each is a checkpoint-restart instead), and the switch time Algorithm 1 would have paid had it explored on the
live jobs as the paper does (`search_lgrr_h`; here it searches on the MPS-share model's predictions). The
simulator's truth for calibrated jobs is the same MPS-share model the policy predicts with (perf/mps_share.py,
fitted to six H100 jobs and used unscaled on the V100 cluster), so the figures show what Algorithm 1 makes of a
model it knows exactly, not what it would make of a real GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def run_one(trace_jobs, policy: str, perf, cluster) -> dict:
    from meshsched.sim.loop import simulate
    from meshsched.sim.metrics import summarise
    from meshsched.policies.registry import make_policy

    stack = make_policy(policy)
    t0 = time.perf_counter()
    r = simulate(trace_jobs, stack, perf, cluster)
    wall = time.perf_counter() - t0
    s = summarise(r, policy)
    jobs = r.engine.state.jobs.values()
    memos = [j.calibration for j in jobs if j.calibration is not None]
    shared = len(getattr(stack.placement, "share_log", {}))  # jobs started next to a partner
    return {
        "policy": policy, "jobs": s.jobs, "completed": s.completed, "jct_mean_h": s.jct_mean_h,
        "jct_p50_h": s.jct_p50_h, "wait_mean_h": s.wait_mean_h, "makespan_h": s.makespan_h,
        "deadline_met": s.deadline_met, "shared_jobs": shared,
        "searches": sum(m.searches for m in memos), "reconfigures": sum(m.changes for m in memos),
        "lgrr_changes": sum(m.lgrr_changes for m in memos),
        "lgrr_paid_h": sum(m.lgrr_paid_s for m in memos) / 3600,
        "search_lgrr_h": sum(m.search_lgrr_s for m in memos) / 3600,
        "sim_seconds": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", default="729.865:740", help="hours since the trace's first arrival, A:B")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--load", type=float, default=1.5)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--placements", default="sjf-ffs,castor,lucid")
    ap.add_argument("--objectives", default="jct,deadline,makespan")
    ap.add_argument("--horizon", default="drain", choices=("drain", "static"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from meshsched.perf import load_perf_model
    from meshsched.policies.registry import UnknownPolicy, parse_policy
    from meshsched.sim.loop import ClusterSpec
    from meshsched.sim.traces import TraceError, TraceOptions, load_trace

    try:
        start, end = (float(x) * 3600 for x in a.window.split(":"))
        perf = load_perf_model()
        opts = TraceOptions(gpu_type="v100", gpus_per_node=a.gpus_per_node, seed=a.seed, load=a.load,
                            window=(start, end), first_n=a.jobs)
        trace = load_trace("philly", perf, opts)
        cluster = ClusterSpec(a.nodes, a.gpus_per_node, "v100", perf.gpu_memory_mb("v100"))
        policies = []
        for x in a.placements.split(","):
            policies.append(x)
            policies += [f"{x}+gimbal:objective={o}:horizon={a.horizon}" for o in a.objectives.split(",")]
        for p in policies:
            parse_policy(p)
    except (ValueError, TraceError, UnknownPolicy) as exc:
        print(f"gimbal_eval: {exc}", file=sys.stderr)
        return 2
    rows = []
    for p in policies:
        rows.append(run_one(trace.jobs, p, perf, cluster))
        if not a.json:
            print(f"  {p}: {rows[-1]['sim_seconds']} s", file=sys.stderr, flush=True)
    setting = {"window_h": a.window, "jobs": len(trace.jobs), "load": a.load, "cluster": cluster.describe(),
               "seed": a.seed, "horizon": a.horizon}
    if a.json:
        print(json.dumps({"setting": setting, "runs": rows}, indent=1))
        return 0
    print(f"Philly window {a.window} h, {len(trace.jobs)} jobs, load {a.load:g}x, {cluster.describe()}, "
          f"seed {a.seed}, horizon {a.horizon}")
    head = ("policy", "JCT h", "vs X", "deadline met", "makespan h", "jobs started sharing", "searches", "reconfigures",
            "LGRR", "LGRR paid h", "live-search LGRR h")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    base = {}
    for r in rows:
        x = r["policy"].split("+")[0]
        base.setdefault(x, r)
        rel = r["jct_mean_h"] / base[x]["jct_mean_h"] - 1
        print(f"| {r['policy'].replace(':horizon=' + a.horizon, '')} | {r['jct_mean_h']:.3f} | {rel:+.1%} "
              f"| {r['deadline_met']:.1%} | {r['makespan_h']:.1f} | {r['shared_jobs']} | {r['searches']} "
              f"| {r['reconfigures']} | {r['lgrr_changes']} | {r['lgrr_paid_h']:.2f} | {r['search_lgrr_h']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
