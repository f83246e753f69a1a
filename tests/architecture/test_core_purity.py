"""The core (`meshsched/` minus job/, wire/ and loaders/) does no file I/O, reads no clock and never imports the parts
that do: a folder rule, with no exemptions inside the core.

Outside it: the training SDK (`meshsched/job/`) runs inside the user's script and saves checkpoints by design; `wire/`
is what crosses a process boundary; `loaders/` reads packaged or given files into the core's types. Everything that
writes files (the profile fits, the IR training, plots, CSVs) lives in `meshsched.cli`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "meshsched"
NOT_CORE = ("job/", "wire/", "loaders/")
FORBIDDEN_IMPORTS = ("meshsched.job", "meshsched.wire", "meshsched.loaders", "meshsched.daemon", "meshsched.cli")
FILE_IO = re.compile(r"\bopen\(|\.(read|write)_(text|bytes)\(|\.mkdir\(|savefig\(|\bsqlite3\b|\bos\.(remove|rename|"
                     r"replace|makedirs|unlink)\(|\bshutil\.")
CLOCK = re.compile(r"\btime\.(time|monotonic|perf_counter|sleep)\(|\bdatetime\.now\(|\basyncio\.sleep\(|\bthreading\b")


def _core_files():
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(CORE).as_posix()
        if not rel.startswith(NOT_CORE):
            yield rel, path.read_text(encoding="utf-8")


def _lines_matching(pattern: re.Pattern) -> list[str]:
    return [f"meshsched/{rel}:{i}: {line.strip()}" for rel, text in _core_files()
            for i, line in enumerate(text.splitlines(), 1)
            if pattern.search(line) and not line.lstrip().startswith("#")]


def _fail_on(offenders: list[str], what: str) -> None:
    if offenders:
        pytest.fail(f"{what}:\n" + "\n".join(offenders), pytrace=False)


def test_no_file_access_in_the_core():
    _fail_on(_lines_matching(FILE_IO), "file I/O in the core (move it to meshsched.loaders or meshsched.cli)")


def test_no_clock_in_the_core():
    _fail_on(_lines_matching(CLOCK), "clock reads in the core (take the time as an argument)")


def _imported(rel: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement may load (a `from` import's names may be modules)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    source = node.module or ""
    if node.level:  # relative: counted from the module's own package
        package = ["meshsched", *rel.split("/")[:-1]]
        source = ".".join([*package[:len(package) - node.level + 1], *([source] if source else [])])
    return [source, *(f"{source}.{alias.name}" for alias in node.names)]


def _outside_the_core(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in FORBIDDEN_IMPORTS)


def test_the_core_never_imports_the_sdk_wire_loaders_daemon_or_cli():
    """At any level: lazy imports inside functions and TYPE_CHECKING imports count too."""
    hits = sorted((rel, node.lineno, ast.unparse(node)) for rel, text in _core_files()
                  for node in ast.walk(ast.parse(text)) if isinstance(node, (ast.Import, ast.ImportFrom))
                  and any(map(_outside_the_core, _imported(rel, node))))
    _fail_on([f"meshsched/{rel}:{line}: {statement}" for rel, line, statement in hits],
             "the core imports what is outside it (pass the data in instead)")
