"""Castor's release pass, this tree against another (a `git worktree` of the base commit), alternating pass by pass
in one process (timing on a shared machine varies ±25 % between processes, much less within one):

    git worktree add /tmp/base HEAD
    python benchmarks/release_ab.py --base /tmp/base [--passes 80] [--gpus 10240] [--pending 10000] [--json]

The base's castor modules (`--modules`, in import order) are loaded under other names, its Castor placed in a second
stack on the same snapshot (`decision_latency.build`); the two passes' decisions must be equal. Prints CPU p50 /
mean / p99 ms of each and the load average (`--json`: one JSON document). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import decision_latency as dl  # noqa: E402

from meshsched.loaders.profiles import installed_handle  # noqa: E402
from meshsched.policies.base import Trigger  # noqa: E402
from meshsched.policies.registry import make_policy  # noqa: E402


def load_base(root: Path, modules: list[str]):
    """The base tree's `meshsched.policies` modules named, each as `<name>_base` (importing each other so); the last."""
    mod = None
    for m in modules:
        path = root / "meshsched" / "policies" / f"{m}.py"
        src = path.read_text()
        for x in modules:
            src = src.replace(f"meshsched.policies.{x} ", f"meshsched.policies.{x}_base ")
        name = f"meshsched.policies.{m}_base"
        mod = type(sys)(name)
        mod.__file__ = str(path)
        sys.modules[name] = mod
        exec(compile(src, str(path), "exec"), mod.__dict__)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", type=Path, required=True)
    ap.add_argument("--modules", default="castor_tables,castor")
    ap.add_argument("--passes", type=int, default=80)
    ap.add_argument("--gpus", type=int, default=10240)
    ap.add_argument("--pending", type=int, default=10000)
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    a = ap.parse_args()
    base = load_base(a.base, a.modules.split(","))
    eng = dl.build(a.gpus, a.pending, "castor")
    mine, theirs = eng.policy, make_policy("castor", installed_handle())
    theirs.placement.__class__ = base.Castor  # (the same fields: only the methods differ)
    now = 200.0
    first = next(iter(eng.queued())).job_id
    for s in (mine, theirs):
        s.schedule(eng.view(first), now, Trigger.ARRIVAL)

    def run(s):
        c = time.thread_time()
        d = s.schedule(eng.view(), now, Trigger.RELEASE)
        return (time.thread_time() - c) * 1e3, [repr(x) for x in d]

    (_, dm), (_, dt) = run(mine), run(theirs)
    if dm != dt:
        print(json.dumps({"decisions_identical": False}) if a.json else "decisions differ")
        return 1
    t: dict[str, list[float]] = {"base": [], "this": []}
    for i in range(a.passes):
        for name, s in ((("base", theirs), ("this", mine)) if i % 2 else (("this", mine), ("base", theirs))):
            t[name].append(run(s)[0])
    fig = {name: {"p50_ms": round(statistics.median(xs), 2), "mean_ms": round(statistics.mean(xs), 2),
                  "p99_ms": round(dl.pct(xs, 99), 2), "n": len(xs)} for name, xs in t.items()}
    ratio = round(statistics.median(t["this"]) / statistics.median(t["base"]), 3)
    load = [round(v, 2) for v in os.getloadavg()]
    if a.json:
        print(json.dumps({"decisions_identical": True, "decisions": len(dm), "cpu": fig, "p50_this_over_base": ratio,
                          "load_average": load}, indent=1))
        return 0
    print(f"decisions identical: {len(dm)}")
    for name, f in fig.items():
        print(f"{name}: CPU p50 {f['p50_ms']:.2f} mean {f['mean_ms']:.2f} p99 {f['p99_ms']:.2f} ms (n={f['n']})")
    print(f"p50 this / base {ratio:.3f}; load average {', '.join(f'{v:.2f}' for v in load)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
