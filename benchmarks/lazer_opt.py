"""Lazer's deferral optimiser (meshsched/policies/lazer_opt.py): fit cost, suggest cost, convergence.

    python benchmarks/lazer_opt.py [--json] [--threads 1] [--updates 150] [--refit-every 5] [--seeds 3]

* fit cost: seconds per `fit_model` (the numpy GP's hyper-parameters by L-BFGS-B, its cached Cholesky factor
  and incumbent: meshsched/policies/lazer_gp.py) at 10, 50, 100, 200 observations; wall and CPU seconds, median over --repeat fits.
* suggest cost (wall p50 / p99, and CPU ms per call): one `best_ei` (acquisition stage: closed-form EI on the 101-point X grid) and one `mean_argmin`
  (exploitation stage: GP mean on the grid) per context, p50 / p99 over 50 contexts, per model size.
* convergence: a synthetic problem whose ideal deferral F is a known function of the context,
  F(c) = clip(max_pause + 0.5 * load - 0.2 * mean_interarrival, 0, 100) (+ Gaussian noise of --noise s, clipped),
  replayed through suggest / observe |X - F| / refit-when-due for --updates decisions with the paper's stopping
  rule (>= 100 updates and EI < 10 %). Reported: mean |X - F| per window of decisions (against the noiseless
  F), the stage, and two baselines: X uniform on [0, 100] (what the Latin hypercube does) and the best
  *constant* X in hindsight (the median of F over the same contexts: what a context-blind deferral can do).

Timings on a shared 2-core machine are noisy: the CPU seconds are the steadier figure. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from meshsched.policies.lazer_opt import (
    DeferralContext,
    DeferralOptimizer,
    FitRequest,
    Observation,
    OptimizerConfig,
    fit_model,
    objective,
)

WINDOWS = ((0, 10), (10, 30), (30, 60), (60, 100), (100, 150), (150, 200), (200, 300))


def true_f(c: DeferralContext) -> float:
    return float(np.clip(c.max_pause_s + 0.5 * c.load_s - 0.2 * c.mean_interarrival_s, 0.0, 100.0))


def contexts(n: int, rng: np.random.Generator) -> list[DeferralContext]:
    return [
        DeferralContext(
            float(rng.uniform(10, 200)), float(rng.uniform(600, 36000)), float(rng.uniform(20, 120)), float(rng.uniform(5, 16))
        )
        for _ in range(n)
    ]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def fit_costs(sizes: list[int], repeat: int) -> list[dict]:
    rng = np.random.default_rng(0)
    cs = contexts(max(sizes), rng)
    xs = rng.uniform(0, 100, max(sizes))
    obs = tuple(Observation(c, float(x), objective(float(x), true_f(c))) for c, x in zip(cs, xs, strict=True))
    probe = contexts(50, np.random.default_rng(1))
    rows = []
    fit_model(FitRequest(OptimizerConfig(), obs[:10]))  # imports and first-call set-up out of the timings
    for n in sizes:
        walls, cpus = [], []
        for _ in range(repeat):
            w, c = time.perf_counter(), time.process_time()
            fitted = fit_model(FitRequest(OptimizerConfig(), obs[:n]))
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
        ei, mean = [], []
        cpu = time.process_time()
        for c in probe:
            t = time.perf_counter()
            fitted.best_ei(c)
            ei.append((time.perf_counter() - t) * 1e3)
        ei_cpu = (time.process_time() - cpu) / len(probe) * 1e3
        cpu = time.process_time()
        for c in probe:
            t = time.perf_counter()
            fitted.mean_argmin(c)
            mean.append((time.perf_counter() - t) * 1e3)
        mean_cpu = (time.process_time() - cpu) / len(probe) * 1e3
        rows.append(
            {
                "observations": n,
                "fit_wall_s": round(statistics.median(walls), 3),
                "fit_cpu_s": round(statistics.median(cpus), 3),
                "acquisition_suggest_ms_p50": round(pct(ei, 50), 2),
                "acquisition_suggest_ms_p99": round(pct(ei, 99), 2),
                "acquisition_suggest_cpu_ms_mean": round(ei_cpu, 2),
                "exploitation_suggest_ms_p50": round(pct(mean, 50), 2),
                "exploitation_suggest_ms_p99": round(pct(mean, 99), 2),
                "exploitation_suggest_cpu_ms_mean": round(mean_cpu, 2),
            }
        )
    return rows


def convergence(seed: int, updates: int, refit_every: int, noise: float) -> dict:
    rng = np.random.default_rng(100 + seed)
    opt = DeferralOptimizer(OptimizerConfig(seed=seed, refit_every=refit_every))
    cs = contexts(updates, rng)
    errs, stages, fits, fit_s = [], [], 0, 0.0
    for c in cs:
        d = opt.decide(c)
        f_seen = float(np.clip(true_f(c) + rng.normal(0.0, noise), 0.0, 100.0)) if noise else true_f(c)
        errs.append(objective(d.x, true_f(c)))
        stages.append(d.stage.value)
        opt.observe(c, d.x, objective(d.x, f_seen))
        if opt.needs_fit():
            t = time.perf_counter()
            opt.install(opt.fit())
            fit_s += time.perf_counter() - t
            fits += 1
    fs = np.array([true_f(c) for c in cs])
    grid = np.linspace(0, 100, 101)
    return {
        "seed": seed,
        "errors": errs,
        "stages": stages,
        "fits": fits,
        "fit_seconds": round(fit_s, 2),
        "uniform_baseline": float(np.mean([np.mean(np.abs(grid - f)) for f in fs])),
        "constant_baseline": float(np.mean(np.abs(fs - np.median(fs)))),
        "switched_at": next((i for i, s in enumerate(stages) if s == "exploitation"), None),
    }


def window_means(errs: list[float]) -> dict[str, float]:
    return {f"{a + 1}-{b}": round(float(np.mean(errs[a:b])), 2) for a, b in WINDOWS if a < len(errs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--sizes", default="10,50,100,200", help="observation counts for the fit-cost rows")
    ap.add_argument("--repeat", type=int, default=3, help="fits per size (median reported)")
    ap.add_argument("--updates", type=int, default=150, help="decisions in each convergence replay")
    ap.add_argument("--refit-every", type=int, default=5, help="k: refit after this many new observations")
    ap.add_argument("--seeds", type=int, default=3, help="convergence replays (seeds 0..N-1)")
    ap.add_argument("--noise", type=float, default=0.0, help="std of Gaussian noise on the F the optimiser sees (s)")
    a = ap.parse_args()
    if a.threads < 1 or a.repeat < 1 or a.updates < 1 or a.refit_every < 1 or a.seeds < 1 or a.noise < 0:
        ap.error("--threads, --repeat, --updates, --refit-every and --seeds must be >= 1, --noise >= 0")
    try:
        sizes = [int(s) for s in a.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes wants comma-separated integers, got {a.sizes!r}")
    if min(sizes) < 2:
        ap.error("--sizes: a fit needs at least 2 observations")
    torch.set_num_threads(a.threads)

    costs = fit_costs(sizes, a.repeat)
    runs = [convergence(s, a.updates, a.refit_every, a.noise) for s in range(a.seeds)]
    mean_errs = [float(np.mean([r["errors"][i] for r in runs])) for i in range(a.updates)]
    summary = {
        "threads": a.threads,
        "refit_every": a.refit_every,
        "noise_s": a.noise,
        "fit_cost": costs,
        "convergence": {
            "seeds": a.seeds,
            "mean_abs_error_by_decisions": window_means(mean_errs),
            "uniform_baseline": round(statistics.fmean(r["uniform_baseline"] for r in runs), 2),
            "constant_baseline": round(statistics.fmean(r["constant_baseline"] for r in runs), 2),
            "switched_to_exploitation_at": [r["switched_at"] for r in runs],
            "fits_per_replay": [r["fits"] for r in runs],
            "fit_seconds_per_replay": [r["fit_seconds"] for r in runs],
        },
    }
    if a.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"fit and suggest cost (torch threads {a.threads}; median of {a.repeat} fits; suggest p50/p99 over 50 contexts)")
    print(
        f"{'obs':>5} {'fit wall s':>10} {'fit CPU s':>10} {'acq ms p50':>10} {'acq ms p99':>10} {'acq CPU ms':>10} "
        f"{'expl ms p50':>11} {'expl ms p99':>11} {'expl CPU ms':>11}"
    )
    for r in costs:
        print(
            f"{r['observations']:>5} {r['fit_wall_s']:>10.3f} {r['fit_cpu_s']:>10.3f} {r['acquisition_suggest_ms_p50']:>10.2f} "
            f"{r['acquisition_suggest_ms_p99']:>10.2f} {r['acquisition_suggest_cpu_ms_mean']:>10.2f} "
            f"{r['exploitation_suggest_ms_p50']:>11.2f} {r['exploitation_suggest_ms_p99']:>11.2f} "
            f"{r['exploitation_suggest_cpu_ms_mean']:>11.2f}"
        )
    conv = summary["convergence"]
    print(f"\nconvergence: mean |X - F| (s) over {a.seeds} seeds, refit every {a.refit_every}, noise {a.noise} s")
    print(f"{'decisions':>10} {'|X - F|':>8}")
    for w, v in conv["mean_abs_error_by_decisions"].items():
        print(f"{w:>10} {v:>8.2f}")
    print(f"baselines: X uniform on [0, 100] {conv['uniform_baseline']:.2f} s; best constant X {conv['constant_baseline']:.2f} s")
    print(f"switched to exploitation at decision {conv['switched_to_exploitation_at']}; fits per replay {conv['fits_per_replay']}, "
          f"seconds of fitting per replay {conv['fit_seconds_per_replay']}")


if __name__ == "__main__":
    main()
