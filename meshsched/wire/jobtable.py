"""The job table of `mesh ls`: a job's squeue-style columns, and plain aligned columns to lay them out.

meshd renders `mesh ls`'s table with these (daemon/listing.py); the CLI formats `mesh show`, `mesh top` and
`mesh nodes` with the same pieces. Here, where both import it, neither imports the other. Pure, with no imports
beyond `__future__`: the CLI's fast path loads it.
"""

from __future__ import annotations


def fmt_time(seconds: float) -> str:
    """Slurm's TIME column: M:SS, H:MM:SS or D-HH:MM:SS."""
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def where(job: dict) -> str:
    """NODE(REASON): the node while it holds GPUs, else (reason)."""
    if job["state"] in ("LOADING", "RUNNING", "PAUSING"):
        return job["node"]
    return f"({job['reason']})" if job["reason"] else ""


def partners(job: dict) -> str:
    """The jobs sharing its GPUs (its colocation set), or -."""
    return ",".join(job.get("partners") or ()) or "-"


def exec_of(job: dict) -> dict | None:
    """How it trains now (its ExecConfig) while it holds GPUs."""
    return job.get("exec") if job["state"] in ("LOADING", "RUNNING", "PAUSING") else None


def batch(job: dict) -> str:
    """Per-GPU micro-batch x accumulation steps it trains with (its ExecConfig), or -."""
    x = exec_of(job)
    return f"{x['micro_batch']}x{x['accumulation']}" if x else "-"


def mps(job: dict) -> str:
    """Its MPS active-thread percentage (100 = a whole GPU), or -."""
    x = exec_of(job)
    return str(x["mps_percentage"]) if x else "-"


JOBS_HEADER = ("JOBID", "NAME", "USER", "STATE", "TIME", "GPUS", "PARTNER", "BATCH", "MPS%", "NODE(REASON)")


def jobs_row(j: dict) -> tuple[str, ...]:
    """A job's squeue-style columns in `mesh ls` (from its view, or listing's brief of it)."""
    return (j["job_id"], j["name"], j["user"], j["state"], fmt_time(j["elapsed"]), str(j["gpus"]), partners(j),
            batch(j), mps(j), where(j))


def columns(rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns two spaces apart (the last column is not padded); rows[0] is the header."""
    if not rows:
        return []
    widths = [max(map(len, col)) for col in list(zip(*rows))[:-1]]
    fmt = "".join(f"%-{w}s  " for w in widths) + "%s"  # one format per row: thousands of rows in < 1 ms
    return [fmt % tuple(r) for r in rows]
