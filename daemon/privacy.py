"""What of a job other users see (many users, `submit_users`): the queue is public, what a job runs, where, and what
it printed are not.

A view of another user's job leaves out PRIVATE (its command and arguments, working directory, job directory,
output files, rank reports, its environment and what `--export` named) and shows its reason's public part only. A failure reason is written as a public
phrase, then ": " and its private detail: `rank 0 failed (exit code 1): <the rank's last log lines>` (the
supervisor), `could not start on n1: <the OS error>`, `cannot open <path>: <why>`, `the job's supervisor exited
without a result (<its log's last line>)`; a few phrases only wrap another reason (`ranks on n2 failed: ...`,
`exceeded its memory limit ...: ...`), and their reason's public part follows them. Absolute paths left in a
public part become <path>. Reasons the engine writes (pending reasons, `refused: ...` at admission) speak of
resources only and are shown whole.

The owner sees their job's reason whole except where it names meshd's own files (its state and runtime
directories, outside the job's own directory), which only operators see.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

PRIVATE = ("command", "cwd", "job_dir", "output", "error", "rank_reports", "env", "export")  # not for other users
ENGINE_REASONS = ("refused: ",)  # the engine's own words about resources: public whole
QUEUED = ("PENDING", "PREEMPTED")  # their reason is the engine's pending reason: public whole
_WRAPS = re.compile(r"ranks on \S+ failed|exceeded its memory limit of \S+ GiB \(the kernel OOM-killed it\)")
_PATH = re.compile(r"(?<![\w.~])/[^\s:'\"()]+")
SERVER_PATH = "<meshd's state>"


def public_reason(reason: str) -> str:
    """`reason` as users other than the job's owner see it: without log lines, paths or arguments."""
    if not reason or reason.startswith(ENGINE_REASONS):
        return reason
    head, sep, rest = reason.partition(": ")
    if sep and _WRAPS.fullmatch(head):
        return f"{head}: {public_reason(rest)}"
    return _PATH.sub("<path>", _closed(head)).strip()


def _closed(text: str) -> str:
    """`text` up to a parenthesis it opens and does not close (the detail was cut inside it)."""
    depth, cut = 0, []
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
            cut.append(i)
        elif ch == ")" and depth:
            depth -= 1
            cut.pop()
    return text[:cut[0]].rstrip() if cut else text


def owner_reason(reason: str, server_dirs: Iterable[Path], job_dir: str) -> str:
    """`reason` as its job's owner (not an operator) sees it: meshd's own files (under `server_dirs`, outside
    `job_dir`) are named <meshd's state>."""
    own = job_dir.rstrip("/")

    def named(m: re.Match) -> str:
        return m[0] if own and (m[0] == own or m[0].startswith(own + "/")) else SERVER_PATH

    for base in server_dirs:
        root = str(base).rstrip("/")
        if root and root in reason:
            reason = re.sub(re.escape(root) + r"(?:/[^\s:'\"()]*)?", named, reason)
    return reason


def visible(view: dict, slot: str, server_dirs: Iterable[Path], job_dir: str) -> dict:
    """A job's `view` (its job directory `job_dir`) as a viewer in `slot` sees it: "all" (an operator), "own"
    (its owner), "public" (anyone else)."""
    if slot == "all":
        return view
    ours = view.get("reason") and view.get("state") not in QUEUED  # else the engine's words, or none
    if slot == "own":
        return dict(view, reason=owner_reason(view["reason"], server_dirs, job_dir)) if ours else view
    out = {k: v for k, v in view.items() if k not in PRIVATE}
    if ours:
        out["reason"] = public_reason(out["reason"])
    return out


def slot(operator: bool, uid: int | None, owner: int | None) -> str:
    """Which of `visible`'s views a viewer gets of a job of `owner`'s."""
    return "all" if operator else "own" if owner == uid else "public"
