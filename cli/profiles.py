"""`mesh profiles`: inspect the performance profiles and regenerate them from the raw measurements."""

from __future__ import annotations

from pathlib import Path

import typer

from meshsched.cli.output import fail, print_json
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
    for r in rows:
        typer.echo(f"{r['gpu_type']:5s} {r['model']:15s} {'multi-GPU' if r['multi_gpu'] else '1 GPU only':10s} batches {r['batches']}")


@app.command("fit")
def fit(
    data: Path = typer.Option(Path("../shared/data"), help="Folder with throughputs/ (Gavel, Pollux measurements)."),
    out: Path = typer.Option(Path("profiles"), help="Where to write the profiles (the repository's profiles/)."),
) -> None:
    """Refit the iteration-time model and rebuild profiles/ from the raw measurements (deterministic)."""
    if not (data / "throughputs").is_dir():
        fail(f"{data} has no throughputs/ folder; pass --data pointing at the shared data")
    try:
        from meshsched.perf.fit import fit_profiles
    except ImportError as e:
        fail(f"fitting needs scipy ({e}); install with: pip install 'meshsched[fit]'")
    typer.echo(fit_profiles(data, out))
