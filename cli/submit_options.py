"""`mesh submit`'s options as the lean parser reads them, and the lean parser's reading of a command line.

A leaf: it imports nothing of ours, so both the lean parser (cli/fast.py) and the `#MESH` directives
(cli/directives.py) read the same table without an import cycle (cli/jobs.py, which they both call, imports
neither). tests/cli/test_cli_fast.py holds the table equal to the typer app's `submit` (cli/app.py).
"""

from __future__ import annotations

JSON = {"--json": ("as_json", True)}

# option -> (parameter, type); a bool type is the value a flag sets
SUBMIT: dict[str, tuple[str, object]] = {
    "--gpus": ("gpus", int), "-g": ("gpus", int), "--batch-size": ("batch_size", int),
    "--iters": ("iters", int), "--model": ("model", str), "--name": ("name", str),
    "--deadline": ("deadline", str), "--guaranteed": ("guaranteed", True),
    "--best-effort": ("guaranteed", False), **JSON,
    "--array": ("array", str), "-a": ("array", str), "--dependency": ("dependency", str),
    "-d": ("dependency", str), "--time": ("time_limit", str), "-t": ("time_limit", str),
    "--hold": ("hold", True), "--wait": ("wait", True), "-W": ("wait", True), "--output": ("output", str),
    "-o": ("output", str), "--error": ("error", str), "-e": ("error", str), "--begin": ("begin", str),
    "-b": ("begin", str), "--plan": ("plan", str), "--cpus": ("cpus", int), "--mem": ("mem", str),
    "--tenant": ("tenant", str), "--reconnect": ("reconnect", float), "--export": ("export", str),
    "--signal": ("signal", str),
}  # fmt: skip

SUBMIT_POSITIONAL = ("script", "args*")


def parse_tokens(rest: list[str], positional: tuple[str, ...], options: dict) -> dict[str, object] | None:
    """The keyword arguments `rest` (a command's arguments) gives, or None for anything this lean reading does not
    take (--help, an unknown or combined short option, a bad value, a missing argument). A positional ending in
    "*" takes the rest (maybe none), "+" the rest (at least one)."""
    kwargs: dict[str, object] = {}
    values: list[str] = []
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
            return None
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
    return _positionals(kwargs, values, positional)


def _positionals(kwargs: dict[str, object], values: list[str], positional: tuple[str, ...]) -> dict | None:
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
    return None if values else kwargs
