"""`mesh simulate`: replay a trace under one or more policies and compare them."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import typer

from meshsched.cli.output import fail, print_json
from meshsched.cli.sim_events import events_effect, load_said, print_effect
from meshsched.loaders.profiles import OVERHEAD_REGIMES, load_perf_model
from meshsched.loaders.traces import BUILTIN_TRACES, TRACE_FORMATS, TraceError, TraceOptions, load_trace
from meshsched.perf import DEFAULT_GPU_TYPE, UnknownProfile
from meshsched.policies.registry import (
    POLICIES, UnknownPolicy, has_plan_layer, make_policy, needs_models, needs_plan_models, parse_policy,
)

# The simulator proper (numpy, matplotlib) and rich (progress bar, table) are imported inside the command, the
# latter only when it draws: other `mesh` commands, and --json, do without them.

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
    trace_format: str = typer.Option("auto", "--trace-format", help=f"Trace file format: {', '.join(TRACE_FORMATS)} (auto: from its header; docs/trace-format.md)."),
    policy: str = typer.Option(DEFAULT_POLICIES, help=f"Comma-separated policy stacks to compare; names {', '.join(POLICIES)}; combine layers with + "
                                                      "(castor+srtf, castor+gimbal), NAME@SECONDS runs it periodically, "
                                                      "NAME:KEY=VALUE sets a parameter (castor:depth=32)."),
    nodes: int = typer.Option(64, help="Simulated servers."),
    gpus_per_node: int = typer.Option(8, help="GPUs per server."),
    gpu_type: str = typer.Option(DEFAULT_GPU_TYPE, help="GPU type of the simulated cluster (k80, p100, v100, t4; the plan allocators rubick, sia and synergy use a800)."),
    cluster_text: str | None = typer.Option(None, "--cluster", help="A mixed cluster, TYPE:NODES[xGPUS],... e.g. "
                                            "v100:16,p100:16,k80:16 (overrides --nodes/--gpu-type; the first type is "
                                            "the one trace durations are measured on)."),
    jobs: int | None = typer.Option(None, help="Replay only the first N jobs (after --window)."),
    window: str | None = typer.Option(None, help="START:END hours since the trace's first arrival."),
    load: float = typer.Option(1.0, help="Arrival-rate factor: 2 packs arrivals twice as densely."),
    seed: int = typer.Option(1, help="Seed for the model, batch size and deadline of each trace job."),
    rules_name: str = typer.Option("meshsched", "--rules", help="Simulator rules: meshsched (a pass per event, "
                                   "load times, model-based restarts) or lucid (Lucid's simulator; "
                                   "docs/simulator-rules.md)."),
    overheads: str = typer.Option("measured", help=f"Load/pause-time regime: {', '.join(OVERHEAD_REGIMES)} (profiles/README.md)."),
    out: Path | None = typer.Option(None, help="Directory for summary.json, summary.csv and jobs-<policy>.csv."),
    plot: bool = typer.Option(False, "--plot", help="Write simulate.png (JCT CDFs, queue length) into --out (or .)."),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    wide: bool = typer.Option(False, "--wide", help="Every column (p99, futile preemptions, deadlines met)."),
    mps_one_user: bool = typer.Option(False, "--mps-one-user", help="Sharing pairs only jobs of the same user (the "
                                      "trace's users), as on a cluster that shares GPUs through MPS among several "
                                      "users (meshd with use_mps and submit_users); default: any two jobs may pair."),
    plan_jobs: float | None = typer.Option(None, "--plan-jobs", help="Share of the trace's jobs turned into jobs of the "
                                           "execution-plan profiles, each with an asked plan (meshsched/sim/mixed_trace.py); "
                                           "default 0.25 when a stack has a plan layer (castor+rubick), else 0."),
    events_file: Path | None = typer.Option(None, "--events", help="Drains and resumes to replay (CSV or JSON lines: "
                                            "time, node, action, gpus, reason; docs/trace-format.md); each policy "
                                            "also runs without them, to count the jobs they delay."),
) -> None:
    """Replay a cluster trace through the scheduler engine under each policy and compare them."""
    from meshsched.sim.loop import ClusterSpec
    from meshsched.sim.metrics import summary_dict

    if nodes < 1 or gpus_per_node < 1:
        fail(f"the cluster needs at least one node with at least one GPU (got --nodes {nodes} --gpus-per-node {gpus_per_node})")
    names, rules, sharing = _policies(policy, rules_name)
    planned = _plan_allocators(names, window, load, cluster_text)
    perf = _perf_model(planned, share := _plan_share(names, planned, plan_jobs), gpu_type, overheads)
    if planned:
        gpu_type = perf.gpu_types[0]
    stacks = _stacks(names, rules, perf, sharing, seed, mps_one_user)
    cluster = _mixed_cluster(cluster_text, gpus_per_node, perf)
    if cluster is not None:
        gpu_type, gpus_per_node = cluster.gpu_type, cluster.largest_node
    if gpu_type not in perf.gpu_types:
        fail(f"unknown GPU type {gpu_type!r}; profiled: {', '.join(perf.gpu_types)}")
    try:
        tr = _plan_trace(trace, perf, nodes * gpus_per_node, gpus_per_node, seed, jobs) if planned else load_trace(
            trace, perf, TraceOptions(gpu_type=gpu_type, gpus_per_node=gpus_per_node, seed=seed, load=load,
                                      first_n=jobs, window=_window(window), trace_format=trace_format))
    except (TraceError, UnknownProfile) as e:
        fail(str(e))
    if cluster is None:
        cluster = ClusterSpec(nodes, gpus_per_node, gpu_type, perf.gpu_memory_mb(gpu_type))
    tr = _mixed(tr, perf, share, gpu_type, gpus_per_node, cluster.total_gpus, seed)
    warnings = _size_warnings(tr, cluster, json_out, perf)
    said = load_said(events_file, tr, cluster)  # --events: drains and resumes (meshsched.cli.sim_events)
    _make_out(out)  # fail before a long replay, not after it
    results, summaries = _replay(names, stacks, tr, perf, cluster, rules, json_out, warnings, said)
    effect = events_effect(said, names, _stacks(names, rules, perf, sharing, seed, mps_one_user) if said else {},
                            tr, perf, cluster, rules, results)
    _write_files(out, plot, results, summaries, json_out)
    if json_out:
        print_json(
            {
                "trace": tr.name, "jobs": len(tr.jobs), "seed": seed, "load": load,
                "cluster": [{"nodes": g.nodes, "gpus_per_node": g.gpus_per_node, "gpu_type": g.gpu_type}
                            for g in cluster.groups],
                "overheads": overheads, "rules": rules_name.strip(), "warnings": warnings, "out": str(out) if out is not None else None,
                "policies": [dict(summary_dict(s), sim_seconds=round(w, 2), **effect.get(s.policy, {})) for s, w in summaries],
            } | ({"events": {"file": str(events_file), "count": len(said)}} if said else {})
        )  # fmt: skip
    else:
        _print_table(tr.name, len(tr.jobs), cluster, summaries, wide)
        print_effect(events_file, said, effect, summaries)


def _make_out(out: Path | None) -> None:
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            fail(f"cannot create --out {out}: {e.strerror}")


def _policies(policy: str, rules_name: str) -> tuple[list[str], object, bool]:
    """The --policy stacks' names, the simulator rules, and whether a stack shares GPUs (every stack is parsed)."""
    from meshsched.sim.rules import rules_named

    names = [p.strip() for p in policy.split(",") if p.strip()]
    if not names:
        fail("--policy is empty")
    try:
        rules = rules_named(rules_name)
        for spec in names:  # every stack, so that a bad one anywhere in the list fails here, in one line
            parse_policy(spec)
        sharing = any(needs_models(spec) for spec in names)
    except (UnknownPolicy, ValueError) as e:
        fail(str(e))
    return names, rules, sharing


