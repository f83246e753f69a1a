"""`mesh acct`: accounting of ended jobs, in the manner of Slurm's sacct (and `--summary`: sreport's GPU-hours per
user and per tenant). meshd keeps one row per ended job past retention (daemon/accounting.py); a user who is not an
operator sees their own rows only."""

from __future__ import annotations

import sys
import time
from urllib.parse import urlencode

from meshsched.cli.jobs import api_call, parse_deadline
from meshsched.cli.output import fail, print_json

COLUMNS = ("JOBID", "USER", "TENANT", "NAME", "STATE", "EXIT", "SUBMIT", "START", "END", "GPUS", "GPU-HOURS",
           "RESTARTS", "NODES")
CSV_FIELDS = ("job_id", "user", "tenant", "name", "state", "exit_code", "submit", "start", "end", "gpus", "gpu_hours",
              "gpu_seconds", "restarts", "nodes")


def parse_when(text: str, now: float, flag: str) -> float:
    """`now`, `-1d` / `-3h` / `-90m` / `-30s` before now, or an ISO date[-time] (`2026-11-01`, `2026-11-01T08:00`)
    -> UNIX time (the durations are `mesh submit --deadline`'s, counted back)."""
    t = text.strip()
    if t == "now":
        return now
    if t.startswith("-") and t[1:2].isdigit() and t[-1:] in "smhd":
        return 2 * now - parse_deadline(t[1:], now)
    from datetime import datetime

    try:
        return datetime.fromisoformat(t).timestamp()
    except ValueError:
        fail(f"{flag} {text!r}: give -1d / -3h / -90m / -30s (before now), now, or an ISO date[-time] like 2026-11-01")


def acct(since: str = "", until: str = "", user: str = "", state: str = "", as_json: bool = False,
         as_csv: bool = False, summary: bool = False) -> None:
    now = time.time()
    query = {"since": parse_when(since, now, "--since") if since else None,
             "until": parse_when(until, now, "--until") if until else None,
             "user": user, "state": state.upper(), "summary": "1" if summary else ""}
    if as_json and as_csv:
        fail("--json and --csv: give one")
    url = "/v1/acct?" + urlencode({k: v for k, v in query.items() if v not in (None, "")})
    data = api_call("GET", url)
    if as_json:
        print_json(data)
    elif summary:
        _print_summary(data, as_csv)
    elif as_csv:
        _print_csv(data)
    else:
        _print_table(data)


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "-"


def _print_table(rows: list[dict]) -> None:
    from meshsched.wire.jobtable import columns

    body = [(r["job_id"], r["user"], r.get("tenant") or "default", r["name"], r["state"],
             "-" if r.get("exit_code") is None else str(r["exit_code"]), _when(r.get("submit")), _when(r.get("start")),
             _when(r.get("end")), str(r["gpus"]), f"{r['gpu_hours']:.4f}", str(r["restarts"]),
             ",".join(r.get("nodes") or []) or "-") for r in rows]
    sys.stdout.write("\n".join(columns([COLUMNS, *body])) + "\n")


def _print_csv(rows: list[dict]) -> None:
    import csv

    out = csv.writer(sys.stdout)
    out.writerow(CSV_FIELDS)
    for r in rows:
        out.writerow(["" if r.get(f) is None else ";".join(r[f]) if f == "nodes" else r[f] for f in CSV_FIELDS])


def _print_summary(data: dict, as_csv: bool) -> None:
    lines = [("BY", "NAME", "JOBS", "GPU-HOURS")]
    for kind, table in (("user", data["users"]), ("tenant", data["tenants"])):
        lines += [(kind, name, str(e["jobs"]), f"{e['gpu_hours']:.4f}") for name, e in sorted(table.items())]
    total = data["total"]
    lines.append(("total", "-", str(total["jobs"]), f"{total['gpu_hours']:.4f}"))
    if as_csv:
        import csv

        csv.writer(sys.stdout).writerows([[c.lower() for c in lines[0]], *lines[1:]])
        return
    from meshsched.wire.jobtable import columns

    sys.stdout.write("\n".join(columns(lines)) + "\n")
