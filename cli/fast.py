"""The lean parser for the common commands (submit, ls, show, logs, cancel, hold, release, requeue, nodes): no
typer, no click.

It takes the command lines those commands take in the typer app (cli/app.py: same options, same
defaults; tests/cli/test_cli_fast.py holds the two together) and returns the call to make. Anything else
(--help, an unknown option, a bad value, a missing argument) gives None, and `mesh` hands the whole
command line to the typer app, which prints its help or its usual usage error.
"""

from __future__ import annotations

from meshsched.cli import directives, jobs, views
from meshsched.cli.submit_options import JSON as _JSON
from meshsched.cli.submit_options import SUBMIT, SUBMIT_POSITIONAL, parse_tokens

# command -> (function, positional parameters, options). A positional ending in "*" takes the rest (maybe
# none), "+" the rest (at least one). An option maps to (parameter, type); a bool type is the value a flag sets.
COMMANDS = {
    "submit": (jobs.submit, SUBMIT_POSITIONAL, SUBMIT),
    "ls": (views.ls, ("job_ids*",), {
        "--all": ("all_jobs", True), "-a": ("all_jobs", True), **_JSON, "--user": ("user", str), "-u": ("user", str),
        "--me": ("me", True), "--state": ("state", str), "-t": ("state", str), "--name": ("name", str),
        "-n": ("name", str), "--format": ("fmt", str), "-o": ("fmt", str), "--array-unfold": ("array_unfold", True),
        "-r": ("array_unfold", True),
    }),
    "show": (views.show, ("job_id",), _JSON),
    "logs": (jobs.logs, ("job_id",), {"--follow": ("follow", True), "-f": ("follow", True),
                                      "--rank": ("rank", int), "-r": ("rank", int),
                                      "--reconnect": ("reconnect", float)}),
    "cancel": (jobs.cancel, ("job_ids*",), {
        "--state": ("state", str), "-t": ("state", str), "--name": ("name", str), "-n": ("name", str),
        "--user": ("user", str), "-u": ("user", str), "--me": ("me", True), "--signal": ("signal", str),
        "-s": ("signal", str),
    }),
    "hold": (jobs.hold, ("job_ids+",), {}),
    "release": (jobs.release, ("job_ids+",), {}),
    "requeue": (jobs.requeue, ("job_ids+",), {}),
    "nodes": (jobs.nodes, (), _JSON),
}  # fmt: skip


def parse(argv: list[str]):
    """(function, keyword arguments) for `argv` = [command, *args], or None to leave it to typer. For `submit`, the
    script's #MESH directives are read here (under the options the command line gave); one the lean reading does not
    take (-g4, a mistake) leaves the whole command line to typer, whose parser takes it or says why in one line."""
    if not argv or argv[0] not in COMMANDS:
        return None
    func, positional, options = COMMANDS[argv[0]]
    kwargs = parse_tokens(argv[1:], positional, options)
    if kwargs is not None and argv[0] == "submit":
        found = directives.lean(str(kwargs["script"]))
        kwargs = None if found is None else {**found, **kwargs}
    return None if kwargs is None else (func, kwargs)
