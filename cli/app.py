"""The full `mesh` typer app: every command, its options and its --help.

`mesh` runs the common commands through the lean parser (cli/fast.py) and comes here for everything
else: other commands, --help, and any command line the lean parser does not take (typer then gives its
usual error). The job commands' options are declared here once; tests/test_cli_fast.py checks that the
lean parser accepts exactly these.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import typer

from meshsched.cli import admin, jobs, profiles, simulate
from meshsched.cli.client import RECONNECT_SECONDS

app = typer.Typer(
    name="mesh",
    help="meshsched: schedule deep-learning training on GPU clusters, and replay traces to compare policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def submit(
    script: Path = typer.Argument(..., help="training script (python file or executable)"),
    args: list[str] = typer.Argument(None, help="arguments for the script (after --)"),
    gpus: int = typer.Option(1, "--gpus", "-g", help="GPUs (one worker process per GPU)"),
    batch_size: int = typer.Option(32, "--batch-size", help="global batch size (for the estimate)"),
    iters: int | None = typer.Option(
        None, "--iters",
        help="expected iterations (the scheduler's estimate); default: the total a meshsched.job script "
             "declares (attach(total_steps=N)), else 100",
    ),  # fmt: skip
    model: str = typer.Option(
        "custom", "--model",
        help="reuse a profiled model's speed, e.g. resnet18 (under rubick, sia, synergy: a plan profile, e.g. gpt2)"),
    name: str = typer.Option("", "--name", help="job name (default: the script's name)"),
    deadline: str = typer.Option("", "--deadline", help="2h / 90m / ISO date-time"),
    guaranteed: bool = typer.Option(False, "--guaranteed/--best-effort", help="performance guarantee"),
    as_json: bool = typer.Option(False, "--json", help="print the job as JSON"),
    array: str = typer.Option(
        "", "--array", "-a",
        help="a job array in one request: task ids 0-299, 1,3,5-7 or 0-15:4, with %N for at most N at once "
             "(0-999%8); tasks are jobs ARRAY_TASK with MESH_ARRAY_TASK_ID set",
    ),  # fmt: skip
    dependency: str = typer.Option(
        "", "--dependency", "-d",
        help="start after other jobs end: afterok:ID[:ID], afterany:ID, afternotok:ID, several joined by ',' "
             "(an array id: all its tasks); one that can never be met cancels the job (DependencyNeverSatisfied)",
    ),  # fmt: skip
    time_limit: str = typer.Option(
        "", "--time", "-t",
        help="time limit per run: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM:SS; then checkpoint and stop (TIMEOUT)",
    ),  # fmt: skip
    hold: bool = typer.Option(False, "--hold", help="submit held: queued only after `mesh release`"),
    wait: bool = typer.Option(False, "--wait", "-W", help="block until the job (every task) ends; exit with its code"),
    output: str = typer.Option(
        "", "--output", "-o", help="also append stdout to this file: %j job id, %A array id, %a task, %u user, "
                                   "%x name (the per-rank logs stay in the job directory)"),
    error: str = typer.Option("", "--error", "-e", help="stderr to this file (same patterns); default: with stdout"),
    begin: str = typer.Option(
        "", "--begin", "-b", help="not before: now+N (seconds), now+5m, now+2hours, HH:MM[:SS], or an ISO date-time "
                                  "(reason BeginTime until then)"),
    plan: str = typer.Option(
        "", "--plan", help="execution plan, e.g. dp2-ga2-gc (dpN tpN ppN gaN zN gc off; dp x tp x pp = --gpus); "
                           "the job reads it as MESH_PLAN; refused when the plan model says it cannot fit"),
    cpus: int | None = typer.Option(None, "--cpus", help="CPU cores in all (default: the node's share per GPU)"),
    mem: str = typer.Option("", "--mem", help="host memory in all, in GB (64 or 64G; default: the node's share)"),
    tenant: str = typer.Option("", "--tenant", help="tenant whose quota a --guaranteed job uses (default: default)"),
    reconnect: float = typer.Option(
        RECONNECT_SECONDS, "--reconnect", metavar="SECONDS",
        help="with --wait: how long to wait for a meshd that went away (restarted) to come back"),
    export: str = typer.Option(
        "ALL", "--export",
        help="the job's environment, as sbatch: ALL (this shell's, at submit), NONE (a minimal PATH, HOME, USER, "
             "LANG), or VAR[,VAR=value...] (those, over the minimal one; ALL,VAR=value: all and those); meshd adds "
             "its own (RANK..., CUDA_VISIBLE_DEVICES, MESH_*)"),
    signal: str = typer.Option(
        "", "--signal", metavar="[B:]SIG[@SECONDS]",
        help="send SIG (USR1, 10...) to every rank SECONDS (default 60) before the time limit, once per run; B: to "
             "rank 0 only"),
) -> None:
    """Submit a training job; prints its id. The script runs as from this shell: an executable is executed, a
    script with a #! line runs through it, a .py file without one on the python3 first on the job's PATH. A job
    that could never run (a plan that does not fit, more CPUs or memory than any node has, a guaranteed job over
    its tenant's quota) is refused in one line, nothing queued.

    #MESH lines at the top of the script (after the #! line, before the first command) give options too, as
    sbatch's #SBATCH lines: `#MESH --gpus 4`, `#MESH --time 2:00:00`; the command line wins over them."""
    values = dict(locals())  # the options as typer converted them; only those this command line set go on
    from meshsched.cli.directives import given, merge

    ctx = typer.main.get_current_context()
    on_line = {k: v for k, v in values.items() if k in given(ctx) - {"script", "args"}}
    jobs.submit(str(script), list(args or []), **merge(str(script), on_line, ctx.command))


@app.command("ls")
def ls(
    job_ids: list[str] = typer.Argument(None, help="only these jobs (an array id: all its tasks, ended or not)"),
    all_jobs: bool = typer.Option(False, "--all", "-a", help="include finished jobs"),
    as_json: bool = typer.Option(False, "--json", help="print the jobs as JSON (every task of an array)"),
    user: str = typer.Option("", "--user", "-u", help="only this user's jobs"),
    me: bool = typer.Option(False, "--me", help="only my jobs"),
    state: str = typer.Option(
        "", "--state", "-t", help="only jobs in these states, e.g. PENDING,RUNNING (an ended state: ended jobs too)"),
    name: str = typer.Option("", "--name", "-n", help="only jobs with this name"),
    fmt: str = typer.Option(
        "", "--format", "-o", help="the columns, e.g. id,user,state,time,name; fields: id name user state time gpus "
                                   "partner batch mps where node reason submit start end limit left array step exit"),
    array_unfold: bool = typer.Option(False, "--array-unfold", "-r", help="one row per pending array task"),
) -> None:
    """List jobs like squeue: JOBID NAME USER STATE TIME GPUS PARTNER BATCH MPS% NODE(REASON).

    TIME is the time a job ran (held GPUs), not while it was queued, held or preempted. Pending tasks of an array
    are one row (12_[5-299%8]: tasks 5 to 299, at most 8 at once) unless --array-unfold. Columns are cut to 32
    cells with an ellipsis. An id that names no job is an error (exit 1), after the jobs the others name."""
    from meshsched.cli import views

    views.ls(all_jobs, as_json, list(job_ids or []) or None, user, me, state, name, fmt, array_unfold)


@app.command()
def show(
    job_id: str = typer.Argument(..., help="job id"),
    as_json: bool = typer.Option(False, "--json", help="print the job as JSON"),
) -> None:
    """Everything about one job (scontrol show job): times (submit, eligible, begin, start, end, run, limit, left),
    exit code, the command, stdout, progress with its state history. done_iterations is '-' for a job that reports
    no steps (the scheduler's estimate is shown beside it, marked as one)."""
    from meshsched.cli import views

    views.show(job_id, as_json)


@app.command()
def logs(
    job_id: str = typer.Argument(..., help="job id"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends"),
    rank: int = typer.Option(0, "--rank", "-r", help="which worker's log"),
    reconnect: float = typer.Option(
        RECONNECT_SECONDS, "--reconnect", metavar="SECONDS",
        help="how long to wait for a meshd that went away (restarted) to come back"),
) -> None:
    """Print a job's log (one file per rank); while it is empty, says so on stderr. With -f, a restart of meshd
    is ridden through: the log goes on from where it was, no line twice."""
    jobs.logs(job_id, follow, rank, reconnect)


@app.command()
def cancel(
    job_ids: list[str] = typer.Argument(None, help="job ids (an array id: every task of it)"),
    state: str = typer.Option("", "--state", "-t", help="only jobs in these states (PENDING,RUNNING,...)"),
    name: str = typer.Option("", "--name", "-n", help="only jobs with this name"),
    user: str = typer.Option("", "--user", "-u", help="only this user's jobs"),
    me: bool = typer.Option(False, "--me", help="only my jobs (all of them, with no other filter)"),
    signal: str = typer.Option("", "--signal", "-s", help="send this signal (USR1, 10) to the ranks instead"),
) -> None:
    """Cancel jobs (running ones get SIGTERM, then SIGKILL after the grace period).

    With filters (--state, --name, --user, --me; all must hold) or --signal, one request selects every
    unfinished job they match, among the given ids when there are any; a user who is not an operator selects
    among their own jobs only.

    Exit status: 0 every job was cancelled; 3 a job had already ended (nothing done to it), or no job matched
    the filters; 1 meshd refused one (e.g. unknown job); 2 usage error or meshd not reachable.
    """
    jobs.cancel(list(job_ids or []), state, name, user, me, signal)


@app.command()
def hold(job_ids: list[str] = typer.Argument(..., help="job or array ids")) -> None:
    """Keep queued jobs from starting until `mesh release` (reason JobHeldUser). Exit 1 if one was refused."""
    jobs.hold(job_ids)


@app.command()
def release(job_ids: list[str] = typer.Argument(..., help="job or array ids")) -> None:
    """Let held jobs be scheduled again. Exit 1 if one was refused (e.g. not held)."""
    jobs.release(job_ids)


@app.command()
def requeue(job_ids: list[str] = typer.Argument(..., help="job or array ids")) -> None:
    """Checkpoint running jobs and queue them again; they resume from the checkpoint. Exit 1 if one was refused."""
    jobs.requeue(job_ids)


@app.command()
def acct(
    since: str = typer.Option("", "--since", "-S", help="ended at or after: -1d, -3h, -90m, now, or 2026-11-01[T08:00]"),
    until: str = typer.Option("", "--until", "-E", help="ended before (same forms as --since)"),
    user: str = typer.Option("", "--user", "-u", help="only these users' jobs (a,b)"),
    state: str = typer.Option("", "--state", "-s", help="only jobs that ended so (COMPLETED,FAILED,CANCELLED,TIMEOUT)"),
    summary: bool = typer.Option(False, "--summary", help="GPU-hours per user and per tenant over the period"),
    as_json: bool = typer.Option(False, "--json", help="print the rows (or the summary) as JSON"),
    as_csv: bool = typer.Option(False, "--csv", help="print the rows (or the summary) as CSV"),
) -> None:
    """Accounting of ended jobs, as sacct: one row per job (id, user, tenant, name, state, exit code, submit /
    start / end, GPUs, GPU-hours, restarts, nodes), kept after retention forgets the job. GPU-hours: GPUs x the
    seconds of each run, summed over its runs. A user sees their own jobs only, an operator everyone's."""
    from meshsched.cli import acct as acct_view

    acct_view.acct(since, until, user, state, as_json, as_csv, summary)


@app.command()
def nodes(as_json: bool = typer.Option(False, "--json", help="print the nodes as JSON")) -> None:
    """Nodes and their GPUs."""
    jobs.nodes(as_json)


@app.command()
def top(
    once: bool = typer.Option(False, "--once", help="print one frame and exit"),
    interval: float = typer.Option(1.0, "--interval", help="seconds between refreshes"),
    as_json: bool = typer.Option(False, "--json", help="print one frame (nodes and jobs) as JSON and exit"),
    width: int = typer.Option(
        0, "--width", help="lay the frame out in this many columns (default: the terminal's; into a pipe: all)"),
    reconnect: float = typer.Option(
        RECONNECT_SECONDS, "--reconnect", metavar="SECONDS",
        help="how long the live view waits for a meshd that went away (restarted) to come back"),
) -> None:
    """Live view: one line per GPU (gpustat style), one row per job (GPU% is '-' where it is not measured); `q`
    quits. Narrow terminals keep JOBID, NAME and STATE and drop the other columns, least useful first."""
    from meshsched.cli import top as top_view

    top_view.top(once, interval, as_json, width, reconnect)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def daemon(ctx: typer.Context) -> None:
    """Run meshd in the foreground (same flags as `meshd`, e.g. --fake-gpus 8)."""
    from meshsched.daemon.main import main as meshd_main

    meshd_main(list(ctx.args))


simulate.register(app)
admin.register(app)  # drain, resume
app.add_typer(profiles.app, name="profiles")


def _unwrapped(doc: str) -> str:
    """A command's docstring as --help shows it: its paragraphs kept, the line breaks inside each joined (rich
    prints every newline of a help text, so a docstring wrapped for the source came out ragged at any width)."""
    return "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(doc).split("\n\n"))


for _cmd in (*app.registered_commands, *profiles.app.registered_commands):
    if _cmd.help is None and _cmd.callback is not None and _cmd.callback.__doc__:
        _cmd.help = _unwrapped(_cmd.callback.__doc__)
