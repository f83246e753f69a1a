"""`mesh top`: one line per GPU (gpustat style) and one row per job, as one frame (`--once`, `--json`) or a live
view (rich's Live) that `q` quits.

The frame is plain text laid out for a width: the whole of it into a pipe (or `--width N`), the terminal's in
a terminal. When the job table does not fit, NAME shrinks and the columns that matter least go first (BATCH,
MPS%, STEPS/S, GPU%, PARTNER, STEP, TIME, GPUS); JOBID, NAME and STATE stay. The live view and its requests
ride through a restart of meshd (cli/client.py's Riding).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from meshsched.cli.client import RECONNECT_SECONDS, Client, Riding
from meshsched.cli.jobs import api_call
from meshsched.cli.output import print_json
from meshsched.wire.jobtable import batch, columns, fmt_time, mps, partners

HEADER = ("JOBID", "NAME", "STATE", "GPUS", "PARTNER", "BATCH", "MPS%", "GPU%", "STEP", "STEPS/S", "TIME")
DROP_ORDER = ("BATCH", "MPS%", "STEPS/S", "GPU%", "PARTNER", "STEP", "TIME", "GPUS")  # first to go first
NAME_SOFT, NAME_MIN = 16, 4  # NAME shrinks to NAME_SOFT before a column goes, to NAME_MIN at the very last
GAP = 2  # spaces between columns (jobtable.columns)


def gpu_share(job: dict, gpus: dict[int, dict]) -> str:
    """The mean utilisation of the GPUs a job holds, as the backend measures it; '-' when not known."""
    readings = [gpus[i]["utilization"] for i in job.get("gpu_names") or () if i in gpus]
    if job["state"] not in ("LOADING", "RUNNING", "PAUSING") or not readings or min(readings) < 0:
        return "-"
    return f"{sum(readings) / len(readings):.0f}"


def top_rows(node: dict, jobs: list[dict]) -> list[tuple[str, ...]]:
    """`mesh top`'s job rows: JOBID NAME STATE GPUS PARTNER BATCH MPS% GPU% STEP STEPS/S TIME."""
    gpus = {g["index"]: g for g in node["gpus"]} if node.get("backend") != "fake" else {}
    rows = [HEADER]
    for j in jobs:  # STEP and STEPS/S as the job reported them; '-' for a job that reports none (not an estimate)
        step, done = j.get("step_time"), j.get("done_iterations")
        rate = f"{1 / step:.2f}" if j["state"] == "RUNNING" and step else "-"
        rows.append((j["job_id"], j["name"], j["state"], ",".join(map(str, j["gpu_names"])) or "-",
                     partners(j), batch(j), mps(j), gpu_share(j, gpus),
                     "-" if done is None else f"{int(done)}/{j['iterations']}", rate, fmt_time(j["elapsed"])))
    return rows


def fit_columns(rows: list[tuple[str, ...]], width: int | None) -> list[str]:
    """The table in at most `width` columns (None: no limit): NAME shrinks to NAME_SOFT, then the columns go in
    DROP_ORDER, then NAME shrinks to NAME_MIN; a line still too long is cut. NAME gets back what is left over."""
    natural = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    if width is None or sum(natural) + GAP * (len(natural) - 1) <= width:
        return columns(rows)
    name = rows[0].index("NAME") if "NAME" in rows[0] else None
    keep = list(range(len(rows[0])))

    def need(cap: int) -> int:
        return sum(min(natural[i], cap) if i == name else natural[i] for i in keep) + GAP * (len(keep) - 1)

    cap = min(natural[name], NAME_SOFT) if name is not None else 0
    for col in DROP_ORDER:
        if need(cap) <= width:
            break
        if col in rows[0]:
            keep.remove(rows[0].index(col))
    if name is not None:  # what is left over goes back to NAME; short of room, NAME shrinks to NAME_MIN
        cap = max(min(natural[name], cap + width - need(cap)), min(natural[name], NAME_MIN))
    cut = [tuple(_cut(r[i], cap) if i == name else r[i] for i in keep) for r in rows]
    return [_cut(line, width) for line in columns(cut)]


