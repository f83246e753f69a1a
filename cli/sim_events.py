"""`mesh simulate --events FILE`: the operator's drains and resumes replayed with a trace, and what they cost
(the jobs they delay, the mean JCT without them), so that a maintenance window can be planned."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from meshsched.cli.output import fail
from meshsched.loaders.events import EventsError, load_events


def load_said(events_file: Path | None, tr, cluster) -> list:
    """The file's (time, DrainChanged) pairs on `cluster`'s nodes and `tr`'s clock; [] without a file."""
    if events_file is None:
        return []
    try:
        return load_events(events_file, cluster.node_specs(), getattr(tr, "origin", None), getattr(tr, "load", 1.0))
    except EventsError as e:
        fail(str(e))


def events_effect(said: list, names: list[str], fresh_stacks: dict, tr, perf, cluster, rules,
                  results: dict) -> dict[str, dict]:
    """Per policy: the jobs that finished later with the events than in a replay without them (or not at all),
    and the mean JCT (h) without them; {} without events. `fresh_stacks`: stacks not yet used by a replay."""
    if not said:
        return {}
    from meshsched.sim.loop import simulate
    from meshsched.sim.metrics import summarise

    out = {}
    for name in names:
        try:
            base = simulate(tr.jobs, fresh_stacks[name], perf, cluster, rules=rules,
                            durations=tr.durations if len(tr.durations) == len(tr.jobs) else None)
        except RuntimeError as e:
            fail(f"{name} (without --events): {e}")
        out[name] = {"delayed_by_events": delayed_jobs(results[name], base),
                     "jct_mean_h_without_events": _finite(summarise(base, name).jct_mean_h)}
    return out


def delayed_jobs(with_events, without) -> int:
    """Jobs that finished in the replay without the events and later (or never) in the one with them."""
    after = with_events.engine.state.jobs
    n = 0
    for job_id, job in without.engine.state.jobs.items():
        end = job.acct.finish_time
        if end is None:
            continue
        other = after.get(job_id)
        late = other is None or other.acct.finish_time is None or other.acct.finish_time > end + 1e-6
        n += late
    return n


def print_effect(events_file: Path | None, said: list, effect: dict, summaries: list) -> None:
    """One line per policy under the table: jobs delayed, mean JCT with and without the events."""
    if not said:
        return
    typer.echo(f"events: {len(said)} from {events_file}")
    for s, _ in summaries:
        e = effect[s.policy]
        without = e["jct_mean_h_without_events"]
        typer.echo(f"  {s.policy}: {e['delayed_by_events']} job(s) delayed; mean JCT {s.jct_mean_h:.2f} h, "
                   f"{'-' if without is None else f'{without:.2f}'} h without the events")


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
