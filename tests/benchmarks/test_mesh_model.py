"""benchmarks/mesh_model.py at a tiny size: a real leader (MeshLink) over a real etcd and a few fake servers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from meshsched.daemon.etcd_local import ETCD, NO_ETCD

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("mesh_model", ROOT / "benchmarks" / "mesh_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.skipif(ETCD is None, reason=NO_ETCD)
def test_model_at_a_tiny_size_measures_every_figure(tmp_path, capsys):
    out = tmp_path / "run.json"
    rc = _load().main(["--servers", "4", "--gpus-per-server", "8", "--jobs", "6", "--rate", "20", "--job-min",
                       "0.5", "--job-max", "1", "--snapshot-entries", "8", "--ttl", "6", "--loop-wait", "1",
                       "--retry-timeout", "1", "--drain", "60", "--json", "--out", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == r
    assert r["all_finished"] and r["jobs_finished"] == 6
    assert r["log_entries_by_kind"] == {"submit": 6, "start": 6, "finish": 6}
    assert r["decision_ms"]["n"] == 18 and r["decision_ms"]["p50"] <= r["decision_ms"]["p99"]
    assert r["etcd_write_calls"]["put:proposals"] == 18 and 1 <= r["append_txns"] <= 18  # a txn: append + delete
    assert r["etcd_raft_proposals"] > 0 and r["log_bytes_per_job"] > 0
    assert r["snapshots_written"] >= 1 and r["final_snapshot"]["bytes"] > 0
    c = r["catch_up"]
    assert c["caught_up"] and c["same_state"] and c["from_snapshot"] > 0
    assert r["etcd_db_bytes"] > 0


def test_bad_arguments_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        _load().main(["--jobs", "0"])
    assert exc.value.code == 2
    assert "--jobs must be >= 1" in capsys.readouterr().err
