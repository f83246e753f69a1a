"""Gimbal calibration (Algorithm 1) on synthetic packing sets: objective gained against no calibration, search
steps, LGRR switches and their cost.

    python benchmarks/gimbal_calibration.py [--sets 200] [--seed 1] [--source v100|h100|both] [--sm-scale]
                                           [--grid] [--noise 0.0] [--min-gain 0.0] [--json]

Packing sets: a J_max of 2, 4 or 8 GPUs on one node with 1-3 smaller partners tiling part of its GPUs
(unequal packing, so some J_max ranks share and some do not), or an equal-size balanced pair (1 in 5 sets).
* v100: models, per-GPU batches, solo compute (alpha + beta * b) and all-reduce from the fitted V100 profiles;
  xi of each (J_max, partner) from the Gavel V100 pairs measured at scale factor 1 (only feasible measured
  pairs are drawn); MPS-share curves from the H100 anchors by family (perf/mps_share.py).
* h100: the six H100 jobs and pairs measured under MPS (docs/gpu-measurements.md): solo step at 100% and xi
  at 100%/100% as measured, step time proportional to the local batch (alpha = 0: not measured), no
  all-reduce (not measured). Multi-GPU J_max are data-parallel copies of a measured 1-GPU job.
Every job: remaining work drawn log-uniform in 0.5-8 h alone; deadline = U(1.1, 2.0) x that; utilisation
for eq. 2 = its curve's saturation u. The uncalibrated baseline is every worker at 100% MPS with even
samples. Gain = (baseline - calibrated) / baseline of the objective (for deadline: of the worst lateness,
over sets with a late job). Switch cost: Gimbal's 3.6 s per LGRR step; meshd has no context pool, so an
LGRR switch there is a checkpoint-restart of the squeezed job: p + l from profiles/overheads.json, shown
as `restart_cost_s` for the same switches. `--sm-scale` rescales the H100 curves to a V100 (132/80 SMs).
`--noise F` multiplies every measured worker step by a log-normal factor of sigma F (run-to-run spread; the
H100 runs vary by about 5%) while the search runs; gains are then scored without noise. `--min-gain G`: a
step counts as a gain only when it lowers the objective by more than G of it (the paper: any gain).
`--grid` adds a reference for sets of at most 3 jobs: every per-job MPS share (10-100%, the same for all of
a job's workers) with 3 LISS rounds each, best objective kept; Algorithm 1 can beat it (it sets per-worker
shares), so it is a yardstick, not an optimum. The `pairs` table: each measured H100 pair on one GPU with
1 h of work left each, under the JCT objective: the share Algorithm 1 leaves the squeezed job and the gain
(Gimbal's Fig. 2-a finds such pairs best at about 60%).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import statistics
from dataclasses import dataclass, replace

from meshsched.loaders.profiles import load_perf_model
from meshsched.perf.itermodel import comm_time
from meshsched.loaders.profiles import load_mps_share
from meshsched.perf.mps_share import MpsShareModel
from meshsched.policies.gimbal import (
    MPS_MAX,
    MPS_MIN,
    MPS_STEP,
    OBJECTIVES,
    Calibration,
    JobCalibration,
    JobPerf,
    PackedJob,
    PackingSet,
    Runtime,
    coordination_search,
    liss,
    model_evaluator,
    plan_between,
)

H100_SMS, V100_SMS = 132, 80
NODE_GPUS = 8


@dataclass(frozen=True)
class Spec:
    model: str
    batch: int  # per GPU
    gpus: int


@dataclass(frozen=True)
class Source:
    """Where a set's numbers come from: per (model, batch) solo perf and per pair xi."""

    name: str
    specs_1: tuple[tuple[str, int], ...]  # (model, batch) usable on 1 GPU
    specs_n: tuple[tuple[str, int], ...]  # usable on several GPUs
    xi: dict  # ((m, b), (m, b)) -> xi of the first next to the second
    solo: dict  # (m, b, gpus) -> (alpha, beta, comm)
    restart_s: dict  # model -> p + l


def v100_source() -> Source:
    perf = load_perf_model()
    specs_1 = tuple((m, b) for m in perf.models("v100") for b in perf.profiled_batches(m, "v100"))
    specs_n = tuple((m, b) for m in perf.models("v100", gpus=2) for b in perf.profiled_batches(m, "v100"))
    xi = {}
    for a in specs_1:
        for b in specs_1:
            pair = perf.colocation(*a, *b, "v100")
            if pair is not None:
                xi[(a, b)], xi[(b, a)] = max(1.0, pair[0]), max(1.0, pair[1])
    solo = {}
    for m, b in specs_1:
        p = perf.profile(m, "v100").params
        for g in (1, 2, 4, 8):
            if g == 1 or p.multi_gpu:
                solo[(m, b, g)] = (p.alpha_comp, p.beta_comp, comm_time(p, g, 1))
    restart = {m: perf.pause_time(m) + perf.load_time(m) for m, _ in specs_1}
    return Source("v100", specs_1, specs_n, xi, solo, restart)


