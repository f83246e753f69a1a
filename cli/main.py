"""`mesh`: the entry point. The common commands run through the lean parser (cli/fast.py) and import only
what they use; everything else, and every --help, goes to the typer app (cli/app.py).

`meshsched.cli.main.app` is the typer app itself (loaded on first access), for tests and embedding.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        from meshsched.cli.fast import parse

        call = parse(args)
        if call is None:
            from meshsched.cli.app import app

            return app(args=args, prog_name="mesh")
        func, kwargs = call
        func(**kwargs)
        sys.stdout.flush()
        return 0
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `mesh ls | head`: the reader left; say nothing
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def __getattr__(name: str):
    if name == "app":
        from meshsched.cli.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    sys.exit(main())
