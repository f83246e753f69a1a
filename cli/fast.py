"""The lean parser for the common commands (submit, ls, show, logs, cancel, hold, release, requeue, nodes): no
typer, no click.

It takes the command lines those commands take in the typer app (cli/app.py: same options, same
defaults; tests/test_cli_fast.py holds the two together) and returns the call to make. Anything else
(--help, an unknown option, a bad value, a missing argument) gives None, and `mesh` hands the whole
command line to the typer app, which prints its help or its usual usage error.
"""

from __future__ import annotations

from meshsched.cli import jobs

_JSON = {"--json": ("as_json", True)}

# command -> (function, positional parameters, options). A positional ending in "*" takes the rest (maybe
# none), "+" the rest (at least one). An option maps to (parameter, type); a bool type is the value a flag sets.
COMMANDS = {
    "submit": (jobs.submit, ("script", "args*"), {
        "--gpus": ("gpus", int), "-g": ("gpus", int), "--batch-size": ("batch_size", int),
        "--iters": ("iters", int), "--model": ("model", str), "--name": ("name", str),
        "--deadline": ("deadline", str), "--guaranteed": ("guaranteed", True),
        "--best-effort": ("guaranteed", False), **_JSON,
        "--array": ("array", str), "-a": ("array", str), "--dependency": ("dependency", str),
        "-d": ("dependency", str), "--time": ("time_limit", str), "-t": ("time_limit", str),
        "--hold": ("hold", True), "--wait": ("wait", True), "-W": ("wait", True), "--output": ("output", str),
        "-o": ("output", str), "--error": ("error", str), "-e": ("error", str), "--begin": ("begin", str),
        "-b": ("begin", str), "--plan": ("plan", str), "--cpus": ("cpus", int), "--mem": ("mem", str),
        "--tenant": ("tenant", str), "--reconnect": ("reconnect", float), "--export": ("export", str),
    }),
    "ls": (jobs.ls, ("job_ids*",), {"--all": ("all_jobs", True), "-a": ("all_jobs", True), **_JSON}),
    "show": (jobs.show, ("job_id",), _JSON),
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
    """(function, keyword arguments) for `argv` = [command, *args], or None to leave it to typer."""
    if not argv or argv[0] not in COMMANDS:
        return None
    func, positional, options = COMMANDS[argv[0]]
    kwargs: dict[str, object] = {}
    values: list[str] = []
    rest = argv[1:]
    i = 0
    while i < len(rest):
        tok = rest[i]
        i += 1
        if tok == "--":
            values.extend(rest[i:])
            break
        if not tok.startswith("-") or tok == "-":
            values.append(tok)
            continue
        name, eq, value = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        if name not in options:
            return None  # --help, -h, unknown or combined short options: typer answers
        dest, kind = options[name]
        if isinstance(kind, bool):
            if eq:
                return None
            kwargs[dest] = kind
            continue
        if not eq:
            if i >= len(rest):
                return None
            value = rest[i]
            i += 1
        try:
            kwargs[dest] = kind(value)
        except ValueError:
            return None
    for param in positional:
        if param.endswith("*") or param.endswith("+"):
            if param.endswith("+") and not values:
                return None
            if values:  # none given: the function's default
                kwargs[param[:-1]] = values
            values = []
        elif values:
            kwargs[param] = values.pop(0)
        else:
            return None
    if values:
        return None
    return func, kwargs
