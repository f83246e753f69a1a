"""The core (`meshsched/` outside the training SDK) does no file I/O and reads no clock, apart from the loaders.

Allowed: the profile loader (`perf/loader.py`) and the trace loaders (`sim/traces.py`) read packaged or given
files. Everything that writes files (the profile fits, the IR training, plots, CSVs) lives in `meshsched.cli`.
The training SDK (`meshsched/job/`) runs inside the user's script and saves checkpoints by design.
"""

from __future__ import annotations

import re
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "meshsched"
ALLOWED = {"perf/loader.py", "sim/traces.py"}
FILE_IO = re.compile(r"\bopen\(|\.(read|write)_(text|bytes)\(|\.mkdir\(|savefig\(|\bsqlite3\b|\bos\.(remove|rename|"
                     r"replace|makedirs|unlink)\(|\bshutil\.")
CLOCK = re.compile(r"\btime\.(time|monotonic|perf_counter|sleep)\(|\bdatetime\.now\(|\basyncio\.sleep\(|\bthreading\b")


def _core_files():
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(CORE).as_posix()
        if not rel.startswith("job/"):
            yield rel, path.read_text(encoding="utf-8")


def test_no_file_access_in_the_core_outside_the_loaders():
    hits = [f"{rel}:{i}: {line.strip()}" for rel, text in _core_files() if rel not in ALLOWED
            for i, line in enumerate(text.splitlines(), 1) if FILE_IO.search(line) and not line.lstrip().startswith("#")]
    assert hits == []


def test_no_clock_in_the_core():
    hits = [f"{rel}:{i}: {line.strip()}" for rel, text in _core_files()
            for i, line in enumerate(text.splitlines(), 1) if CLOCK.search(line) and not line.lstrip().startswith("#")]
    assert hits == []