def _cut(text: str, width: int | None) -> str:
    return text if width is None or len(text) <= width else text[: max(0, width - 1)] + "…"


def frame_lines(nodes: list[dict], jobs: list[dict], width: int | None) -> list[str]:
    """One frame: the node's line, one line per GPU, the job table; each line at most `width` long."""
    node = nodes[0]
    fake = node["backend"] == "fake"
    lines = [(f"{node['name']}  {node['backend']}  policy {node['policy']}  queue {node['queue_length']}  "
              f"free {node['free_gpus']}/{node['total_gpus']}")]
    drain = node.get("drain")  # `mesh drain`: DRAINING while its jobs finish, then DRAINED
    if drain:
        gpus = "" if drain["whole"] else f" GPU(s) {','.join(map(str, drain['gpus']))}"
        lines[0] += f"  {drain['state']}{gpus}: {drain['reason']}"
    for g in node["gpus"]:
        util = "  - %" if fake or g["utilization"] < 0 else f"{g['utilization']:>3d} %"
        lines.append(f"[{g['index']}] {g['name']:<12} {util} | {g['memory_used_mb']:>6} / "
                     f"{g['memory_total_mb']:>6} MB | {', '.join(g['jobs']) or '-'}")
    return [_cut(line, width) for line in lines] + fit_columns(top_rows(node, jobs), width)


class Keys:
    """The keys pressed while the live view runs, read without blocking from `fd` (a terminal in cbreak mode;
    None: no terminal, no keys)."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds`; True as soon as `q` is pressed (quit), False when the time is up."""
        import select

        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if self.fd is None:
                time.sleep(max(0.0, left))
                return False
            if left <= 0:
                return False
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return False
            data = os.read(self.fd, 64)
            if not data:  # end of input: no more keys, the view goes on until Ctrl-C
                self.fd = None
            elif b"q" in data or b"Q" in data:
                return True


@contextlib.contextmanager
def keyboard(stream):
    """Keys from `stream` when it is a terminal (in cbreak mode: a key at a time, no echo; Ctrl-C still
    interrupts; the mode is restored after), else Keys(None)."""
    try:
        fd = stream.fileno() if stream.isatty() else None
    except (AttributeError, OSError, ValueError):  # no real file behind it (an embedding, a test runner)
        fd = None
    if fd is None:
        yield Keys(None)
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd, termios.TCSANOW)  # not TCSAFLUSH: a `q` typed early is kept
        yield Keys(fd)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def top(once: bool = False, interval: float = 1.0, as_json: bool = False, width: int = 0,
        reconnect: float = RECONNECT_SECONDS) -> None:
    """Live view: one line per GPU (gpustat style), one row per job; --json prints one frame as JSON."""
    client = Riding(Client(), reconnect)

    def fetch() -> tuple[list[dict], list[dict]]:
        return api_call("GET", "/v1/nodes", client=client), api_call("GET", "/v1/jobs?all=0", client=client)

    if as_json:
        nodes_, jobs_ = fetch()
        print_json({"nodes": nodes_, "jobs": jobs_})
        return
    if once:  # into a pipe: the whole width; in a terminal: the terminal's
        wide = width or (os.get_terminal_size(sys.stdout.fileno()).columns if _is_terminal(sys.stdout) else None)
        sys.stdout.write("\n".join(frame_lines(*fetch(), wide)) + "\n")
        return
    _live(fetch, interval, width)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _live(fetch, interval: float, width: int) -> None:
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    console = Console()

    def frame() -> Text:
        lines = frame_lines(*fetch(), width or console.size.width)
        text = Text("\n".join(lines), no_wrap=True, overflow="ellipsis")
        text.stylize("bold", 0, len(lines[0]))
        header = next((i for i, line in enumerate(lines) if line.startswith("JOBID")), None)
        if header is not None:
            start = sum(len(line) + 1 for line in lines[:header])
            text.stylize("bold", start, start + len(lines[header]))
        return text

    with keyboard(sys.stdin) as keys, Live(frame(), console=console, refresh_per_second=4) as live:
        try:
            while not keys.wait(interval):
                live.update(frame())
        except KeyboardInterrupt:
            pass
