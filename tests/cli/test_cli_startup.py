"""What a `mesh` process pays before and beside its one request (issue 22, point 8: 300 submits from 16 shells).

Every `mesh submit` is a new interpreter: its start-up, not meshd, is most of a bulk submission's cost. So the
common commands load no module they could do without (no `json`: its `re` and enum cost ~5 ms; cli/jsonc.py uses
json's C accelerator directly), and the checkout installs editable as one plain .pth line (compat mode), not
through setuptools' path finder that every interpreter start would import (pathlib, re, urllib: ~15 ms).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MESH = Path(sys.executable).parent / "mesh"
# beyond what the interpreter's own start loads: none of these on a plain `mesh submit`, `mesh show`, ...
HEAVY = ("typer", "click", "rich", "json", "re", "enum", "collections", "pathlib", "urllib", "email", "http",
         "asyncio", "numpy", "msgpack", "typing", "dataclasses", "meshsched.daemon")
PROBE = "import sys, atexit; atexit.register(lambda: sys.stderr.write(' '.join(sorted(sys.modules)) + '\\n'))\n"
BARE = "import sys; print(' '.join(sorted(sys.modules)))"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED")}


@pytest.mark.parametrize("args", [["submit", "{script}"], ["submit", "--json", "{script}"], ["show", "{job}"],
                                  ["cancel", "{job}"]])
def test_a_plain_submit_loads_no_json_re_typer_or_rich(served, tmp_path, args):
    """Fails before: `mesh submit` imported json (and with it re, enum: ~5 ms of its ~8 ms over `python -c pass`);
    `--json` output and answers go through json's C scanner and encoder (cli/jsonc.py)."""
    if not MESH.exists():
        pytest.skip(f"no `mesh` script beside {sys.executable} (not an installed environment)")
    script = tmp_path / "t.sh"
    script.write_text("#!/bin/sh\ntrue\n")
    script.chmod(0o755)
    env = _env()
    first = subprocess.run([str(MESH), "submit", "--hold", str(script)], env=env, capture_output=True, text=True,
                           timeout=60)
    assert first.returncode == 0, first.stderr
    job = first.stdout.split()[-1]
    argv = [a.format(script=script, job=job) for a in args]
    # the `mesh` script itself, run by its interpreter after a probe that lists sys.modules at exit
    code = PROBE + MESH.read_text()
    p = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    loaded = set(p.stderr.strip().splitlines()[-1].split())
    bare = set(subprocess.run([sys.executable, "-c", BARE], env=env, capture_output=True, text=True,
                              timeout=60).stdout.split())
    extra = sorted(m for m in loaded - bare if any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert extra == [], extra
    if "--json" in argv:
        assert json.loads(p.stdout)["job_id"]


VALUES = [{"a": [1, 2.5, None, True, False, "é中\n\"\\x\u2028"], "b": {"c": -0.0, "d": 1e300, "e": 10**30}}, [], {},
          "s", 3, 1.1, None, [float("inf"), float("-inf")], {"nested": [[[{"x": []}]]]}]


@pytest.mark.parametrize("value", VALUES)
def test_jsonc_is_json(value):
    from meshsched.cli import jsonc

    for separators in ((", ", ": "), (",", ":")):
        assert jsonc.dumps(value, separators=separators) == json.dumps(value, separators=separators)
    text = json.dumps(value)
    assert repr(jsonc.loads(text)) == repr(json.loads(text))
    assert repr(jsonc.loads(f" \n{text}\t ".encode())) == repr(json.loads(text))


def test_jsonc_errors_are_jsons():
    from meshsched.cli import jsonc

    assert math.isnan(jsonc.loads("NaN"))
    assert jsonc.dumps({1: object()}, default=lambda o: "o") == '{"1": "o"}'
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsonc.dumps({"x": object()})
    for bad in ("", "  ", "{", "[1,]", "1 2", '{"a" 1}', "[1] x"):
        with pytest.raises(json.JSONDecodeError) as got:
            jsonc.loads(bad)
        with pytest.raises(json.JSONDecodeError) as want:
            json.loads(bad)
        assert str(got.value) == str(want.value), bad


def test_the_install_commands_use_the_plain_pth():
    """.ci/run and scripts/demo install the checkout editable in compat mode (see the next test for why)."""
    for path in (".ci/run", "scripts/demo"):
        lines = [line for line in (ROOT / path).read_text().splitlines()
                 if "install" in line and " -e " in line and not line.lstrip().startswith("#")]
        assert lines and all("editable_mode=compat" in line for line in lines), (path, lines)


@pytest.mark.slow
def test_a_compat_editable_install_finds_cli_daemon_and_profiles_without_a_path_finder(tmp_path):
    """Fails before: installed editable in compat mode (one .pth line naming the checkout), `meshsched.cli` was not
    found (cli/ sits beside meshsched/, not in it). Now meshsched/__init__.py searches the checkout's top level too,
    and an interpreter start imports no path finder (nor the pathlib, re, urllib it brings)."""
    import importlib.util
    import venv

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # setuptools (the build backend, without isolation) from this environment: a path line, no .pth run from there
    Path(site, "zz_deps.pth").write_text(str(Path(importlib.util.find_spec("setuptools").origin).parents[1]) + "\n")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "--python", str(python)]
    installed = subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", "-e", str(ROOT),
                                "--config-settings", "editable_mode=compat"], env=_env(), capture_output=True,
                               text=True, timeout=300)
    if installed.returncode != 0 and "No module named pip" in installed.stderr + installed.stdout:
        pytest.skip("pip is not importable from this interpreter")
    assert installed.returncode == 0, installed.stderr
    code = ("import sys\n"
            "import meshsched.cli.main, meshsched.cli.fast, meshsched.wire.jobtable\n"
            "loaded = ' '.join(sorted(sys.modules))\n"
            "from importlib.resources import files  # (imports pathlib)\n"
            "n = len([e for e in files('meshsched.profiles').iterdir() if e.name.endswith('.json')])\n"
            "import meshsched.daemon, meshsched.cli\n"
            "print(meshsched.cli.main.__file__, meshsched.daemon.__file__, n)\n"
            "print(loaded)")
    p = subprocess.run([str(python), "-c", code], env=_env(), capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)  # not the checkout: found through the install's .pth alone
    assert p.returncode == 0, p.stderr
    where, modules = p.stdout.splitlines()
    main_file, daemon_file, profiles = where.split()
    assert main_file == str(ROOT / "cli" / "main.py") and daemon_file == str(ROOT / "daemon" / "__init__.py")
    assert int(profiles) > 0
    assert not [m for m in modules.split() if "editable" in m or m in ("pathlib", "re", "urllib.parse")]
