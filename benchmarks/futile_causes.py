"""Where a stack's futile preemptions come from (issue 26 point 3), on a setting of unified_eval: Philly's busy
window by default (window-x1.5: the busiest 2,000 jobs at 1.5x on 8 x 8 V100), or the full trace at 1x or 1.5x on
64 x 8 (full-x1, full-x1.5), seed 1, `--plan-jobs 0`.

    python benchmarks/futile_causes.py [--policy castor+lazer] [--jobs 2000] [--json]
    python benchmarks/futile_causes.py --setting full-x1.5 --jobs 20000   # the full trace's first jobs at 1.5x, 64 x 8

One `mesh simulate` run in this process, every pass's decisions read as they leave the stack. Per futile
preemption (an Evict of a job still loading, Lazer Eq. 2): whether its load was a restart (it had been preempted
before) or its first; how that load began (`release`: a release pass started it, for Castor its own sharing
pass; `arrival`: on free GPUs at its arrival; `chain`: it was started for a job something was preempted for;
`tick`: at a deferral's end); whether it had been started beside a partner; whether a partner still shared its
GPUs when it was preempted and stayed (the preemption freed no GPU there); the pass that preempted it (an
arrival, or a deferral's end: TICK). Over all preemptions: how many hit a job sharing GPUs, how many left a
partner on them, and the `unpaid` loads (a running job preempted before it had trained as long as its load
took: not futile by Eq. 2, but its load is as good as lost), with their GPU-hours. Not a test.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import sys
import time

COMMON = ["--plan-jobs", "0", "--seed", "1"]
SETTINGS = {  # as in unified_eval.py
    "window-x1.5": ["--trace", "philly", "--window", "729.865:740", "--load", "1.5", "--nodes", "8", *COMMON],
    "full-x1": ["--trace", "philly", "--load", "1", "--nodes", "64", *COMMON],
    "full-x1.5": ["--trace", "philly", "--load", "1.5", "--nodes", "64", *COMMON],
}


def run(policy: str, jobs: int | None, setting: str = "window-x1.5") -> dict:
    from meshsched.cli.main import main

    from meshsched.policies import stack as stack_mod
    from meshsched.policies.base import Evict, Start, Trigger
    from meshsched.state import JobState

    origin: dict[str, tuple[str, bool]] = {}  # job -> (how its current load began, beside a partner)
    beneficiaries: set[str] = set()
    count, gpu_h = collections.Counter(), collections.Counter()
    inner = stack_mod.PolicyStack.schedule

    def load_of(stack, job) -> float:
        perf = getattr(stack.preemption, "perf", None)  # Lazer's performance model (its load times)
        try:
            return float(perf.load_time(job.spec.model)) if perf is not None else 0.0
        except KeyError:  # a model without measured overheads
            return 0.0

    def add(key: str, gh: float) -> None:
        count[key] += 1
        gpu_h[key] += gh

    def read(self, view, now, trigger):
        out = inner(self, view, now, trigger)
        gpus = view.cluster_state().gpus
        evicted = {d.job_id for d in out if type(d) is Evict}
        for d in out:
            if type(d) is Evict:
                v = view.job(d.job_id)
                stays = {o for g in v.gpus for o in gpus[g].jobs if o != v.job_id} - evicted
                shared = any(len(gpus[g].jobs) > 1 for g in v.gpus)
                add("preemptions", 0.0)
                if shared:
                    add("preemptions of a sharing job", 0.0)
                if stays:
                    add("preemptions leaving a partner", 0.0)
                if v.state is JobState.RUNNING and now - v.since < (load := load_of(self, v)):
                    add("unpaid loads", load * v.spec.gpus / 3600.0)
                if v.state is JobState.LOADING:
                    gh = (now - v.since) * v.spec.gpus / 3600.0
                    how, beside = origin.get(v.job_id, ("?", False))
                    for key in ("futile", "futile: restart" if v.restarts >= 2 else "futile: first load",
                                f"futile: load began at {how}",
                                "futile: started beside a partner" if beside else "futile: started alone",
                                "futile: a partner stayed" if stays else "futile: no partner stayed",
                                f"futile: preempted by {trigger.name}"):
                        add(key, gh)
                beneficiaries.add(d.reason.rsplit(" ", 1)[-1])  # "...: preempted for JOB"
            elif type(d) is Start:
                beside = any(gpus[g].jobs for g in d.gpus)
                if d.job_id in beneficiaries:
                    beneficiaries.discard(d.job_id)
                    origin[d.job_id] = ("chain", beside)
                else:
                    origin[d.job_id] = ("arrival" if trigger is Trigger.ARRIVAL else trigger.name.lower(), beside)
        return out

    stack_mod.PolicyStack.schedule = read
    buf = io.StringIO()
    cpu = time.process_time()
    try:
        with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):
            main(["simulate", *SETTINGS[setting], *(["--jobs", str(jobs)] if jobs else []), "--policy", policy,
                  "--json"])
    finally:
        stack_mod.PolicyStack.schedule = inner
    summary = json.loads(buf.getvalue())["policies"][0]
    keep = ("jct_mean_h", "jct_p50_h", "wait_mean_h", "preemptions", "futile_preemptions", "futile_gpu_h", "sim_seconds")
    return {"policy": policy, "setting": setting, "jobs": jobs, **{k: summary[k] for k in keep}, "cpu_s": round(time.process_time() - cpu, 1),
            "causes": {k: {"count": count[k], "gpu_h": round(gpu_h[k], 4)} for k in sorted(count)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="castor+lazer")
    ap.add_argument("--setting", choices=sorted(SETTINGS), default="window-x1.5")
    ap.add_argument("--jobs", type=int, default=None, help="the first N jobs (default: the window's 2,000; the "
                                                           "full settings' every job)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    jobs = a.jobs if a.jobs is not None else 2000 if a.setting == "window-x1.5" else None
    if jobs is not None and jobs < 1:
        ap.error("--jobs must be at least 1")
    doc = run(a.policy, jobs, a.setting)
    if a.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"{doc['policy']}: mean JCT {doc['jct_mean_h']:.3f} h, {doc['preemptions']} preemptions, "
          f"{doc['futile_preemptions']} futile ({doc['futile_gpu_h']:.4f} GPU-h)")
    for k, c in doc["causes"].items():
        print(f"  {k}: {c['count']}" + (f" ({c['gpu_h']:.4f} GPU-h)" if c["gpu_h"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
