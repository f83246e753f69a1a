"""`mesh profiles`: inspect the performance profiles and regenerate them from the raw measurements."""

from __future__ import annotations

from pathlib import Path

import typer

from meshsched.cli.output import fail, print_json
from meshsched.wire.jobtable import columns
from meshsched.loaders.profiles import load_perf_model

app = typer.Typer(help="Performance profiles: list them, refit them from measurements.", no_args_is_help=True)


@app.command("ls")
def list_profiles(
    gpu_type: str | None = typer.Option(None, help="Only this GPU type."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List the profiled models per GPU type, with their measured per-GPU batch sizes."""
    perf = load_perf_model()
    types = [gpu_type] if gpu_type else list(perf.gpu_types)
    if gpu_type and gpu_type not in perf.gpu_types:
        fail(f"unknown GPU type {gpu_type!r}; profiled: {', '.join(perf.gpu_types)}")
    rows = [
        {"gpu_type": g, "model": m, "multi_gpu": m in perf.models(g, 2), "batches": list(perf.profiled_batches(m, g))}
        for g in types
        for m in perf.models(g, 1)
    ]
    if json_out:
        print_json(rows)
        return
    lines = columns([("GPU", "MODEL", "MULTI-GPU", "BATCHES")] + [
        (r["gpu_type"], r["model"], "yes" if r["multi_gpu"] else "no", ",".join(map(str, r["batches"]))) for r in rows
    ])  # fmt: skip
    typer.echo("\n".join(lines))


@app.command("fit")
def fit(
    data: Path | None = typer.Option(
        None, envvar="MESHSCHED_DATA",
        help="Folder whose throughputs/ holds Gavel's and Pollux's raw measurements (sources: profiles/README.md).",
    ),  # fmt: skip
    out: Path = typer.Option(Path("profiles"), help="Where to write the profiles (the repository's profiles/)."),
) -> None:
    """Refit the iteration-time model and rebuild profiles/ from the raw measurements (deterministic)."""
    if data is None:
        fail("give the raw measurements: --data DIR or MESHSCHED_DATA=DIR, where DIR/throughputs/ holds Gavel's "
             "and Pollux's measurements (sources: profiles/README.md)")
    if not (data / "throughputs").is_dir():
        fail(f"{data} has no throughputs/ folder (Gavel's and Pollux's measurements; sources: profiles/README.md)")
    try:
        from meshsched.cli.fit import fit_profiles
    except ImportError as e:
        fail(f"fitting needs scipy ({e}); install with: pip install 'meshsched[fit]'")
    typer.echo(fit_profiles(data, out))


@app.command("train-ir")
def train_ir_cmd(
    out: Path = typer.Option(Path("profiles"), help="Where to write ir_model.json and ir_report.json (the repository's profiles/)."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Train the XGBoost interference-ratio predictor on the measured colocation pairs (80/20 split by pair)."""
    try:
        from meshsched.cli.train_ir import train_ir
    except ImportError as e:
        fail(f"training needs xgboost ({e}); install with: pip install xgboost-cpu")
    report = train_ir(load_perf_model(), out)
    if json_out:
        print_json(report)
        return
    typer.echo(
        f"IR predictor: {report['samples']} samples, {report['pairs']} pairs ({report['train_pairs']} train / "
        f"{report['test_pairs']} test); test RMSE xi_A {report['rmse_job_a']}, xi_B {report['rmse_job_b']} "
        f"(predicting the train mean: {report['baseline_rmse_predict_train_mean']})"
    )
    for name, g in report["feature_importance_gain"].items():
        typer.echo(f"  {name:28s} {g:.3f}")
    typer.echo(f"wrote {out / 'ir_model.json'}")


@app.command("plans-convert")
def plans_convert_cmd(
    data: Path = typer.Option(Path("../shared/data"), help="Folder with throughputs/morphling/ (A800 plan measurements)."),
    out: Path = typer.Option(Path("profiles"), help="Where to write plans_a800.json (the repository's profiles/)."),
) -> None:
    """Convert the Morphling A800 plan measurements and fit the plan model (Rubick) into plans_a800.json."""
    if not (data / "throughputs" / "morphling" / "placements").is_dir():
        fail(f"{data} has no throughputs/morphling/placements/ folder; pass --data pointing at the shared data")
    try:
        from meshsched.cli.plans_convert import convert
    except ImportError as e:
        fail(f"fitting needs scipy ({e}); install with: pip install 'meshsched[fit]'")
    typer.echo(convert(data, out))


@app.command("plans")
def plans_cmd(
    model: str | None = typer.Argument(None, help="Only this model type (e.g. gpt2)."),
    gpu_type: str = typer.Option("a800", help="GPU type of the plan profiles."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """List measured execution plans with the plan model's predicted iteration time and its relative error."""
    from meshsched.perf.errors import UnknownProfile
    from meshsched.loaders.profiles import load_plan_catalog
    from meshsched.perf.plans import iteration_time

    try:
        cat = load_plan_catalog(gpu_type)
        names = [model] if model else sorted(cat.profiles)
        profiles = {n: cat.profile(n) for n in names}
    except UnknownProfile as e:
        fail(str(e))
    rows = []
    for name in names:
        for m in cat.measurements[name]:
            pred = iteration_time(profiles[name], m.plan, m.resources, cat.env)
            rows.append({
                "model": name, "family": m.family, "plan": str(m.plan),
                "placement": "".join(map(str, m.resources.placement)), "gpus": m.resources.gpus,
                "measured_s": m.iter_time_s, "predicted_s": round(pred, 6),
                "rel_err": round(abs(pred - m.iter_time_s) / m.iter_time_s, 6), "in_fit": m.in_fit,
            })
    if json_out:
        print_json(rows)
        return
    typer.echo(f"{'MODEL':8s} {'FAMILY':16s} {'PLAN':27s} {'PLACEMENT':9s} {'MEASURED':>9s} {'PREDICTED':>9s} {'ERROR':>7s} FIT")
    for r in rows:
        typer.echo(
            f"{r['model']:8s} {r['family']:16s} {r['plan']:27s} {r['placement']:9s} {r['measured_s']:8.3f}s "
            f"{r['predicted_s']:8.3f}s {100 * r['rel_err']:6.1f}% {'yes' if r['in_fit'] else ''}"
        )
    for name in names:
        held = [r["rel_err"] for r in rows if r["model"] == name and not r["in_fit"]]
        if held:
            typer.echo(
                f"{name}: {len(held)} held-out plans, mean error {100 * sum(held) / len(held):.1f}%, "
                f"max {100 * max(held):.1f}% (fitted on {sum(1 for r in rows if r['model'] == name and r['in_fit'])})"
            )
