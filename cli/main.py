"""`mesh`: the command-line entry point; each command group lives in its own module and registers here."""

from __future__ import annotations

import typer

from meshsched.cli import jobs, profiles, simulate

app = typer.Typer(
    name="mesh",
    help="meshsched: schedule deep-learning training on GPU clusters, and replay traces to compare policies.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
simulate.register(app)
jobs.register(app)
app.add_typer(profiles.app, name="profiles")


if __name__ == "__main__":
    app()
