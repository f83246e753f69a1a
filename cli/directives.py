"""`#MESH` directives: submit options written at the top of a script, as sbatch reads `#SBATCH` lines.

    #!/bin/bash
    #MESH --gpus 4
    #MESH --time 2:00:00 --name resnet

They are the lines that start with `#MESH` after the `#!` line and before the first line that is neither a
comment nor blank. Each is split as a shell would (quotes kept together) and read with the same option table as
`mesh submit`'s command line (cli/submit_options.py, a leaf both parsers read): the lean parser (cli/fast.py) takes
the directives with the command line (`lean`); a directive it does not take sends the whole command line to the
typer app, whose `submit` reads them with its own click parser (`merge`: -g4, or the one-line error on a mistake).
An option given on the command line wins over a directive.

Stdlib only at import: a script without directives costs `mesh submit` the read of its first lines.
"""

from __future__ import annotations

import os

from meshsched.cli.submit_options import SUBMIT, SUBMIT_POSITIONAL, parse_tokens

PREFIX = "#MESH"
HEAD_BYTES = 64 * 1024  # directives are looked for in the script's first 64 KiB


def read(script: str) -> list[tuple[int, str]]:
    """(line number, the text after #MESH) of each directive at the top of `script` ([] when unreadable)."""
    try:
        with open(script, "rb") as fh:
            head = fh.read(HEAD_BYTES)
    except OSError:
        return []
    out = []
    for number, raw in enumerate(head.split(b"\n"), 1):
        line = raw.decode(errors="replace").strip()
        if number == 1 and line.startswith("#!"):
            continue
        if line and not line.startswith("#"):
            break  # the first command: directives end here
        if line == PREFIX or line.startswith((PREFIX + " ", PREFIX + "\t")):
            out.append((number, line[len(PREFIX):].strip()))
    return out


def lean(script: str) -> dict[str, object] | None:
    """The submit options the script's directives set, as the lean parser reads them; None when one of them is not
    for it (the typer app's parser then reads them all: `merge`)."""
    found = read(script) if os.path.isfile(script) else []
    if not found:
        return {}
    import shlex

    out: dict[str, object] = {}
    for _number, text in found:
        try:
            tokens = shlex.split(text)
        except ValueError:
            return None
        kwargs = parse_tokens(["SCRIPT", *tokens], SUBMIT_POSITIONAL, SUBMIT) if tokens else None
        if kwargs is None or "args" in kwargs:
            return None
        kwargs.pop("script", None)
        out.update(kwargs)
    return out


def options(script: str, command) -> dict[str, object]:
    """The submit options the script's directives set ({parameter: value}, as `jobs.submit` takes them), read by
    `command` (the typer app's click `submit`); a malformed or unknown directive is a one-line error naming its
    line (exit 2)."""
    found = read(script)
    if not found:
        return {}
    import shlex

    from meshsched.cli.output import fail

    out: dict[str, object] = {}
    for number, text in found:
        where = f"{script} line {number}: {PREFIX} {text}"
        try:
            tokens = shlex.split(text)
        except ValueError as exc:
            fail(f"{where}: {exc}")
        if not tokens:
            fail(f"{where}: no option (as in {PREFIX} --gpus 4)")
        out.update(_click_parse(command, tokens, where))
    return out


def _click_parse(command, tokens: list[str], where: str) -> dict[str, object]:
    """The options the typer app's `submit` (`command`, a click command) reads in a directive, or its one-line
    error (exit 2)."""
    from meshsched.cli.output import fail

    if "--help" in tokens:
        fail(f"{where}: --help is no directive")
    import typer

    usage_error = typer.BadParameter.__mro__[1]  # click's UsageError (typer carries its own click)
    try:
        ctx = command.make_context("submit", ["SCRIPT", *tokens], resilient_parsing=False)
    except usage_error as exc:
        fail(f"{where}: {' '.join(exc.format_message().split())}")
    if ctx.params.get("args"):
        fail(f"{where}: {ctx.params['args'][0]!r} is no option; a directive holds submit options only")
    return {name: ctx.params[name] for name in given(ctx) if name not in ("script", "args")}


def given(ctx) -> set[str]:
    """The parameters of a click context (the typer app's `submit`) that its command line set, not a default."""
    return {name for name in ctx.params
            if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") not in ("DEFAULT", "DEFAULT_MAP")}


def merge(script: str, given_options: dict[str, object], command) -> dict[str, object]:
    """The script's directives (read by `command`, the typer app's click `submit`) under the options the command
    line gave (the command line wins)."""
    if not os.path.isfile(script):
        return given_options
    return {**options(script, command), **given_options}
