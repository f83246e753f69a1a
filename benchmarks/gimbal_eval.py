"""X against X+gimbal on a Philly window or the full trace: mean JCT, deadline satisfaction, makespan, calibration cost.

    python benchmarks/gimbal_eval.py [--window 729.865:740 | --window all] [--jobs 2000] [--load 1.5] [--nodes 64]
                                     [--gpus-per-node 8] [--placements sjf-ffs,castor,lucid]
                                     [--objectives jct,deadline,makespan] [--horizon drain] [--seed 1]
                                     [--policies STACK,...] [--records DIR] [--json]
    python benchmarks/gimbal_eval.py --merge RUN.json ... [--json]   # one table from several --json outputs
    python benchmarks/gimbal_eval.py --why X.csv X+gimbal.csv [--json]  # where the difference comes from (--records)

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

`--window all` replays the full trace (every job; `--jobs` then defaults to all). `--policies` names the stacks to
run instead of the placements x objectives product (to split a long evaluation over several processes;
`--merge` prints their --json outputs as one table). `--records DIR` writes one CSV per stack with each job's
record (sim/metrics.py's columns) plus what Gimbal did to it: whether it started sharing, its searches, its
Reconfigures, its LGRR changes and its final MPS share. `--why` reads two such files (X, then X+gimbal) and
splits the change in mean JCT, deadlines met and makespan over the jobs Gimbal calibrated, the other jobs
that shared a GPU in either run, and the jobs that never shared (and shows the last job to finish in each).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

CALIBRATION_COLUMNS = ("shared", "searches", "reconfigures", "lgrr_changes", "final_mps")


def write_records(path: Path, result, shared: set[str]) -> None:
    """One row per job: sim/metrics.py's job record plus what the calibration layer did to the job."""
    from meshsched.sim.metrics import JOB_COLUMNS, job_row

    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=(*JOB_COLUMNS, *CALIBRATION_COLUMNS))
        w.writeheader()
        for job in result.engine.state.jobs.values():
            m = job.calibration
            w.writerow({**job_row(job), "shared": int(job.job_id in shared),
                        "searches": m.searches if m else 0, "reconfigures": m.changes if m else 0,
                        "lgrr_changes": m.lgrr_changes if m else 0,
                        "final_mps": job.exec.mps_percentage if job.exec is not None else 100})


def run_one(trace_jobs, policy: str, perf, cluster, records: Path | None = None) -> dict:
    from meshsched.sim.loop import simulate
    from meshsched.sim.metrics import summarise
    from meshsched.loaders.profiles import installed_handle
    from meshsched.policies.registry import make_policy

    stack = make_policy(policy, installed_handle())
    t0, c0 = time.perf_counter(), time.process_time()
    r = simulate(trace_jobs, stack, perf, cluster)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = summarise(r, policy)
    jobs = r.engine.state.jobs.values()
    memos = [j.calibration for j in jobs if j.calibration is not None]
    share_log = getattr(stack.placement, "share_log", {})  # jobs started next to a partner
    if records is not None:
        write_records(records / f"{policy.replace(':', '_').replace('=', '-')}.csv", r, set(share_log))
    return {
        "policy": policy, "jobs": s.jobs, "completed": s.completed, "jct_mean_h": s.jct_mean_h,
        "jct_p50_h": s.jct_p50_h, "wait_mean_h": s.wait_mean_h, "makespan_h": s.makespan_h,
        "deadline_met": s.deadline_met, "shared_jobs": len(share_log),
        "searches": sum(m.searches for m in memos), "reconfigures": sum(m.changes for m in memos),
        "lgrr_changes": sum(m.lgrr_changes for m in memos),
        "lgrr_paid_h": sum(m.lgrr_paid_s for m in memos) / 3600,
        "search_lgrr_h": sum(m.search_lgrr_s for m in memos) / 3600,
        "sim_seconds": round(wall, 1), "cpu_seconds": round(cpu, 1),
    }


def base_of(policy: str) -> str:
    """The placement X under `policy` (X+gimbal:... -> X)."""
    return policy.split("+")[0]


