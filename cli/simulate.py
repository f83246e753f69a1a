"""`mesh simulate`: replay a trace under one or more policies and compare them."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from meshsched.cli.output import fail, print_json
from meshsched.perf import DEFAULT_GPU_TYPE, UnknownProfile, load_perf_model
from meshsched.perf.loader import OVERHEAD_REGIMES
from meshsched.policies.registry import POLICIES, UnknownPolicy, make_policy

from meshsched.sim.traces import BUILTIN_TRACES, TraceError, TraceOptions, load_trace

# The simulator proper (numpy, matplotlib) is imported inside the command so other `mesh` commands start fast.

DEFAULT_POLICIES = "fifo,sjf,srtf,las,srtf@360"


def _window(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return float(start) * 3600.0, float(end) * 3600.0
    except ValueError:
        fail(f"--window wants START:END in hours since the trace's first arrival, e.g. 720:1464; got {text!r}")


def simulate_cmd(
    trace: str = typer.Option("philly", help=f"Builtin trace ({', '.join(BUILTIN_TRACES)}) or a CSV file (docs/trace-format.md)."),
    policy: str = typer.Option(DEFAULT_POLICIES, help=f"Comma-separated policies: {', '.join(POLICIES)}; NAME@SECONDS runs it periodically."),
    nodes: int = typer.Option(64, help="Simulated servers."),
    gpus_per_node: int = typer.Option(8, help="GPUs per server."),
    gpu_type: str = typer.Option(DEFAULT_GPU_TYPE, help="GPU type of the simulated cluster (k80, p100, v100, t4)."),
    jobs: int | None = typer.Option(None, help="Replay only the first N jobs (after --window)."),
    window: str | None = typer.Option(None, help="START:END hours since the trace's first arrival."),
    load: float = typer.Option(1.0, help="Arrival-rate factor: 2 packs arrivals twice as densely."),
    seed: int = typer.Option(1, help="Seed for the model, batch size and deadline of each trace job."),
    overheads: str = typer.Option("measured", help=f"Load/pause-time regime: {', '.join(OVERHEAD_REGIMES)} (profiles/README.md)."),
    out: Path | None = typer.Option(None, help="Directory for summary.json, summary.csv and jobs-<policy>.csv."),
    plot: bool = typer.Option(False, "--plot", help="Write simulate.png (JCT CDFs, queue length) into --out (or .)."),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
) -> None:
    """Replay a cluster trace through the scheduler engine under each policy and compare them."""
    from meshsched.sim.loop import ClusterSpec, simulate
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from meshsched.sim.metrics import summarise, summary_dict

    if nodes < 1 or gpus_per_node < 1:
        fail(f"the cluster needs at least one node with at least one GPU (got --nodes {nodes} --gpus-per-node {gpus_per_node})")
    names = [p.strip() for p in policy.split(",") if p.strip()]
    if not names:
        fail("--policy is empty")
    try:
        for n in names:
            make_policy(n)
    except UnknownPolicy as e:
        fail(str(e))
    try:
        perf = load_perf_model(overheads)
    except UnknownProfile as e:
        fail(str(e))
    if gpu_type not in perf.gpu_types:
        fail(f"unknown GPU type {gpu_type!r}; profiled: {', '.join(perf.gpu_types)}")
    try:
        opts = TraceOptions(gpu_type=gpu_type, gpus_per_node=gpus_per_node, seed=seed, load=load, first_n=jobs, window=_window(window))
        tr = load_trace(trace, perf, opts)
    except (TraceError, UnknownProfile) as e:
        fail(str(e))
    cluster = ClusterSpec(nodes, gpus_per_node, gpu_type, perf.gpu_memory_mb(gpu_type))
    err = Console(stderr=True)
    too_big = sum(1 for j in tr.jobs if j.gpus > cluster.total_gpus)
    if too_big and not json_out:
        err.print(f"[yellow]{too_big} job(s) need more than the cluster's {cluster.total_gpus} GPUs: reported as unschedulable[/]")

    if out is not None:  # fail before a long replay, not after it
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            fail(f"cannot create --out {out}: {e.strerror}")
    results = {}
    summaries: list[tuple[object, float]] = []
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs arrived"),
        TimeElapsedColumn(), console=err, transient=True, disable=json_out or not err.is_terminal,
    ) as bar:  # fmt: skip
        for name in names:
            task = bar.add_task(name, total=len(tr.jobs))
            t0 = time.perf_counter()
            r = simulate(
                tr.jobs, make_policy(name), perf, cluster,
                progress=lambda n, task=task: bar.update(task, completed=n),
            )  # fmt: skip
            wall = time.perf_counter() - t0
            bar.remove_task(task)
            results[name] = r
            summaries.append((summarise(r, name), wall))

    if out is not None:
        _write_outputs(out, results, summaries)
    if plot:
        from meshsched.sim.plot import plot_comparison

        target = (out or Path(".")) / "simulate.png"
        plot_comparison(results, target)
        if not json_out:
            typer.echo(f"plot: {target}", err=True)  # plain: rich would wrap a long path
    if json_out:
        print_json(
            {
                "trace": tr.name, "jobs": len(tr.jobs), "seed": seed, "load": load,
                "cluster": {"nodes": nodes, "gpus_per_node": gpus_per_node, "gpu_type": gpu_type},
                "policies": [dict(summary_dict(s), sim_seconds=round(w, 2)) for s, w in summaries],
            }
        )  # fmt: skip
    else:
        _print_table(tr.name, len(tr.jobs), cluster, summaries)


def _print_table(trace: str, n: int, cluster, rows: list) -> None:
    t = Table(title=f"{trace}: {n} jobs on {cluster.nodes} x {cluster.gpus_per_node} {cluster.gpu_type} GPUs")
    for col in (
        "policy", "done", "unsched", "JCT h", "p50", "p95", "p99", "wait h", "span h",
        "preempt", "futile", "fut GPU-h", "util", "deadl", "sim s",
    ):  # fmt: skip
        t.add_column(col, justify="left" if col == "policy" else "right")
    for s, wall in rows:
        t.add_row(
            s.policy, str(s.completed), str(s.unschedulable), f"{s.jct_mean_h:.2f}", f"{s.jct_p50_h:.2f}",
            f"{s.jct_p95_h:.1f}", f"{s.jct_p99_h:.1f}", f"{s.wait_mean_h:.2f}", f"{s.makespan_h:.0f}",
            str(s.preemptions), str(s.futile_preemptions), f"{s.futile_gpu_h:.1f}", f"{s.gpu_utilisation:.1%}",
            f"{s.deadline_met:.1%}", f"{wall:.1f}",
        )  # fmt: skip
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    console.print(t)


def _write_outputs(out: Path, results: dict, rows: list) -> None:
    import csv
    import json

    from meshsched.sim.metrics import summary_dict, write_jobs_csv

    for name, r in results.items():
        write_jobs_csv(r, out / f"jobs-{name.replace('@', '_at_')}.csv")
    dicts = [dict(summary_dict(s), sim_seconds=round(w, 2)) for s, w in rows]
    (out / "summary.json").write_text(json.dumps(dicts, indent=2) + "\n")
    with (out / "summary.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dicts[0]))
        w.writeheader()
        w.writerows(dicts)


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)
