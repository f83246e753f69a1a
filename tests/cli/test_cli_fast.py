"""The lean parser (cli/fast.py) takes exactly what the typer app declares for the common commands."""

from __future__ import annotations

import inspect
import typing

import pytest
import typer.models
from meshsched.cli import jobs
from meshsched.cli.app import app
from meshsched.cli.profiles import app as profiles_app
from meshsched.cli.client import _dechunk
from meshsched.cli.fast import COMMANDS, parse
from meshsched.cli.main import main
from typer.testing import CliRunner


def _declared(name: str) -> tuple[dict[str, tuple[str, object]], list[str], dict[str, object]]:
    """What cli/app.py declares for a command: {flag: (parameter, type or flag value)}, positionals, defaults."""
    info = next(c for c in app.registered_commands if (c.name or c.callback.__name__) == name)
    hints = typing.get_type_hints(info.callback)
    options, positional, defaults = {}, [], {}
    for pname, param in inspect.signature(info.callback).parameters.items():
        meta = param.default
        if isinstance(meta, typer.models.OptionInfo):
            defaults[pname] = meta.default
            for decl in meta.param_decls:
                for i, flag in enumerate(decl.split("/")):
                    options[flag] = (pname, i == 0) if hints[pname] is bool else (pname, _base(hints[pname]))
        else:
            variadic = typing.get_origin(hints[pname]) is list
            positional.append(pname + (("+" if meta.default is ... else "*") if variadic else ""))
    return options, positional, defaults


def _base(hint: object) -> object:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_lean_options_match_the_typer_app(name):
    func, positional, options = COMMANDS[name]
    declared, declared_positional, defaults = _declared(name)
    assert options == declared, name
    assert list(positional) == declared_positional, name
    # the same defaults on both paths: the lean path leaves unset parameters to the function's defaults
    sig = inspect.signature(func)
    for pname, default in defaults.items():
        assert sig.parameters[pname].default == default, (name, pname)


def test_parse_takes_the_usual_command_lines():
    func, kw = parse(["submit", "train.py", "--gpus", "2", "--name=x", "--json", "--", "--steps", "200"])
    assert func is jobs.submit
    assert kw == {"script": "train.py", "gpus": 2, "name": "x", "as_json": True, "args": ["--steps", "200"]}
    assert parse(["submit", "t.py", "a", "-g", "3", "--best-effort"])[1] == {
        "script": "t.py", "args": ["a"], "gpus": 3, "guaranteed": False}
    assert parse(["ls", "-a"])[1] == {"all_jobs": True}
    assert parse(["logs", "7", "-f", "--rank", "1"])[1] == {"job_id": "7", "follow": True, "rank": 1}
    assert parse(["cancel", "1", "2"])[1] == {"job_ids": ["1", "2"]}
    assert parse(["nodes", "--json"])[1] == {"as_json": True}


@pytest.mark.parametrize("argv", [
    ["ls", "--help"], ["submit", "-h"], ["submit"], ["show"], ["show", "1", "2"], ["hold"], ["ls", "--bogus"],
    ["submit", "t.py", "--gpus"], ["submit", "t.py", "--gpus", "two"], ["logs", "1", "-fr", "1"],
    ["ls", "--json=1"], ["top"], ["simulate"], [], ["--help"],
])  # fmt: skip
def test_parse_leaves_the_rest_to_typer(argv):
    assert parse(argv) is None


def test_help_and_usage_errors_come_from_typer(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["ls", "--help"])
    assert exc.value.code == 0 and "--all" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["submit", "t.py", "--gpus", "two"])
    assert exc.value.code == 2 and capsys.readouterr().err.startswith("Usage: mesh submit")
    r = CliRunner().invoke(app, ["cancel", "--help"])
    assert "3 a job had already ended" in " ".join(r.output.split())


def test_dechunk():
    assert _dechunk(b"4\r\nWiki\r\n6;x=1\r\npedia \r\n0\r\n\r\n") == b"Wikipedia "


def test_help_paragraphs_wrap_at_the_terminal_not_at_the_source():
    """A docstring's line breaks are the source's, not paragraphs: --help joins them, so a paragraph wraps only
    where the terminal ends (rich printed each one, leaving lines cut short mid-sentence at any width)."""
    def lines(*argv: str) -> list[str]:
        out = CliRunner().invoke(app, list(argv), env={"COLUMNS": "300"}).output  # (rich reads the width there)
        return [line.strip(" │") for line in out.splitlines()]

    assert any("an executable is executed, a script with a #! line runs through it, a .py file" in line
               for line in lines("--help"))
    assert any(line.startswith("#MESH lines at the top") and line.endswith("the command line wins over them.")
               for line in lines("submit", "--help"))
    for ours in (*app.registered_commands, *profiles_app.registered_commands):
        assert all("\n" not in p for p in ours.help.split("\n\n")), ours.callback.__name__