def h100_source() -> Source:
    model = load_mps_share()
    solo_a, pairs = model.solo, model.pairs
    perf = load_perf_model()
    specs = tuple((a.model, a.batch) for a in solo_a)
    xi = {(p.self_key, p.other_key): max(1.0, p.xi_full) for p in pairs}
    solo = {(a.model, a.batch, g): (0.0, a.step_full_s / a.batch, 0.0) for a in solo_a for g in (1, 2, 4, 8)}
    restart = {m: perf.pause_time(m) + perf.load_time(m) for m, _ in specs}
    return Source("h100", specs, specs, xi, solo, restart)


def draw_set(rng: random.Random, src: Source) -> list[tuple[Spec, tuple[int, ...]]] | None:
    """[(spec, GPU indices on the one node)], J_max first; None when no measured pair fits the draw."""
    if rng.random() < 0.2:  # balanced pair of equal world size
        k = rng.choice((1, 2, 4))
        pool = src.specs_1 if k == 1 else src.specs_n
        a = rng.choice(pool)
        mates = [b for b in pool if (a, b) in src.xi]
        if not mates:
            return None
        gpus = tuple(range(k))
        return [(Spec(*a, k), gpus), (Spec(*rng.choice(mates), k), gpus)]
    k = rng.choice((2, 4, 8))
    a = rng.choice(src.specs_n)
    out = [(Spec(*a, k), tuple(range(k)))]
    free = list(range(k))
    for _ in range(rng.randint(1, 3)):
        sizes = [s for s in (1, 2, 4) if s < k and s <= len(free)]
        if not sizes:
            break
        s = rng.choice(sizes)
        pool = src.specs_1 if s == 1 else src.specs_n
        mates = [b for b in pool if (a, b) in src.xi and (b, a) in src.xi]
        if not mates:
            return None
        out.append((Spec(*rng.choice(mates), s), tuple(free[:s])))
        free = free[s:]
    return out


def grid_best(pset: PackingSet, start: Calibration, ev) -> dict[str, float]:
    """Best objective over per-job MPS shares x 3 LISS rounds (the --grid yardstick)."""
    best = {name: math.inf for name in OBJECTIVES}
    levels = range(MPS_MIN, MPS_MAX + 1, MPS_STEP)
    for shares in itertools.product(levels, repeat=len(pset.jobs)):
        cal = Calibration(tuple(JobCalibration(jc.job, tuple(replace(s, mps_percent=p) for s in jc.settings))
                                for jc, p in zip(start.jobs, shares)))
        for _ in range(4):
            rt = ev(cal)
            for name, objective in OBJECTIVES.items():
                best[name] = min(best[name], objective.value(pset, rt))
            cal = cal.apply([p for j in pset.jobs for p in liss(j, cal, rt)])
    return best


def noisy(ev, rng: random.Random, sigma: float):
    """`ev` with each worker's step time multiplied by exp(N(0, sigma)): what a real measurement window sees."""
    if sigma <= 0:
        return ev
    return lambda cal: Runtime(
        {w: t * math.exp(rng.gauss(0.0, sigma)) for w, t in ev(cal).worker_step_s.items()}, ev(cal).comm_s
    )


