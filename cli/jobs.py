"""`mesh submit|ls|show|logs|cancel|nodes|top|daemon`: the job commands, a thin client of meshd's API."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from meshsched.cli.client import ApiError, Client, DaemonUnavailable
from meshsched.cli.output import fail, print_json

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@contextmanager
def _api() -> Iterator[Client]:
    client = Client()
    try:
        yield client
    except DaemonUnavailable:
        fail(
            f"meshd is not running (no daemon at {client.path}); start it with `mesh daemon --fake-gpus 8 &` "
            "or `systemctl start meshd`"
        )
    except ApiError as exc:
        fail(str(exc), code=1)


def fmt_time(seconds: float) -> str:
    """Slurm's TIME column: M:SS, H:MM:SS or D-HH:MM:SS."""
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def where(job: dict[str, Any]) -> str:
    """NODE(REASON): the node while it holds GPUs, else (reason)."""
    if job["state"] in ("LOADING", "RUNNING", "PAUSING"):
        return job["node"]
    return f"({job['reason']})" if job["reason"] else ""


def parse_deadline(text: str, now: float) -> float:
    """`2h`, `90m`, `30s`, `1d` from now, or an ISO date-time."""
    m = _DURATION.match(text.strip())
    if m:
        return now + float(m.group(1)) * _UNITS[m.group(2)]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        fail(f"--deadline {text!r}: give a duration like 2h / 90m or an ISO date-time")


def build_command(script: Path, args: list[str]) -> list[str]:
    path = script.resolve()
    if path.suffix == ".py" or not os.access(path, os.X_OK):
        return [sys.executable, str(path), *args]
    return [str(path), *args]


def partners(job: dict[str, Any]) -> str:
    """The jobs sharing its GPUs (its colocation set), or -."""
    return ",".join(job.get("partners") or ()) or "-"


def _exec(job: dict[str, Any]) -> dict | None:
    """How it trains now (its ExecConfig) while it holds GPUs."""
    return job.get("exec") if job["state"] in ("LOADING", "RUNNING", "PAUSING") else None


def batch(job: dict[str, Any]) -> str:
    """Per-GPU micro-batch x accumulation steps it trains with (its ExecConfig), or -."""
    x = _exec(job)
    return f"{x['micro_batch']}x{x['accumulation']}" if x else "-"


def mps(job: dict[str, Any]) -> str:
    """Its MPS active-thread percentage (100 = a whole GPU), or -."""
    x = _exec(job)
    return str(x["mps_percentage"]) if x else "-"


def jobs_lines(jobs: list[dict[str, Any]]) -> list[str]:
    """squeue-style plain columns (fast for thousands of jobs, easy to grep)."""
    header = ("JOBID", "NAME", "USER", "STATE", "TIME", "GPUS", "PARTNER", "BATCH", "MPS%", "NODE(REASON)")
    rows = [header] + [
        (j["job_id"], j["name"], j["user"], j["state"], fmt_time(j["elapsed"]), str(j["gpus"]), partners(j),
         batch(j), mps(j), where(j)) for j in jobs
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]