def print_table(setting: dict, rows: list[dict]) -> None:
    print(f"Philly {'full trace' if setting['window_h'] == 'all' else 'window ' + setting['window_h'] + ' h'}, "
          f"{setting['jobs']} jobs, load {setting['load']:g}x, {setting['cluster']}, seed {setting['seed']}")
    head = ("policy", "JCT h", "vs X", "deadline met", "vs X", "makespan h", "vs X", "jobs started sharing",
            "searches", "reconfigures", "LGRR", "LGRR paid h", "live-search LGRR h", "CPU s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    base = {r["policy"]: r for r in rows if "+" not in r["policy"]}

    def rel(r: dict, key: str, points: bool = False) -> str:
        b = base.get(base_of(r["policy"]))
        if b is None or b is r or not b[key] or r[key] is None:
            return ""
        return f"{(r[key] - b[key]) * 100:+.1f} pt" if points else f"{r[key] / b[key] - 1:+.1%}"

    for r in rows:
        name = r["policy"].replace(":horizon=drain", "")
        print(f"| {name} | {r['jct_mean_h']:.3f} | {rel(r, 'jct_mean_h')} | {r['deadline_met']:.1%} "
              f"| {rel(r, 'deadline_met', points=True)} | {r['makespan_h']:.1f} | {rel(r, 'makespan_h')} "
              f"| {r['shared_jobs']} | {r['searches']} | {r['reconfigures']} | {r['lgrr_changes']} "
              f"| {r['lgrr_paid_h']:.2f} | {r['search_lgrr_h']:.2f} | {r.get('cpu_seconds', '')} |")


def merge(paths: list[str], as_json: bool) -> int:
    setting, rows = None, []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
            s, runs = data["setting"], data["runs"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"gimbal_eval: {path}: not a gimbal_eval --json output ({exc})", file=sys.stderr)
            return 2
        if setting is not None and s != setting:
            print(f"gimbal_eval: {path}: another setting ({s}) than {paths[0]} ({setting})", file=sys.stderr)
            return 2
        setting = s
        rows += runs
    rows.sort(key=lambda r: (base_of(r["policy"]), "+" in r["policy"], r["policy"]))
    if as_json:
        print(json.dumps({"setting": setting, "runs": rows}, indent=1))
    else:
        print_table(setting, rows)
    return 0


def _read_records(path: str) -> dict[str, dict]:
    with open(path, newline="") as fh:
        return {r["job_id"]: r for r in csv.DictReader(fh)}


def why(base_path: str, cal_path: str, as_json: bool) -> int:
    """Where X+gimbal's difference from X comes from, job by job (two --records files)."""
    try:
        base, cal = _read_records(base_path), _read_records(cal_path)
    except (OSError, KeyError, csv.Error) as exc:
        print(f"gimbal_eval: {exc}", file=sys.stderr)
        return 2
    both = [k for k in base if k in cal and base[k]["jct"] and cal[k]["jct"]]
    if not both:
        print("gimbal_eval: no job completed in both runs", file=sys.stderr)
        return 2

    def group(k: str) -> str:
        if int(cal[k]["reconfigures"]):
            return "calibrated" + (" (LGRR)" if int(cal[k]["lgrr_changes"]) else " (LISS only)")
        if int(cal[k]["shared"]) or int(base[k]["shared"]):
            return "shared, not calibrated"
        return "never shared"

    groups: dict[str, list[str]] = {}
    for k in both:
        groups.setdefault(group(k), []).append(k)
    rows = []
    for name, keys in sorted(groups.items()):
        jx = [float(base[k]["jct"]) for k in keys]
        jg = [float(cal[k]["jct"]) for k in keys]
        met = lambda recs: sum(1 for k in keys if recs[k]["deadline_met"] == "1")  # noqa: E731
        rows.append({"group": name, "jobs": len(keys), "gpus_mean": sum(int(base[k]["gpus"]) for k in keys) / len(keys),
                     "jct_x_h": sum(jx) / len(keys) / 3600, "jct_gimbal_h": sum(jg) / len(keys) / 3600,
                     "share_of_mean_change_h": (sum(jg) - sum(jx)) / len(both) / 3600,
                     "faster": sum(g < x for g, x in zip(jg, jx)), "slower": sum(g > x for g, x in zip(jg, jx)),
                     "deadline_met_x": met(base), "deadline_met_gimbal": met(cal)})
    last = {}
    for label, recs in (("x", base), ("gimbal", cal)):
        k = max((k for k in recs if recs[k]["finish_time"]), key=lambda k: float(recs[k]["finish_time"]))
        r = recs[k]
        last[label] = {"job_id": k, "gpus": int(r["gpus"]), "submit_h": float(r["submit_time"]) / 3600,
                       "finish_h": float(r["finish_time"]) / 3600, "wait_h": float(r["wait_time"]) / 3600,
                       "run_h": float(r["run_time"]) / 3600, "reconfigures": int(r.get("reconfigures") or 0)}
    out = {"x": base_path, "gimbal": cal_path, "jobs": len(both), "groups": rows, "last_to_finish": last}
    if as_json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{len(both)} jobs completed in both runs ({base_path} -> {cal_path})")
    print("| jobs | n | mean GPUs | JCT X h | JCT X+gimbal h | part of the mean's change h | faster | slower "
          "| deadlines met X | X+gimbal |")
    print("|" + "---|" * 10)
    for r in rows:
        print(f"| {r['group']} | {r['jobs']} | {r['gpus_mean']:.1f} | {r['jct_x_h']:.3f} | {r['jct_gimbal_h']:.3f} "
              f"| {r['share_of_mean_change_h']:+.3f} | {r['faster']} | {r['slower']} | {r['deadline_met_x']} "
              f"| {r['deadline_met_gimbal']} |")
    for label, r in last.items():
        print(f"last to finish ({label}): job {r['job_id']}, {r['gpus']} GPUs, submitted {r['submit_h']:.1f} h, "
              f"waited {r['wait_h']:.1f} h, ran {r['run_h']:.1f} h, finished {r['finish_h']:.1f} h, "
              f"{r['reconfigures']} Reconfigure(s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", default="729.865:740",
                    help="hours since the trace's first arrival, A:B; 'all' for the full trace")
    ap.add_argument("--jobs", type=int, default=None,
                    help="first N jobs (default 2000 in a window, all with --window all)")
    ap.add_argument("--load", type=float, default=1.5)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--placements", default="sjf-ffs,castor,lucid")
    ap.add_argument("--objectives", default="jct,deadline,makespan")
    ap.add_argument("--horizon", default="drain", choices=("drain", "static"))
    ap.add_argument("--policies", default="", help="stacks to run (instead of placements x objectives)")
    ap.add_argument("--records", type=Path, help="write each stack's per-job records (CSV) into this folder")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--merge", nargs="+", metavar="RUN.json", help="print one table from gimbal_eval --json outputs")
    ap.add_argument("--why", nargs=2, metavar=("X.csv", "XGIMBAL.csv"),
                    help="explain a difference from two --records files")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.why:
        return why(*a.why, a.json)
    if a.merge:
        return merge(a.merge, a.json)
    from meshsched.loaders.profiles import load_perf_model
    from meshsched.policies.registry import UnknownPolicy, parse_policy
    from meshsched.sim.loop import ClusterSpec
    from meshsched.loaders.traces import TraceError, TraceOptions, load_trace

    try:
        if a.window == "all":
            window, first_n = None, a.jobs
        else:
            start, end = (float(x) * 3600 for x in a.window.split(":"))
            window, first_n = (start, end), 2000 if a.jobs is None else a.jobs
        perf = load_perf_model()
        opts = TraceOptions(gpu_type="v100", gpus_per_node=a.gpus_per_node, seed=a.seed, load=a.load,
                            window=window, first_n=first_n)
        trace = load_trace("philly", perf, opts)
        cluster = ClusterSpec(a.nodes, a.gpus_per_node, "v100", perf.gpu_memory_mb("v100"))
        if a.policies:
            policies = a.policies.split(",")
        else:
            policies = []
            for x in a.placements.split(","):
                policies.append(x)
                policies += [f"{x}+gimbal:objective={o}:horizon={a.horizon}" for o in a.objectives.split(",")]
        for p in policies:
            parse_policy(p)
        if a.records is not None:
            a.records.mkdir(parents=True, exist_ok=True)
    except (ValueError, TraceError, UnknownPolicy, OSError) as exc:
        print(f"gimbal_eval: {exc}", file=sys.stderr)
        return 2
    rows = []
    for p in policies:
        rows.append(run_one(trace.jobs, p, perf, cluster, a.records))
        print(f"  {p}: {rows[-1]['sim_seconds']} s wall, {rows[-1]['cpu_seconds']} s CPU", file=sys.stderr, flush=True)
    setting = {"window_h": a.window, "jobs": len(trace.jobs), "load": a.load, "cluster": cluster.describe(),
               "seed": a.seed}
    if a.json:
        print(json.dumps({"setting": setting, "runs": rows}, indent=1))
    else:
        print_table(setting, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