def run_set(rng, noise_rng, src: Source, model: MpsShareModel, drawn, sm_ratio: float, grid: bool = False,
            noise: float = 0.0, min_gain: float = 0.0) -> dict:
    jobs, perf, names = [], {}, {}
    for i, (spec, idx) in enumerate(drawn):
        name = f"j{i}"
        names[name] = spec
        alpha, beta, comm = src.solo[(spec.model, spec.batch, spec.gpus)]
        curve = model.curve(spec.model, spec.batch).on_fewer_sms(sm_ratio)
        alone_step = alpha + beta * spec.batch + comm
        remaining_s = math.exp(rng.uniform(math.log(0.5 * 3600), math.log(8 * 3600)))
        jobs.append(
            PackedJob(name, tuple(("node", g) for g in idx), remaining_s / alone_step, curve.saturation,
                      rng.uniform(1.1, 2.0) * remaining_s)
        )
        perf[name] = JobPerf(alpha, beta, curve, comm)
    pset = PackingSet(tuple(jobs))

    def xi(a: str, b: str) -> float:
        sa, sb = names[a], names[b]
        return src.xi[((sa.model, sa.batch), (sb.model, sb.batch))]

    ev = model_evaluator(pset, perf, xi, model)
    start = Calibration(
        tuple(JobCalibration.even(j.job, names[j.job].batch * j.world_size, j.world_size) for j in jobs)
    )
    out = {"jobs": len(jobs), "j_max_gpus": pset.j_max.world_size}
    reference = grid_best(pset, start, ev) if grid and len(jobs) <= 3 else None
    for name, objective in OBJECTIVES.items():
        r = coordination_search(pset, start, noisy(ev, noise_rng, noise), objective, min_gain=min_gain)
        before, after = objective.value(pset, ev(r.initial)), objective.value(pset, ev(r.best))
        restarted = {p.worker.job for s in r.steps for p in s.primitives if p.via.value == "lgrr"}
        per_switch_restart = max((src.restart_s[names[j].model] for j in restarted), default=0.0)
        out[name] = {
            "before": before,
            "after": after,
            "steps": len(r.steps),
            "exit": r.exit,
            "lgrr_switches": r.lgrr_switches,
            "switch_cost_s": r.switch_cost_s,
            "restart_cost_s": r.lgrr_switches * per_switch_restart,
            "search_s": r.search_s,
            "late_jobs_before": sum(_late(j, ev(r.initial)) for j in jobs) if name == "deadline" else None,
            "late_jobs_after": sum(_late(j, ev(r.best)) for j in jobs) if name == "deadline" else None,
            "grid": None if reference is None else reference[name],
        }
    return out


def _late(job: PackedJob, rt) -> bool:
    return rt.remaining_s(job) > job.time_to_deadline_s


def summarise(rows: list[dict]) -> dict:
    out = {}
    for name in OBJECTIVES:
        rs = [r[name] for r in rows]
        scored = [r for r in rs if r["before"] > 0]
        gains = [(r["before"] - r["after"]) / r["before"] for r in scored]
        s = {
            "sets": len(rs),
            "sets_scored": len(scored),
            "gain_mean_pct": 100 * statistics.fmean(gains) if gains else 0.0,
            "gain_median_pct": 100 * statistics.median(gains) if gains else 0.0,
            "gain_p90_pct": 100 * _quantile(gains, 0.9) if gains else 0.0,
            "sets_improved": sum(g > 0 for g in gains),
            "sets_worse": sum(g < 0 for g in gains),
            "gain_min_pct": 100 * min(gains) if gains else 0.0,
            "steps_mean": statistics.fmean(r["steps"] for r in rs),
            "steps_max": max(r["steps"] for r in rs),
            "early_exit": sum(r["exit"] == "early-exit" for r in rs),
            "lgrr_switches_mean": statistics.fmean(r["lgrr_switches"] for r in rs),
            "switch_cost_s_mean": statistics.fmean(r["switch_cost_s"] for r in rs),
            "restart_cost_s_mean": statistics.fmean(r["restart_cost_s"] for r in rs),
            "search_s_mean": statistics.fmean(r["search_s"] for r in rs),
            "gain_s_mean": statistics.fmean(r["before"] - r["after"] for r in rs),
        }
        ref = [r for r in scored if r["grid"] is not None and r["before"] - r["grid"] > 1e-9]
        if ref:
            s["grid_sets"] = len(ref)
            s["grid_gain_mean_pct"] = 100 * statistics.fmean((r["before"] - r["grid"]) / r["before"] for r in ref)
            s["alg1_share_of_grid_gain_median"] = statistics.median(
                (r["before"] - r["after"]) / (r["before"] - r["grid"]) for r in ref
            )
        if name == "deadline":
            s["late_jobs_before"] = sum(r["late_jobs_before"] for r in rs)
            s["late_jobs_after"] = sum(r["late_jobs_after"] for r in rs)
        out[name] = s
    return out


