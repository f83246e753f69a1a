"""Castor vs the sharing and queue baselines on the Philly trace: the tables of docs/results/castor.md.

    python benchmarks/castor_eval.py --out results/castor [--workers 2]

Settings: the full trace and its busiest 2,000-job window (the 2,000 consecutive arrivals with the most
requested GPU-hours per hour: jobs 8,901-10,900, hours 729.87-736.64 since the first arrival), each at
load 1x, 1.5x, 2x, on 64 x 8 V100, seed 1. The same runs as

    mesh simulate --trace philly --policy castor,sjf-ffs,lucid,sjf,las,srtf --nodes 64 --seed 1 --load L
    mesh simulate --trace philly --policy ... --window 729.865:740 --jobs 2000 --load L

plus what `mesh simulate` does not print: Castor's sharing benefit (eq. 24) and the JCT split by job size
(<= 8 GPUs, > 8 GPUs) as in Castor's Tables 5 and 6. Writes one JSON per (setting, policy) and summary.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

POLICIES = ("castor", "sjf-ffs", "lucid", "sjf", "las", "srtf")
WINDOW = (729.865 * 3600, 740 * 3600)
SETTINGS = {f"{t}-x{load:g}": (t, load) for t in ("full", "window") for load in (1.0, 1.5, 2.0)}


def run_one(args: tuple[str, str, str]) -> dict:
    import numpy as np

    from meshsched.loaders.profiles import load_perf_model
    from meshsched.loaders.profiles import installed_handle
    from meshsched.policies.registry import make_policy
    from meshsched.sim.loop import ClusterSpec, simulate
    from meshsched.sim.metrics import sharing_summary, summarise, summary_dict
    from meshsched.loaders.traces import TraceOptions, load_trace
    from meshsched.state import JobState

    setting, policy, out = args
    kind, load = SETTINGS[setting]
    perf = load_perf_model()
    opts = TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, load=load,
                        window=WINDOW if kind == "window" else None, first_n=2000 if kind == "window" else None)
    tr = load_trace("philly", perf, opts)
    t0 = time.perf_counter()
    r = simulate(tr.jobs, make_policy(policy, installed_handle()), perf, ClusterSpec(64, 8, "v100", perf.gpu_memory_mb("v100")))
    wall = time.perf_counter() - t0
    doc = dict(summary_dict(summarise(r, policy)), setting=setting, sim_seconds=round(wall, 1))
    sh = sharing_summary(r)
    if sh is not None:
        doc["sharing"] = {k: (None if v != v else v) for k, v in sh.__dict__.items()}
    done = [j for j in r.engine.state.jobs.values() if j.state is JobState.COMPLETED]
    for label, pick in (("small", lambda g: g <= 8), ("large", lambda g: g > 8)):
        jct = np.array([j.acct.finish_time - j.spec.submit_time for j in done if pick(j.spec.gpus)]) / 3600
        wait = np.array([j.acct.wait_time for j in done if pick(j.spec.gpus)]) / 3600
        doc[f"{label}_jobs"] = int(jct.size)
        doc[f"{label}_jct_mean_h"] = float(jct.mean()) if jct.size else None
        doc[f"{label}_wait_mean_h"] = float(wait.mean()) if wait.size else None
    doc["first_job"] = tr.jobs[0].job_id
    Path(out, f"{setting}-{policy}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("results/castor"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", action="store_true", help="print every (setting, policy) result as one JSON list")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    tasks = [(s, p, str(a.out)) for s in a.settings.split(",") for p in a.policies.split(",")
             if not (a.out / f"{s}-{p}.json").exists()]
    with ProcessPoolExecutor(a.workers) as ex:
        for doc in ex.map(run_one, tasks):
            print(doc["setting"], doc["policy"], f"JCT {doc['jct_mean_h']:.3f} h", f"{doc['sim_seconds']} s", flush=True,
                  file=sys.stderr if a.json else sys.stdout)
    if a.json:
        print(json.dumps([json.loads(p.read_text()) for p in sorted(a.out.glob("*-*.json"))], indent=1))
        return
    write_tables(a.out)


def write_tables(out: Path) -> None:
    lines = []
    for setting in SETTINGS:
        docs = [json.loads(p.read_text()) for p in sorted(out.glob(f"{setting}-*.json"))]
        if not docs:
            continue
        docs.sort(key=lambda d: POLICIES.index(d["policy"]) if d["policy"] in POLICIES else 99)
        lines += [f"### {setting}", "",
                  "| policy | JCT mean h | p50 | p95 | p99 | wait mean h | makespan h | util | <=8 GPUs JCT | >8 GPUs JCT | shared jobs | sharing benefit mean (p50) | benefit < 1 | preempt | sim s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for d in docs:
            sh = d.get("sharing") or {}
            ben = f"{sh['benefit_mean']:.2f} ({sh['benefit_p50']:.2f})" if sh.get("benefit_mean") is not None else "-"
            lines.append(
                f"| {d['policy']} | {d['jct_mean_h']:.3f} | {d['jct_p50_h']:.3f} | {d['jct_p95_h']:.2f} | {d['jct_p99_h']:.1f} "
                f"| {d['wait_mean_h']:.3f} | {d['makespan_h']:.0f} | {d['gpu_utilisation']:.1%} "
                f"| {d['small_jct_mean_h']:.3f} ({d['small_jobs']}) | {(d['large_jct_mean_h'] or 0):.3f} ({d['large_jobs']}) "
                f"| {sh.get('shared_jobs', '-')} | {ben} | {'-' if sh.get('benefit_below_1') is None else format(sh['benefit_below_1'], '.1%')} "
                f"| {d['preemptions']} | {d['sim_seconds']} |"
            )  # fmt: skip
        lines.append("")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
