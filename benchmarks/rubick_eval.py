"""Rubick against the Sia-like and Synergy-like allocators in the simulator (issue 14; Rubick Table 4).

    python benchmarks/rubick_eval.py [--json] [--jobs 406] [--nodes 8] [--seed 0] [--quota 64]
                                     [--policies rubick,sia,synergy] [--variants] [--cpus-per-node 96]

The workload (`meshsched.sim.rubick_trace`, as the paper builds its trace): the busiest 12 hours of the
built-in Philly trace (by GPU-hours asked, durations capped at 6 h), down-sampled to JOBS jobs (the paper's
406 by default), seeded; each job a model drawn from the A800 plan profiles (profiles/plans_a800.json), its
GPU count made feasible for the model, a random asked plan among those that fit (no TP/PP for the small
models), 4 CPUs per GPU; half the jobs in tenant A (guaranteed, quota QUOTA GPUs: the paper gives tenant A
the whole cluster), half in B (best-effort): the paper's multi-tenant trace. Cluster: NODES x 8 A800 80 GB
with 96 CPUs and 1,600 GB each (the paper's testbed). Truth: the plan model; every restart (preemption,
reallocation, plan change) costs 78 s (the paper's mean reconfiguration time).

Per policy: mean / p99 JCT of all, guaranteed and best-effort jobs, mean wait, makespan, restarts (jobs
checkpointed and requeued), in-place reconfigurations, and `below`: how many (job, allocation) intervals a
guaranteed job spent training slower than its asked plan on its asked resources (Rubick must have 0; the
baselines do not know guarantees). `--variants` adds Rubick-E (plans only), -R (resources only), -N (neither).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from meshsched.loaders.profiles import load_plan_catalog
from meshsched.perf.placement import ideal_placement
from meshsched.perf.plans import ExecutionPlan, PlanPerfModel, Resources, iteration_time
from meshsched.policies.registry import make_policy
from meshsched.policies.stack import PolicyHandle
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.loaders.traces import load_plan_trace
from meshsched.sim.rubick_trace import WorkloadOptions
from meshsched.state import JobState

NODE_GPUS = 8


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


class GuaranteeWatch:
    """After every event: each guaranteed job training under a new allocation is checked once against the
    iteration time of its asked plan on its asked resources (compact placement, asked CPUs)."""

    def __init__(self, perf: PlanPerfModel) -> None:
        self.perf = perf
        self.seen: set[tuple] = set()
        self.intervals = 0
        self.below: list[str] = []
        self._base: dict[str, float] = {}

    def base_s(self, spec) -> float:
        if spec.job_id not in self._base:
            res = Resources(ideal_placement(spec.gpus, NODE_GPUS), float(-(-spec.cpus // spec.gpus)))
            self._base[spec.job_id] = iteration_time(self.perf.profile(spec.model), ExecutionPlan.parse(spec.plan),
                                                     res, self.perf.env)
        return self._base[spec.job_id]

    def __call__(self, engine) -> None:
        state = engine.state
        for job in engine.view().holding():
            if job.state is not JobState.RUNNING or not job.spec.guaranteed or job.exec is None:
                continue
            key = (job.job_id, job.exec, job.gpus)
            if key in self.seen:
                continue
            self.seen.add(key)
            self.intervals += 1
            shape = tuple(sorted(_per_node(state, job.gpus), reverse=True))
            t = self.perf.plan_iteration_time(job.spec.model, job.exec, shape)
            if t > self.base_s(job.spec) * (1 + 1e-9):
                self.below.append(f"{job.job_id}: {t:.3f} s/step on {job.exec.plan} x {shape}, asked "
                                  f"{self.base_s(job.spec):.3f}")


def _per_node(state, gpus) -> list[int]:
    out: dict[str, int] = {}
    for g in gpus:
        out[state.gpus[g].node] = out.get(state.gpus[g].node, 0) + 1
    return list(out.values())


def run(policy: str, jobs, perf: PlanPerfModel, cluster: ClusterSpec) -> dict:
    watch = GuaranteeWatch(perf)
    stack = make_policy(policy, PolicyHandle(perf=perf))
    t0 = time.perf_counter()
    r = simulate(jobs, stack, perf, cluster, after_event=watch)
    wall = time.perf_counter() - t0
    all_jobs = list(r.engine.state.jobs.values())
    done = [j for j in all_jobs if j.state is JobState.COMPLETED]
    jct = lambda js: [(j.acct.finish_time - j.spec.submit_time) / 3600 for j in js]  # noqa: E731
    g = [j for j in done if j.spec.guaranteed]
    b = [j for j in done if not j.spec.guaranteed]
    reconf = sum(1 for e in r.engine.log if e.message.startswith("reconfigure to"))
    return {
        "policy": policy, "jobs": len(all_jobs), "completed": len(done),
        "refused": sum(1 for j in all_jobs if j.state is JobState.FAILED),
        "jct_mean_h": statistics.fmean(jct(done)) if done else float("nan"),
        "jct_p99_h": _pct(jct(done), 99),
        "jct_guaranteed_h": statistics.fmean(jct(g)) if g else float("nan"),
        "jct_best_effort_h": statistics.fmean(jct(b)) if b else float("nan"),
        "wait_mean_h": statistics.fmean(j.acct.wait_time / 3600 for j in done) if done else float("nan"),
        "makespan_h": max((j.acct.finish_time for j in done), default=0.0) / 3600,
        "restarts": sum(j.acct.preemptions for j in all_jobs),
        "reconfigurations": reconf,
        "guaranteed_intervals": watch.intervals,
        "below_guarantee": len(watch.below),
        "below_examples": watch.below[:3],
        "sim_seconds": round(wall, 1),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=406)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quota", type=int, default=None, help="tenant A's guaranteed GPUs (default: the cluster)")
    ap.add_argument("--cpus-per-node", type=int, default=None, help="CPUs per server (default 96, the paper's)")
    ap.add_argument("--policies", default="rubick,sia,synergy")
    ap.add_argument("--variants", action="store_true", help="add Rubick-E, -R and -N")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    perf = PlanPerfModel(load_plan_catalog())
    quota = a.quota if a.quota is not None else a.nodes * NODE_GPUS
    cluster = ClusterSpec(a.nodes, NODE_GPUS, "a800", perf.gpu_memory_mb("a800"), cpus_per_node=a.cpus_per_node)
    jobs = load_plan_trace("philly", perf, WorkloadOptions(jobs=a.jobs, max_gpus=cluster.total_gpus, seed=a.seed))
    names = [p.strip() for p in a.policies.split(",") if p.strip()]
    if a.variants:
        names += ["rubick:variant=e", "rubick:variant=r", "rubick:variant=n"]
    rows = []
    for name in names:
        spec = f"{name}:quotas=A={quota}" if name.split(":")[0] == "rubick" else name
        row = run(spec, jobs, perf, cluster)
        row["policy"] = name
        rows.append(row)
    meta = {"jobs": len(jobs), "guaranteed": sum(j.guaranteed for j in jobs), "nodes": a.nodes,
            "gpus": cluster.total_gpus, "seed": a.seed, "quota_A": quota,
            "cpus_per_node": cluster.node_specs()[0].cpu_count}
    if a.json:
        print(json.dumps({**meta, "policies": rows}, indent=2))
        return
    print(f"Philly busiest 12 h, {meta['jobs']} jobs ({meta['guaranteed']} guaranteed, tenant A quota {quota} GPUs) "
          f"on {a.nodes} x 8 A800 with {meta['cpus_per_node']} CPUs each, seed {a.seed}")
    head = ("policy", "done", "JCT h", "p99 h", "guar h", "BE h", "wait h", "span h", "restarts", "reconf",
            "below", "sim s")
    print(" ".join(f"{h:>9}" for h in head))
    for r in rows:
        cells = (r["policy"], r["completed"], f"{r['jct_mean_h']:.2f}", f"{r['jct_p99_h']:.1f}",
                 f"{r['jct_guaranteed_h']:.2f}", f"{r['jct_best_effort_h']:.2f}", f"{r['wait_mean_h']:.2f}",
                 f"{r['makespan_h']:.1f}", r["restarts"], r["reconfigurations"],
                 f"{r['below_guarantee']}/{r['guaranteed_intervals']}", r["sim_seconds"])
        print(" ".join(f"{c:>9}" for c in cells))
    base = {r["policy"]: r["jct_mean_h"] for r in rows}
    if "rubick" in base:
        for other in ("sia", "synergy"):
            if other in base:
                print(f"rubick mean JCT is {base[other] / base['rubick']:.2f}x lower than {other}-like")


if __name__ == "__main__":
    main()