def _plan_allocators(names: list[str], window: str | None, load: float, cluster_text: str | None) -> list[str]:
    """The stacks that allocate with execution plans: all of them or none, and none of the options they ignore."""
    planned = [n for n in names if needs_plan_models(n)]
    if planned:
        if len(planned) != len(names):
            fail(f"{', '.join(planned)} allocate with execution plans and replay plan-profile workloads; compare them "
                 f"with each other (rubick, sia, synergy), not with {', '.join(n for n in names if n not in planned)}")
        if window is not None or load != 1.0 or cluster_text is not None:
            fail("--window, --load and --cluster do not apply to plan allocators (their workload is the trace's "
                 "busiest 12 hours, docs/results/rubick.md)")
    return planned


def _plan_share(names: list[str], planned: list[str], plan_jobs: float | None) -> float:
    """The share of the trace's jobs that become plan-profile jobs (--plan-jobs; default: 0.25 with a plan layer)."""
    share = plan_jobs if plan_jobs is not None else 0.25 if any(has_plan_layer(n) for n in names) else 0.0
    if not 0.0 <= share <= 1.0:
        fail(f"--plan-jobs is a share of the jobs, in [0, 1]; got {share:g}")
    if share and planned:
        fail(f"--plan-jobs mixes plan-profile jobs into a trace; {', '.join(planned)} replay their own plan workload")
    return share


