"""`mesh ls` (squeue) and `mesh show` (scontrol show job): thin clients of meshd's API.

meshd selects, lays out and caches `mesh ls`'s table (daemon/listing.py, daemon/jobformat.py); this module builds
the query and passes the answer through. Stdlib only, as cli/jobs.py: `mesh ls` pays only for what it uses.
"""

from __future__ import annotations

import sys
import time

from meshsched.cli.client import ApiError, Client, DaemonUnavailable, error_of
from meshsched.cli.jobs import api_call, confinement, unreachable
from meshsched.cli.output import fail, print_json_bytes
from meshsched.wire.jobtable import batch, exec_of, fmt_time, mps, partners

_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~,")


def _quote(text: str) -> str:
    """`text` percent-encoded for a query (urllib.parse costs the fast path its imports)."""
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in text.encode())


def _get(url: str) -> tuple[dict[str, str], bytes]:
    """GET `url`: meshd's answer undecoded, and its headers. A refused query (400: a bad --state, --format) is a
    usage error (exit 2); any other refusal, e.g. no such job (404), exits 1."""
    client = Client()
    try:
        status, headers, data = client.raw("GET", url)
    except DaemonUnavailable as exc:
        unreachable(client, exc)
    except ApiError as exc:
        fail(str(exc), code=1)
    if status >= 400:
        fail(str(error_of(status, data)), code=2 if status == 400 else 1)
    return headers, data


def ls(all_jobs: bool = False, as_json: bool = False, job_ids: list[str] | None = None, user: str = "",
       me: bool = False, state: str = "", name: str = "", fmt: str = "", array_unfold: bool = False) -> None:
    """squeue: the unfinished jobs (all with --all or ids), filtered, in the default or --format columns; pending
    tasks of an array are one row unless --array-unfold. An id that names no job: an error (exit 1), after the
    jobs the other ids name."""
    url = "/v1/jobs?all=" + ("1" if all_jobs or job_ids else "0")
    if job_ids:  # those jobs (an array id: all of its tasks), ended or not
        url += "&job=" + ",".join(_quote(j) for j in job_ids)
    for key, value in (("user", user), ("state", state), ("name", name), ("fields", fmt)):
        if value:
            url += f"&{key}={_quote(value)}"
    if me:
        url += "&mine=1"
    if array_unfold:
        url += "&unfold=1"
    if as_json:
        headers, data = _get(url)
        print_json_bytes(data)
    else:  # meshd renders the table (cached between state changes): nothing to decode or align here
        headers, data = _get(url + "&format=table")
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
    unknown = headers.get("x-unknown-jobs")
    if unknown:
        sys.stdout.flush()
        fail(f"invalid job id {unknown.replace(',', ', ')}", code=1)


def _at(value: float | None, unknown: str = "-") -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(value)) if value is not None else unknown


def progress(job: dict) -> dict[str, str]:
    """`mesh show`'s progress lines: measured figures as they are, the scheduler's estimate marked as one."""
    p = job.get("progress") or {}
    est = p.get("estimated_iterations")
    guess = f"the scheduler's estimate: ~{int(est)} of {job['iterations']}" if est is not None else ""
    if p.get("measured"):
        step = p.get("step_time")
        return {"done_iterations": f"{int(p['iterations'])} (reported by the job)",
                "steps/s": f"{1 / step:.2f} (reported by the job)" if step else "-"}
    return {"done_iterations": f"- (the job reports no steps{'; ' + guess if guess else ''})", "steps/s": "-"}


def times(job: dict) -> dict[str, str]:
    """scontrol's times: submitted, eligible, begin, started, ended, run time, limit and what is left of it."""
    limit = job.get("time_limit")
    return {"submit_time": _at(job.get("submit_time")), "eligible_time": _at(job.get("eligible_time"), "Unknown"),
            "begin_time": _at(job.get("begin_time")), "start_time": _at(job.get("start_time")),
            "end_time": _at(job.get("end_time")), "run_time": fmt_time(job["elapsed"]),
            "time_limit": fmt_time(limit) if limit else "UNLIMITED",
            "time_left": "-" if job.get("time_left") is None else fmt_time(job["time_left"])}


def show(job_id: str, as_json: bool = False) -> None:
    if as_json:
        print_json_bytes(_get(f"/v1/jobs/{_quote(job_id)}")[1])
        return
    job = api_call("GET", f"/v1/jobs/{_quote(job_id)}")
    shown = dict(job, checkpoint_iterations=int(job.get("checkpoint_iterations") or 0),
                 exit_code="-" if job.get("exit_code") is None else job["exit_code"])
    if not job.get("iterations_given", True):
        shown["iterations"] = f"{job['iterations']} (no --iters: the total the script declares, else 100)"
    shown.update(progress(job))
    lines = [f"{key:>22}: {shown.get(key)}" for key in (
        "job_id", "name", "user", "state", "reason", "exit_code", "gpus", "node", "assigned", "model", "batch_size",
        "iterations", "done_iterations", "steps/s", "checkpoint_iterations", "restarts")]  # fmt: skip
    lines += [f"{key:>22}: {value}" for key, value in times(job).items()]
    lines += [f"{key:>22}: {job[key]}" for key in ("cwd", "job_dir") if key in job]
    lines.append(f"{'partners':>22}: {partners(job)}")
    lines.append(f"{'micro-batch x accum':>22}: {batch(job)}")
    lines.append(f"{'MPS %':>22}: {mps(job)}")
    running = (exec_of(job) or {}).get("plan")
    asked = {"plan": running or job.get("plan"),
             "plan asked": job.get("plan") if running and running != job.get("plan") else "",
             "cpus": job.get("cpus"), "memory (GB)": job.get("memory_gb"),
             "tenant": job.get("tenant") if job.get("tenant", "default") != "default" else ""}
    lines += [f"{key:>22}: {value}" for key, value in asked.items() if value]
    lines += [f"{key:>22}: {value}" for key, value in confinement(job).items() if value]
    if job.get("command"):
        lines.append(f"{'command':>22}: {' '.join(job['command'])}")
    if job.get("export"):  # its environment: the submitter's (ALL), or a minimal one (NONE) and the names listed
        lines.append(f"{'export':>22}: {job['export']}")
    logs = f"{job['job_dir']}/logs/rank0.log" if job.get("job_dir") else ""
    control = {"array": job.get("array_id") and f"{job['array_id']} task {job.get('array_task')}",
               "dependency": ",".join(f"{k}:{j}" if j else k for k, j in job.get("dependency") or ()),
               "held": "yes" if job.get("held") else "", "signal": job.get("signal"),
               "stdout": job.get("output") or logs, "stderr": job.get("error") or (logs and "with stdout")}
    lines += [f"{key:>22}: {value}" for key, value in control.items() if value]
    for at, state, reason in job.get("history", []):
        lines.append(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(at))}  {state:<10} {reason}")
    sys.stdout.write("\n".join(lines) + "\n")
