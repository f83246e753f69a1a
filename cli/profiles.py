"""`mesh profiles`: inspect the performance profiles and regenerate them from the raw measurements."""

from __future__ import annotations

from pathlib import Path

import typer

from meshsched.cli.output import columns, fail, print_json
from meshsched.perf import load_perf_model

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