def _perf_model(planned: list[str], share: float, gpu_type: str, overheads: str):
    """The replay's performance model: the plan model for plan allocators, the profiles' otherwise, both (a
    MixedPerfModel) when plan-profile jobs are mixed into the trace."""
    from meshsched.perf.mixed import MixedPerfModel

    try:
        if planned:
            return _plan_perf(gpu_type)
        perf = load_perf_model(overheads)
        return MixedPerfModel(perf, _plan_perf(DEFAULT_GPU_TYPE)) if share else perf
    except UnknownProfile as e:
        fail(str(e))


def _mixed(tr, perf, share: float, gpu_type: str, gpus_per_node: int, total_gpus: int, seed: int):
    """The trace with `share` of its jobs of the plan profiles (meshsched.sim.mixed_trace); as it is for 0."""
    if not share:
        return tr
    from dataclasses import replace

    from meshsched.sim.mixed_trace import with_plan_jobs

    jobs = with_plan_jobs(tr.jobs, perf, share, gpu_type, gpus_per_node, min(total_gpus, 64), seed)
    n = sum(1 for a, b in zip(tr.jobs, jobs) if a is not b)
    return replace(tr, name=f"{tr.name}, {n} of them plan-profile jobs", jobs=tuple(jobs))


def _stacks(names: list[str], rules, perf, sharing: bool, seed: int, mps_one_user: bool) -> dict:
    """Each stack, built once before the trace is loaded, with the performance model (and overhead regime) the
    replay runs in; the interference predictor (XGBoost, slow to import) only for a sharing policy."""
    from meshsched.loaders.profiles import installed_handle
    from meshsched.sim.rules import check_policy

    handle = installed_handle(seed, sharing, mps_one_user, perf)
    try:
        stacks = {n: make_policy(n, handle) for n in names}
        for stack in stacks.values():
            check_policy(rules, stack)
    except ValueError as e:
        fail(str(e))
    return stacks


def _mixed_cluster(cluster_text: str | None, gpus_per_node: int, perf):
    """The --cluster option's ClusterSpec (None without it); every GPU type in it must be profiled."""
    from meshsched.sim.loop import ClusterSpec

    if cluster_text is None:
        return None
    try:
        cluster = ClusterSpec.parse(cluster_text, gpus_per_node, lambda t: perf.gpu_memory_mb(t) if t in perf.gpu_types else 0)
    except ValueError as e:
        fail(str(e))
    for g in cluster.groups:
        if g.gpu_type not in perf.gpu_types:
            fail(f"unknown GPU type {g.gpu_type!r} in --cluster; profiled: {', '.join(perf.gpu_types)}")
    return cluster


