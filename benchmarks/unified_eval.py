"""The unified stack against every policy, one table and one verdict per trace (issue 26, "Done when" 2).

    python benchmarks/unified_eval.py [--settings window-x1.5,full-x1,full-x1.5] [--trace FILE[:FORMAT] ...]
                                      [--policies srtf,sjf,...] [--workers 2] [--jobs N] [--json]

Settings (the same runs as `mesh simulate`, seed 1, V100):
  window-x1.5  Philly's busiest 2,000-job window (--window 729.865:740 --jobs 2000) at 1.5x on 8 x 8 GPUs
  full-x1      the full Philly trace at 1x on 64 x 8 GPUs
  full-x1.5    the full Philly trace at 1.5x on 64 x 8 GPUs
  FILE[:FORMAT] a trace file in any `--trace-format` (the public adapters: alibaba-v2020, alibaba-v2023,
               helios, pollux, sia; auto from its header when FORMAT is left out) on --file-nodes x 8 GPUs,
               cut to --file-window START:END (hours) and scaled by --file-load when given

Every (setting, policy) is one `mesh simulate --policy P --json` process (`--workers` at a time), all with the
same `--plan-jobs` (0 by default: every policy replays the same jobs; the default of `mesh simulate` would mix
plan-profile jobs into the trace for the unified stack alone). The verdict per setting: whether the unified
stack (`--unified`, default castor+lazer+gimbal+rubick) has the lowest mean JCT, by how much against the best
other policy, and castor+lazer's futile-preemption GPU-h against srtf's / 10. Progress lines go to stderr.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

POLICIES = ("srtf", "sjf", "castor", "lazer", "sjf-ffs", "lucid", "castor+gimbal", "castor+lazer",
            "castor+lazer+gimbal", "castor+lazer+gimbal+rubick")
UNIFIED = "castor+lazer+gimbal+rubick"
WINDOW = ["--trace", "philly", "--window", "729.865:740", "--load", "1.5", "--nodes", "8"]
SETTINGS = {
    "window-x1.5": (WINDOW, 2000),
    "full-x1": (["--trace", "philly", "--load", "1", "--nodes", "64"], None),
    "full-x1.5": (["--trace", "philly", "--load", "1.5", "--nodes", "64"], None),
}
TIE = 1e-9  # relative: mean JCTs this close are one figure (float noise), a tie
# the child reports its own CPU seconds last on stderr (wall time on 2 shared cores says little)
MESH = ("import atexit, sys, time; atexit.register(lambda: print(f'cpu_s={time.process_time():.2f}', file=sys.stderr)); "
        "from meshsched.cli.main import main; sys.argv[0] = 'mesh'; sys.exit(main())")


def setting_args(name: str, file_nodes: int, jobs: int | None, file_window: str | None = None,
                 file_load: float = 1.0) -> list[str]:
    """The `mesh simulate` options of a setting: a builtin one's, or `file:PATH[:FORMAT]`'s."""
    if name in SETTINGS:
        args, cap = SETTINGS[name]
    else:
        path, _, fmt = name.removeprefix("file:").partition(":")
        args, cap = ["--trace", path, "--trace-format", fmt or "auto", "--nodes", str(file_nodes)], None
        args += (["--window", file_window] if file_window else []) + (["--load", f"{file_load:g}"] if file_load != 1.0 else [])
    n = min(x for x in (cap, jobs) if x is not None) if (cap or jobs) else None
    return args + (["--jobs", str(n)] if n else [])


def run_one(task: tuple[str, str, list[str]]) -> dict:
    """One `mesh simulate` process: its policy summary, or the one line it failed with."""
    setting, policy, args = task
    cmd = [sys.executable, "-c", MESH, "simulate", *args, "--policy", policy, "--json"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = round(time.perf_counter() - t0, 1)
    base = {"setting": setting, "policy": policy, "wall_s": wall}
    cpu = [ln for ln in p.stderr.splitlines() if ln.startswith("cpu_s=")]
    if cpu:
        base["cpu_s"] = float(cpu[-1].removeprefix("cpu_s="))
    if p.returncode != 0:
        err = ([ln for ln in p.stderr.strip().splitlines() if not ln.startswith("cpu_s=")] or [f"exit {p.returncode}"])[-1]
        return base | {"error": err}
    doc = json.loads(p.stdout)
    summary = doc["policies"][0]
    return base | {"trace": doc["trace"], "jobs": doc["jobs"], "warnings": doc["warnings"]} | summary


def verdict(docs: list[dict], unified: str) -> dict:
    """Is `unified` the lowest mean JCT of the setting, and by how much against the best other policy."""
    ok = [d for d in docs if "error" not in d and d.get("jct_mean_h") is not None]
    by = {d["policy"]: d for d in ok}
    out: dict = {"unified": unified, "failed": sorted(d["policy"] for d in docs if "error" in d)}
    others = [d for d in ok if d["policy"] != unified]
    done = {d["completed"] for d in ok}
    out["same_completed"] = len(done) <= 1
    if unified in by and others:
        best = min(others, key=lambda d: d["jct_mean_h"])
        u = by[unified]["jct_mean_h"]
        out |= {"unified_jct_mean_h": u, "best_other": best["policy"], "best_other_jct_mean_h": best["jct_mean_h"],
                "lowest": u <= best["jct_mean_h"] * (1 + TIE), "tied": abs(u - best["jct_mean_h"]) <= best["jct_mean_h"] * TIE,
                "vs_best_other_pct": round(100.0 * (u - best["jct_mean_h"]) / best["jct_mean_h"], 2)}
    if "castor+lazer" in by and "srtf" in by:
        cl, s = by["castor+lazer"]["futile_gpu_h"], by["srtf"]["futile_gpu_h"]
        out["futile_gpu_h"] = {"castor+lazer": cl, "srtf": s, "ratio": round(cl / s, 4) if s else None,
                               "at_most_srtf_div_10": cl <= s / 10}
    return out


def table(setting: str, docs: list[dict], v: dict) -> str:
    """A Markdown table of a setting's runs and its verdict line."""
    head = docs[0] if docs and "error" not in docs[0] else next((d for d in docs if "error" not in d), {})
    lines = [f"### {setting}: {head.get('trace', '?')}, {head.get('jobs', '?')} jobs", "",
             "| policy | done | mean JCT h | p50 | wait h | preempt | futile | futile GPU-h | util | sim s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for d in docs:
        if "error" in d:
            lines.append(f"| {d['policy']} | failed: {d['error']} |||||||||")
            continue
        mark = "**" if d["policy"] == v["unified"] else ""
        lines.append(f"| {mark}{d['policy']}{mark} | {d['completed']} | {d['jct_mean_h']:.2f} | {d['jct_p50_h']:.2f} "
                     f"| {d['wait_mean_h']:.2f} | {d['preemptions']} | {d['futile_preemptions']} "
                     f"| {d['futile_gpu_h']:.2f} | {d['useful_utilisation']:.1%} | {d['sim_seconds']} |")
    lines += ["", verdict_line(v), ""]
    return "\n".join(lines)


def verdict_line(v: dict) -> str:
    if "lowest" not in v:
        return f"verdict: none ({v['unified']} or every other policy did not run; failed: {', '.join(v['failed']) or '-'})"
    word = "NOT the lowest" if not v["lowest"] else "the LOWEST (tied)" if v["tied"] else "the LOWEST"
    line = (f"verdict: {v['unified']} has {word} mean JCT: {v['unified_jct_mean_h']:.3f} h, "
            f"{v['vs_best_other_pct']:+.2f} % against the best other ({v['best_other']}, {v['best_other_jct_mean_h']:.3f} h)")
    if not v["same_completed"]:
        line += "; the policies completed different numbers of jobs (compare with care)"
    if v["failed"]:
        line += f"; failed: {', '.join(v['failed'])}"
    f = v.get("futile_gpu_h")
    if f:
        line += (f". Futile GPU-h castor+lazer {f['castor+lazer']:.2f} vs srtf {f['srtf']:.2f} "
                 f"(<= srtf/10: {'yes' if f['at_most_srtf_div_10'] else 'no'})")
    return line


def tree() -> dict:
    """The commit the runs imported meshsched from and whether its tracked files differed from it (git): asked of a
    child started as the runs are (`python -c` puts the working directory first: a worktree's own meshsched, not
    the editable install's this script imported)."""
    where = subprocess.run([sys.executable, "-c", "import meshsched; print(meshsched.__file__)"], capture_output=True,
                           text=True, check=False).stdout.strip()
    cwd = Path(where).resolve().parents[1] if where else Path.cwd()

    def git(*args: str) -> str:
        p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
        return p.stdout.strip() if p.returncode == 0 else ""

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--settings", default=",".join(SETTINGS),
                    help=f"comma list of builtin settings ({', '.join(SETTINGS)}); '' for none (only --trace files)")
    ap.add_argument("--trace", action="append", default=[], metavar="FILE[:FORMAT]",
                    help="a trace file in a --trace-format of `mesh simulate` (repeatable)")
    ap.add_argument("--file-nodes", type=int, default=8, help="8-GPU nodes for the --trace files (default 8)")
    ap.add_argument("--file-window", default=None, metavar="START:END",
                    help="--window (hours since the file's first arrival) for the --trace files (default: all)")
    ap.add_argument("--file-load", type=float, default=1.0, help="--load for the --trace files (default 1)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--unified", default=UNIFIED, help=f"the stack the verdict is about (default {UNIFIED})")
    ap.add_argument("--workers", type=int, default=2, help="policies replayed at once (one process each)")
    ap.add_argument("--jobs", type=int, default=None, help="cut every trace to its first N jobs (a quick look)")
    ap.add_argument("--plan-jobs", type=float, default=0.0, help="--plan-jobs for every policy (default 0)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print every run and verdict as one JSON document")
    a = ap.parse_args(argv)
    unknown = [s for s in a.settings.split(",") if s and s not in SETTINGS]
    if unknown:
        ap.error(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    for t in a.trace:
        if not Path(t.split(":")[0]).is_file():
            ap.error(f"--trace {t}: no such file")
    if a.workers < 1 or (a.jobs is not None and a.jobs < 1):
        ap.error("--workers and --jobs must be at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    settings = [s for s in a.settings.split(",") if s] + [f"file:{t}" for t in a.trace]
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    common = ["--plan-jobs", f"{a.plan_jobs:g}", "--seed", str(a.seed)]
    def sargs(s: str) -> list[str]:
        return setting_args(s, a.file_nodes, a.jobs, a.file_window, a.file_load) + common

    tasks = [(s, p, sargs(s)) for s in settings for p in policies]
    results: dict[tuple[str, str], dict] = {}
    with ThreadPoolExecutor(a.workers) as ex:  # each task is its own `mesh simulate` process
        for i, doc in enumerate(ex.map(run_one, tasks), 1):
            results[doc["setting"], doc["policy"]] = doc
            what = doc.get("error") or f"mean JCT {doc['jct_mean_h']:.3f} h, sim {doc['sim_seconds']} s"
            print(f"[{i}/{len(tasks)}] {doc['setting']} {doc['policy']}: {what} ({doc['wall_s']} s wall)",
                  file=sys.stderr, flush=True)
    report = []
    for s in settings:
        docs = [results[s, p] for p in policies]
        report.append({"setting": s, "args": sargs(s), "runs": docs,
                       "verdict": verdict(docs, a.unified)})
    if a.json:
        print(json.dumps({"policies": policies, "unified": a.unified, "tree": tree(), "settings": report}, indent=1))
    else:
        print("\n".join(table(r["setting"], r["runs"], r["verdict"]) for r in report))
    return 1 if any("error" in d for d in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
