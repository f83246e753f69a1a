"""Which part of the project may import which: meshd (daemon/) never imports the CLI (cli/), its client; what both
need (the `mesh ls` table) lives in the core. Read from the source, so an import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_meshd_never_imports_the_cli():
    hits = sorted(f"{p.relative_to(ROOT)}: {m}" for p in (ROOT / "daemon").glob("*.py") for m in _imports(p)
                  if m == "meshsched.cli" or m.startswith("meshsched.cli."))
    assert hits == []