def _size_warnings(tr, cluster, json_out: bool, perf) -> list[str]:
    """A warning for the jobs larger than the cluster and one per model whose per-GPU batches lie outside its
    profile's measured range (echoed unless --json); nothing to simulate if every job is too large."""
    from meshsched.perf.batch_range import batch_warnings

    too_big = sum(1 for j in tr.jobs if j.gpus > cluster.total_gpus)
    if tr.jobs and too_big == len(tr.jobs):
        fail(f"every one of the {too_big} jobs needs more than the cluster's {cluster.total_gpus} GPUs: nothing "
             "to simulate (give more --nodes or --gpus-per-node)")
    warnings = [f"{too_big} job(s) need more than the cluster's {cluster.total_gpus} GPUs: reported as "
                "unschedulable"] if too_big else []  # fmt: skip
    warnings += batch_warnings(perf, tr.jobs, cluster.gpu_type)
    if not json_out:
        for w in warnings:
            typer.echo(f"mesh: warning: {w}", err=True)
    return warnings


def _replay(names: list[str], stacks: dict, tr, perf, cluster, rules, json_out: bool,
            warnings: list[str], events=()) -> tuple[dict, list[tuple[object, float]]]:
    """Each stack's replay and (summary, wall seconds); jobs refused at submit are appended to `warnings`."""
    from meshsched.sim.loop import simulate
    from meshsched.sim.metrics import summarise

    results = {}
    summaries: list[tuple[object, float]] = []
    with _progress(json_out) as bar:
        for name in names:
            task = bar.add_task(name, total=len(tr.jobs))
            t0 = time.perf_counter()
            try:
                r = simulate(
                    tr.jobs, stacks[name], perf, cluster,
                    progress=lambda n, task=task: bar.update(task, completed=n), rules=rules, events=events,
                    durations=tr.durations if len(tr.durations) == len(tr.jobs) else None,
                )  # fmt: skip
            except RuntimeError as e:
                fail(f"{name}: {e}")
            wall = time.perf_counter() - t0
            bar.remove_task(task)
            results[name] = r
            summaries.append((summarise(r, name), wall))
            refused = [j.reason for j in r.engine.state.jobs.values() if j.reason.startswith("refused: ")]
            if refused:  # jobs that could never run: failed at submit, one line each (the first few)
                warnings.append(f"{name}: {len(refused)} job(s) refused at submit, e.g. {refused[0]}")
                if not json_out:
                    typer.echo(f"mesh: warning: {warnings[-1]}", err=True)
    return results, summaries


def _write_files(out: Path | None, plot: bool, results: dict, summaries: list, json_out: bool) -> None:
    """The --out summaries and jobs CSVs, the --plot figure; their paths on stderr unless --json."""
    if out is not None:
        written = _write_outputs(out, results, summaries)
        if not json_out:
            typer.echo(f"summaries: {', '.join(str(p) for p in written)}", err=True)
    if plot:
        from meshsched.cli.plot import plot_comparison

        target = (out or Path(".")) / "simulate.png"
        plot_comparison(results, target)
        if not json_out:
            typer.echo(f"plot: {target}", err=True)  # plain: rich would wrap a long path


def _plan_perf(gpu_type: str):
    """The plan model of `gpu_type` (the default GPU type has none: the A800 plans)."""
    from meshsched.loaders.profiles import load_plan_catalog
    from meshsched.perf.plans import PlanPerfModel

    return PlanPerfModel(load_plan_catalog("a800" if gpu_type == DEFAULT_GPU_TYPE else gpu_type))