def pairs_table(model: MpsShareModel) -> list[dict]:
    """Each measured H100 pair on one GPU, 1 h of work left each, JCT objective."""
    src = h100_source()
    out = []
    for (a, b), xi_a in sorted(src.xi.items()):
        if a > b:
            continue
        jobs, perf = [], {}
        for name, (m, batch) in (("a", a), ("b", b)):
            alpha, beta, _ = src.solo[(m, batch, 1)]
            curve = model.curve(m, batch)
            jobs.append(PackedJob(name, (("node", 0),), 3600 / (alpha + beta * batch), curve.saturation))
            perf[name] = JobPerf(alpha, beta, curve)
        pset = PackingSet(tuple(jobs))
        keys = {"a": a, "b": b}
        ev = model_evaluator(pset, perf, lambda x, y: src.xi[(keys[x], keys[y])], model)
        start = Calibration((JobCalibration.even("a", a[1], 1), JobCalibration.even("b", b[1], 1)))
        r = coordination_search(pset, start, ev, OBJECTIVES["jct"])
        squeezed = [p for p in plan_between(start, r.best) if p.via.value == "lgrr"]
        out.append({
            "pair": f"{a[0]} b{a[1]} + {b[0]} b{b[1]}",
            "xi_at_100": [round(xi_a, 3), round(src.xi[(b, a)], 3)],
            "squeezed": ", ".join(f"{keys[p.worker.job][0]} -> {p.to}%" for p in squeezed) or "none",
            "jct_gain_pct": 100 * (r.initial_objective - r.best_objective) / r.initial_objective,
            "steps": len(r.steps),
        })
    return out


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=200, help="packing sets per source (default 200)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--source", choices=("v100", "h100", "both"), default="both")
    ap.add_argument("--sm-scale", action="store_true", help="rescale the H100 share curves to a V100's 80 SMs")
    ap.add_argument("--grid", action="store_true", help="add the per-job MPS grid yardstick (slow: ~1 s per set)")
    ap.add_argument("--noise", type=float, default=0.0, help="log-normal sigma on measured step times (default 0)")
    ap.add_argument("--min-gain", type=float, default=0.0, help="relative gain a step must beat (default 0)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = ap.parse_args()
    if args.sets < 1:
        ap.error("--sets must be at least 1")
    if not 0.0 <= args.noise < 1.0:
        ap.error("--noise must be in [0, 1)")
    if not 0.0 <= args.min_gain < 1.0:
        ap.error("--min-gain must be in [0, 1)")
    model = load_mps_share()
    sources = {"v100": v100_source, "h100": h100_source}
    picked = ("v100", "h100") if args.source == "both" else (args.source,)
    report = {"kappa": model.kappa, "sm_scale": args.sm_scale, "noise": args.noise, "min_gain": args.min_gain,
              "seed": args.seed, "sources": {}}
    for name in picked:
        src = sources[name]()
        ratio = H100_SMS / V100_SMS if (args.sm_scale and name == "v100") else 1.0
        rng = random.Random(args.seed)
        noise_rng = random.Random(args.seed + 1)  # apart, so that the sets drawn do not depend on --noise
        rows = []
        while len(rows) < args.sets:
            drawn = draw_set(rng, src)
            if drawn is not None:
                rows.append(run_set(rng, noise_rng, src, model, drawn, ratio, args.grid, args.noise, args.min_gain))
        report["sources"][name] = {
            "summary": summarise(rows),
            "jobs_per_set_mean": statistics.fmean(r["jobs"] for r in rows),
        }
    report["pairs"] = pairs_table(model)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_table(report, args)


def print_table(report: dict, args: argparse.Namespace) -> None:
    print(f"kappa (residual interference when MPS partitions cannot overlap) = {report['kappa']:.3f}; "
          f"sm-scale {'on' if args.sm_scale else 'off'}; noise {args.noise}; min-gain {args.min_gain}; "
          f"{args.sets} sets per source, seed {args.seed}")
    head = ("source", "objective", "scored", "better/worse", "gain min %", "mean %", "median %", "p90 %",
            "steps mean/max", "early exit", "LGRR sw.", "switch s", "restart s", "gain s")
    print(" | ".join(head))
    for name, doc in report["sources"].items():
        for obj, s in doc["summary"].items():
            print(" | ".join((
                name, obj, f"{s['sets_scored']}/{s['sets']}", f"{s['sets_improved']}/{s['sets_worse']}",
                f"{s['gain_min_pct']:.1f}", f"{s['gain_mean_pct']:.1f}",
                f"{s['gain_median_pct']:.1f}", f"{s['gain_p90_pct']:.1f}", f"{s['steps_mean']:.1f}/{s['steps_max']}",
                str(s["early_exit"]), f"{s['lgrr_switches_mean']:.1f}", f"{s['switch_cost_s_mean']:.1f}",
                f"{s['restart_cost_s_mean']:.0f}", f"{s['gain_s_mean']:.0f}",
            )))
            if obj == "deadline":
                print(f"{'':>6}   late jobs (all sets): {s['late_jobs_before']} uncalibrated -> "
                      f"{s['late_jobs_after']} calibrated")
            if "grid_sets" in s:
                print(f"{'':>6}   grid yardstick on {s['grid_sets']} sets: gain {s['grid_gain_mean_pct']:.1f}%; "
                      f"Algorithm 1 reaches a median {s['alg1_share_of_grid_gain_median']:.2f} of it")
    print()
    print("H100 pairs on one GPU, 1 h left each, JCT: pair | xi at 100/100 | Algorithm 1 leaves | JCT gain % | steps")
    for p in report["pairs"]:
        xi = f"{p['xi_at_100'][0]}/{p['xi_at_100'][1]}"
        print(f"{p['pair']} | {xi} | {p['squeezed']} | {p['jct_gain_pct']:.1f} | {p['steps']}")


if __name__ == "__main__":
    main()
