"""Operator commands: `mesh drain NODE[:GPU,...] --reason TEXT` and `mesh resume NODE[:GPU,...]` (Slurm's
`scontrol update state=drain` / `resume`): jobs running there finish, nothing new starts there. Only root or
meshd's own user may (meshd refuses anyone else with one line)."""

from __future__ import annotations

import typer

from meshsched.cli.client import SERVICE_HELP, SOCKET_HELP, ApiError, Client, DaemonUnavailable
from meshsched.cli.output import fail, print_json


def parse_target(text: str) -> tuple[str, list[int]]:
    """NODE or NODE:GPU[,GPU...] -> (node, local GPU indices; [] for the whole node)."""
    node, sep, rest = text.partition(":")
    if not node or (sep and not rest):
        fail(f"{text!r}: name a node, or NODE:GPU[,GPU...] (e.g. n1:0,3)")
    try:
        gpus = sorted({int(g) for g in rest.split(",")}) if rest else []
    except ValueError:
        fail(f"{text!r}: GPUs are local indices, e.g. n1:0,3")
    if any(g < 0 for g in gpus):
        fail(f"{text!r}: GPU indices are >= 0")
    return node, gpus


def change(action: str, target: str, reason: str, as_json: bool) -> None:
    node, gpus = parse_target(target)
    client = Client()
    try:
        out = client.call("POST", f"/v1/{action}", {"node": node, "gpus": gpus, "reason": reason})
    except DaemonUnavailable as exc:
        fail(f"meshd is not running (no daemon at {client.path}: {exc}); {SERVICE_HELP}; or {SOCKET_HELP}", code=1)
    except ApiError as exc:
        fail(str(exc), code=1)
    if as_json:
        print_json(out)
        return
    what = node + (f" GPU(s) {','.join(map(str, gpus))}" if gpus else "")
    status = out.get("status") if isinstance(out, dict) else None
    if not out.get("applied", True):
        print(f"{what}: {action} proposed to the mesh's leader")
    elif action == "resume":
        print(f"{what}: resumed" + (f" (still drained: GPU(s) {','.join(map(str, status['gpus']))})" if status else ""))
    else:
        print(f"{what}: {status['state'] if status else 'DRAINED'} ({reason})")


def register(app: typer.Typer) -> None:
    @app.command()
    def drain(
        target: str = typer.Argument(..., metavar="NODE[:GPU,...]", help="a node, or some of its GPUs (n1:0,3)"),
        reason: str = typer.Option(..., "--reason", help="why (shown in `mesh nodes` with who and when)"),
        as_json: bool = typer.Option(False, "--json", help="print meshd's answer as JSON"),
    ) -> None:
        """Take a node (or GPUs of it) out of service: running jobs finish, nothing new starts there. `mesh nodes`
        shows DRAINING while jobs still run there, then DRAINED. Operators only (root or meshd's user)."""
        change("drain", target, reason, as_json)

    @app.command()
    def resume(
        target: str = typer.Argument(..., metavar="NODE[:GPU,...]", help="a node, or some of its GPUs (n1:0,3)"),
        as_json: bool = typer.Option(False, "--json", help="print meshd's answer as JSON"),
    ) -> None:
        """Give drained GPUs back to the scheduler (a scheduling pass follows). Operators only."""
        change("resume", target, "", as_json)