def _plan_trace(trace: str, perf, gpus: int, gpus_per_node: int, seed: int, jobs: int | None):
    """The paper's workload for plan allocators (meshsched.sim.rubick_trace), as a Trace."""
    from meshsched.loaders.traces import Trace, load_plan_trace
    from meshsched.sim.rubick_trace import WorkloadOptions

    specs = load_plan_trace(trace, perf, WorkloadOptions(jobs=jobs or 406, max_gpus=min(gpus, 64),
                                                          gpus_per_node=gpus_per_node, seed=seed))
    return Trace(f"{trace} (busiest 12 h, plan models)", tuple(specs), ())


# (column, shown without --wide, cell) for the comparison table; the default set fits 100 columns
COLUMNS = (
    ("policy", True, lambda s, w: s.policy),
    ("done", True, lambda s, w: str(s.completed)),
    ("unsched", True, lambda s, w: str(s.unschedulable)),
    ("JCT h", True, lambda s, w: f"{s.jct_mean_h:.2f}"),
    ("p50", True, lambda s, w: f"{s.jct_p50_h:.2f}"),
    ("p95", True, lambda s, w: f"{s.jct_p95_h:.1f}"),
    ("p99", False, lambda s, w: f"{s.jct_p99_h:.1f}"),
    ("wait h", True, lambda s, w: f"{s.wait_mean_h:.2f}"),
    ("span h", True, lambda s, w: f"{s.makespan_h:.0f}"),
    ("preempt", True, lambda s, w: str(s.preemptions)),
    ("futile", False, lambda s, w: str(s.futile_preemptions)),
    ("fut GPU-h", False, lambda s, w: f"{s.futile_gpu_h:.1f}"),
    ("util", True, lambda s, w: f"{s.useful_utilisation:.1%}"),  # useful GPU-time (solo speed) / capacity
    ("busy", False, lambda s, w: f"{s.gpu_utilisation:.1%}"),  # run GPU-time / capacity (slowed shared jobs count more)
    ("deadl", False, lambda s, w: f"{s.deadline_met:.1%}"),
    ("sim s", True, lambda s, w: f"{w:.1f}"),
)


def _progress(disabled: bool):
    """rich's progress bar on a terminal's stderr; nothing (and no rich import) for --json."""
    if disabled:
        return nullcontext(_NoProgress())
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("jobs arrived"),
        TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal,
    )  # fmt: skip


class _NoProgress:
    def add_task(self, *args, **kwargs) -> int:
        return 0

    def update(self, *args, **kwargs) -> None:
        return None

    def remove_task(self, *args) -> None:
        return None


def _print_table(trace: str, n: int, cluster, rows: list, wide: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    cols = [c for c in COLUMNS if wide or c[1]]
    t = Table(title=f"{trace}: {n} jobs on {cluster.describe()} GPUs",
              box=None, pad_edge=False, header_style="bold")
    for name, _, _ in cols:
        t.add_column(name, justify="left" if name == "policy" else "right", no_wrap=True)
    for s, wall in rows:
        t.add_row(*(cell(s, wall) for _, _, cell in cols))
    console = Console()
    if not console.is_terminal:
        console = Console(width=160 if wide else 100)
    console.print(t)


def _write_outputs(out: Path, results: dict, rows: list) -> list[Path]:
    import csv
    import json

    from meshsched.sim.metrics import summary_dict

    written = [out / "summary.json", out / "summary.csv"]
    for name, r in results.items():
        written.append(out / f"jobs-{name.replace('@', '_at_')}.csv")
        write_jobs_csv(r, written[-1])
    dicts = [dict(summary_dict(s), sim_seconds=round(w, 2)) for s, w in rows]
    (out / "summary.json").write_text(json.dumps(dicts, indent=2) + "\n")
    with (out / "summary.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dicts[0]))
        w.writeheader()
        w.writerows(dicts)
    return written


def write_jobs_csv(result, path: Path) -> None:
    """One row per job (`meshsched.sim.metrics.JOB_COLUMNS`)."""
    import csv

    from meshsched.sim.metrics import JOB_COLUMNS, job_row

    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=JOB_COLUMNS)
        w.writeheader()
        for job in result.engine.state.jobs.values():
            w.writerow(job_row(job))


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate_cmd)