def register(app: typer.Typer) -> None:
    """Add the job commands to the `mesh` app."""

    @app.command()
    def submit(
        script: Path = typer.Argument(..., help="training script (python file or executable)"),
        args: list[str] = typer.Argument(None, help="arguments for the script (after --)"),
        gpus: int = typer.Option(1, "--gpus", "-g", help="GPUs (one worker process per GPU)"),
        batch_size: int = typer.Option(32, "--batch-size", help="global batch size (for the estimate)"),
        iters: int = typer.Option(100, "--iters", help="expected iterations (the scheduler's estimate)"),
        model: str = typer.Option("custom", "--model", help="reuse a profiled model's speed, e.g. resnet18"),
        name: str = typer.Option("", "--name", help="job name (default: the script's name)"),
        deadline: str = typer.Option("", "--deadline", help="2h / 90m / ISO date-time"),
        guaranteed: bool = typer.Option(False, "--guaranteed/--best-effort", help="performance guarantee"),
        as_json: bool = typer.Option(False, "--json", help="print the job as JSON"),
    ) -> None:
        """Submit a training job; prints its id."""
        if gpus < 1:
            fail(f"--gpus must be at least 1, got {gpus}")
        if not script.is_file():
            fail(f"script {script} does not exist")
        body = {
            "command": build_command(script, list(args or [])), "cwd": os.getcwd(), "gpus": gpus,
            "batch_size": batch_size, "iterations": iters, "model": model, "name": name,
            "deadline": parse_deadline(deadline, time.time()) if deadline else None, "guaranteed": guaranteed,
        }
        with _api() as api:
            job = api.call("POST", "/v1/jobs", body)
        if as_json:
            print_json(job)
        else:
            typer.echo(f"Submitted job {job['job_id']}")

    @app.command("ls")
    def ls(
        all_jobs: bool = typer.Option(False, "--all", "-a", help="include finished jobs"),
        as_json: bool = typer.Option(False, "--json"),
    ) -> None:
        """List jobs like squeue: JOBID NAME USER STATE TIME GPUS NODE(REASON)."""
        with _api() as api:
            jobs = api.call("GET", "/v1/jobs?all=1" if all_jobs else "/v1/jobs?all=0")
        if as_json:
            print_json(jobs)
            return
        typer.echo("\n".join(jobs_lines(jobs)))

    @app.command()
    def show(job_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
        """Everything about one job, with its state history."""
        with _api() as api:
            job = api.call("GET", f"/v1/jobs/{job_id}")
        if as_json:
            print_json(job)
            return
        for key in ("job_id", "name", "user", "state", "reason", "gpus", "node", "assigned", "model", "batch_size",
                    "iterations", "done_iterations", "checkpoint_iterations", "restarts", "cwd", "job_dir"):
            typer.echo(f"{key:>22}: {job.get(key)}")
        typer.echo(f"{'partners':>22}: {partners(job)}")
        typer.echo(f"{'micro-batch x accum':>22}: {batch(job)}")
        typer.echo(f"{'MPS %':>22}: {mps(job)}")
        typer.echo(f"{'command':>22}: {' '.join(job['command'])}")
        typer.echo(f"{'time':>22}: {fmt_time(job['elapsed'])}")
        for at, state, reason in job.get("history", []):
            stamp = datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")
            typer.echo(f"{stamp}  {state:<10} {reason}")

    @app.command()
    def logs(
        job_id: str,
        follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends"),
        rank: int = typer.Option(0, "--rank", "-r", help="which worker's log"),
    ) -> None:
        """Print a job's log (one file per rank)."""
        offset = 0
        with _api() as api:
            while True:
                status, headers, data = api.raw("GET", f"/v1/jobs/{job_id}/logs?rank={rank}&offset={offset}")
                if status >= 400:
                    import json

                    raise ApiError(status, json.loads(data).get("error", f"HTTP {status}"))
                sys.stdout.buffer.write(data)
                sys.stdout.flush()
                offset = int(headers.get("X-Log-Offset", offset))
                if not follow or (not data and headers.get("X-Job-State") in TERMINAL):
                    return
                if not data:
                    time.sleep(0.5)  # client-side follow, like tail -f

    @app.command()
    def cancel(job_ids: list[str] = typer.Argument(..., help="job ids")) -> None:
        """Cancel jobs (running ones get SIGTERM, then SIGKILL after the grace period)."""
        with _api() as api:
            for job_id in job_ids:
                job = api.call("POST", f"/v1/jobs/{job_id}/cancel")
                typer.echo(f"job {job_id}: {job['state']}")

    @app.command()
    def nodes(as_json: bool = typer.Option(False, "--json")) -> None:
        """Nodes and their GPUs."""
        from rich.console import Console
        from rich.table import Table

        with _api() as api:
            data = api.call("GET", "/v1/nodes")
        if as_json:
            print_json(data)
            return
        table = Table(box=None, header_style="bold", pad_edge=False)
        for col in ("NODE", "STATE", "GPUS", "FREE", "TYPE", "BACKEND", "POLICY", "QUEUE"):
            table.add_column(col)
        for n in data:
            table.add_row(n["name"], "up" if n["alive"] else "down", str(n["total_gpus"]), str(n["free_gpus"]),
                          n["gpus"][0]["name"] if n["gpus"] else "-", n["backend"], n["policy"], str(n["queue_length"]))
        Console().print(table)

    @app.command()
    def top(
        once: bool = typer.Option(False, "--once", help="print one frame and exit"),
        interval: float = typer.Option(1.0, "--interval", help="seconds between refreshes"),
    ) -> None:
        """Live view: one line per GPU (gpustat style), one row per running job."""
        from rich.console import Console, Group
        from rich.live import Live
        from rich.table import Table

        def frame() -> Group:
            with _api() as api:
                node = api.call("GET", "/v1/nodes")[0]
                jobs = api.call("GET", "/v1/jobs?all=0")
            lines = [f"[bold]{node['name']}[/]  {node['backend']}  policy {node['policy']}  "
                     f"queue {node['queue_length']}  free {node['free_gpus']}/{node['total_gpus']}"]
            for g in node["gpus"]:
                util = f"{g['utilization']:>3d} %" if g["utilization"] >= 0 else "  ? %"
                lines.append(f"[{g['index']}] {g['name']:<12} {util} | {g['memory_used_mb']:>6} / "
                             f"{g['memory_total_mb']:>6} MB | {', '.join(g['jobs']) or '-'}")
            table = Table(box=None, header_style="bold", pad_edge=False)
            for col in ("JOBID", "NAME", "STATE", "GPUS", "PARTNER", "BATCH", "SM%", "STEP", "STEPS/S", "TIME"):
                table.add_column(col)
            for j in jobs:
                rate = f"{1 / j['step_time']:.2f}" if j["state"] == "RUNNING" and j["step_time"] > 0 else "-"
                table.add_row(j["job_id"], j["name"], j["state"], ",".join(map(str, j["gpu_names"])) or "-", partners(j),
                              batch(j), mps(j),
                              f"{j['done_iterations']:.0f}/{j['iterations']}", rate, fmt_time(j["elapsed"]))
            return Group(*lines, table)

        console = Console()
        if once:
            console.print(frame())
            return
        with Live(frame(), console=console, refresh_per_second=4) as live:
            try:
                while True:
                    time.sleep(interval)
                    live.update(frame())
            except KeyboardInterrupt:
                pass

    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def daemon(ctx: typer.Context) -> None:
        """Run meshd in the foreground (same flags as `meshd`, e.g. --fake-gpus 8)."""
        from meshsched.daemon.main import main as meshd_main

        meshd_main(list(ctx.args))
