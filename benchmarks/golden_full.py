"""Golden replays of every policy on the full Philly trace (and the busiest window at 2x): summaries and a
digest of every job's start, finish and preemptions, to check that a refactor changes no decision.

    python benchmarks/golden_full.py --out results/golden.json [--policy sjf,srtf] [--json]
    python benchmarks/golden_full.py --check benchmarks/golden/philly_full.json   # compare against the saved digests

Settings: 64 x 8 V100, seed 1 (the tables of docs/results/baselines.md). A full run of every policy takes about
25 CPU-minutes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

POLICIES = ("fifo", "sjf", "srtf", "las", "srtf@60", "srtf@360", "srtf@600", "castor", "sjf-ffs", "lucid")
WINDOW = (729.865 * 3600, 740 * 3600)
SETTINGS = {"full-x1": (None, None, 1.0), "window-x2": (WINDOW, 2000, 2.0)}


def run_one(args: tuple[str, str]) -> dict:
    from meshsched.loaders.profiles import load_perf_model
    from meshsched.loaders.profiles import installed_handle
    from meshsched.policies.registry import make_policy
    from meshsched.sim.loop import ClusterSpec, simulate
    from meshsched.sim.metrics import summarise, summary_dict
    from meshsched.loaders.traces import TraceOptions, load_trace

    setting, policy = args
    window, first_n, load = SETTINGS[setting]
    perf = load_perf_model()
    opts = TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, load=load, window=window, first_n=first_n)
    tr = load_trace("philly", perf, opts)
    t0 = time.perf_counter()
    r = simulate(tr.jobs, make_policy(policy, installed_handle()), perf, ClusterSpec(64, 8, "v100", perf.gpu_memory_mb("v100")))
    wall = time.perf_counter() - t0
    h = hashlib.sha256()
    for j in sorted(r.engine.state.jobs.values(), key=lambda j: j.spec.job_id):
        a = j.acct
        h.update(f"{j.spec.job_id},{j.state.value},{_r(a.first_start)},{_r(a.finish_time)},{a.preemptions}\n".encode())
    s = summary_dict(summarise(r, policy))
    return {"setting": setting, "policy": policy, "digest": h.hexdigest(), "jct_mean_h": s["jct_mean_h"],
            "completed": s["completed"], "preemptions": s["preemptions"], "events": s["events"],
            "sim_seconds": round(wall, 1)}


def _r(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default=",".join(POLICIES))
    ap.add_argument("--setting", default=",".join(SETTINGS))
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--check", type=Path, help="compare every run against this saved file")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    tasks = [(s, p) for s in a.setting.split(",") for p in a.policy.split(",")]
    with ProcessPoolExecutor(a.workers) as pool:
        results = []
        for r in pool.map(run_one, tasks):
            results.append(r)
            if not a.json:
                print(f"{r['setting']:10} {r['policy']:9} jct {r['jct_mean_h']:.4f} h  digest {r['digest'][:12]}  "
                      f"{r['sim_seconds']:.1f}s", flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(results, indent=1) + "\n")
    bad = []
    if a.check:
        want = {(r["setting"], r["policy"]): r for r in json.loads(a.check.read_text())}
        for r in results:
            w = want.get((r["setting"], r["policy"]))
            if w is not None and w["digest"] != r["digest"]:
                bad.append(f"{r['setting']} {r['policy']}: digest moved (jct {w['jct_mean_h']:.4f} -> {r['jct_mean_h']:.4f} h)")
    if a.json:
        print(json.dumps({"results": results, "mismatches": bad}, indent=1))
    for b in bad:
        print("MISMATCH", b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
