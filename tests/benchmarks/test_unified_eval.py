"""benchmarks/unified_eval.py at a tiny size: a 60-job slice of the busy window and a public-format sample, two
policies each; the JSON holds every run and the verdict names the lowest mean JCT."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POLLUX = ROOT / "tests" / "data" / "traces" / "pollux_workload.csv"  # test_trace_adapters.py's sample layout


def _load():
    spec = importlib.util.spec_from_file_location("unified_eval", ROOT / "benchmarks" / "unified_eval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(policy: str, jct: float, completed: int = 60, futile: float = 0.0) -> dict:
    return {"setting": "s", "policy": policy, "jct_mean_h": jct, "completed": completed, "futile_gpu_h": futile}


def test_verdict_lowest_margin_ties_failures_and_the_futile_check():
    v = _load().verdict
    r = v([_run("srtf", 10.0, futile=2.0), _run("sjf", 12.0), _run("castor+lazer", 9.5, futile=0.1),
           _run("u", 9.0)], "u")
    assert (r["lowest"], r["tied"], r["best_other"], r["vs_best_other_pct"]) == (True, False, "castor+lazer", -5.26)
    assert r["futile_gpu_h"] == {"castor+lazer": 0.1, "srtf": 2.0, "ratio": 0.05, "at_most_srtf_div_10": True}
    r = v([_run("srtf", 10.0), _run("u", 10.5, completed=59), {"setting": "s", "policy": "sjf", "error": "boom"}], "u")
    assert (r["lowest"], r["best_other"], r["vs_best_other_pct"]) == (False, "srtf", 5.0)
    assert (r["failed"], r["same_completed"], "futile_gpu_h" in r) == (["sjf"], False, False)
    r = v([_run("srtf", 10.0), _run("u", 10.0)], "u")
    assert (r["lowest"], r["tied"]) == (True, True)
    assert "lowest" not in v([_run("srtf", 10.0)], "u")  # the unified stack did not run: no verdict


@pytest.mark.slow
def test_window_slice_and_a_public_trace_every_policy_in_the_json(capsys):
    rc = _load().main(["--settings", "window-x1.5", "--jobs", "60", "--trace", f"{POLLUX}:pollux",
                       "--policies", "srtf,sjf", "--unified", "sjf", "--workers", "2", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["tree"]) == {"commit", "dirty"}  # which code the runs measured
    assert [s["setting"] for s in out["settings"]] == ["window-x1.5", f"file:{POLLUX}:pollux"]
    for s in out["settings"]:
        runs = {r["policy"]: r for r in s["runs"]}
        assert set(runs) == {"srtf", "sjf"} and all("error" not in r for r in runs.values())
        assert runs["srtf"]["jobs"] == (60 if s["setting"] == "window-x1.5" else runs["srtf"]["jobs"]) > 0
        jct = {p: r["jct_mean_h"] for p, r in runs.items()}
        v = s["verdict"]
        assert (v["unified"], v["best_other"], v["unified_jct_mean_h"]) == ("sjf", "srtf", jct["sjf"])
        assert v["lowest"] == (jct["sjf"] <= jct["srtf"] * (1 + 1e-9))
        assert v["vs_best_other_pct"] == round(100 * (jct["sjf"] - jct["srtf"]) / jct["srtf"], 2)
    assert out["settings"][1]["runs"][0]["trace"].startswith("pollux_workload")
