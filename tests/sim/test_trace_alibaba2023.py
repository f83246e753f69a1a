"""The published Alibaba GPU trace v2023 (`openb_pod_list_default.csv`) through the `alibaba-v2023` adapter.

The rows below are copied verbatim from alibaba/clusterdata `cluster-trace-gpu-v2023/csv/openb_pod_list_default.csv`
(commit 50a91c7c); the whole file is stored, gzip-compressed, as benchmarks/data/ (README there: provenance).
"""

from __future__ import annotations

import gzip
import hashlib
from collections import Counter
from pathlib import Path

from meshsched.sim.trace_formats import parse_trace_text

STORED = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "alibaba_v2023_openb_pod_list_default.csv.gz"
CSV_SHA256 = "1ee7ed79c27a3b0861cda8ddba86a004c6aba904caafa329a76ae93ca63834a8"

REAL_ROWS = """\
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
openb-pod-0001,6000,12288,1,460,,LS,Running,427061,12902960,427061
openb-pod-0005,20000,65536,0,0,,LS,Running,2759674,12902960,2759676
openb-pod-0012,8000,32768,1,1000,,LS,Running,6588193,10959245,6595531
openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497
openb-pod-0033,3152,5600,1,1000,,BE,Failed,9965463,9965645,9965463
openb-pod-0061,11908,47104,1,1000,,BE,Pending,10001278,10001403,
openb-pod-0422,17400,43008,2,1000,,LS,Running,10195438,10197145,10195438
openb-pod-1523,14000,0,1,1000,,Burstable,Succeeded,10611842,10615828,10611842
"""


def test_published_rows_give_gpu_pods_with_their_run_time_and_skip_cpu_and_pending():
    rows = parse_trace_text("openb_pod_list_default.csv", REAL_ROWS, "a", "auto").rows
    got = {r.job_id: (r.submit, r.gpus, r.duration, r.tenant) for r in rows}
    assert got == {
        # gpu_milli 460 (a share of one GPU): replayed as one whole GPU; its deletion_time is the trace's last
        # time stamp (still running when the trace was cut): replayed with the truncated run time
        "a-openb-pod-0001": (427061.0, 1, 12902960.0 - 427061.0, "LS"),
        # created 7,338 s before it was scheduled: arrival = creation_time, duration from scheduled_time
        "a-openb-pod-0012": (6588193.0, 1, 10959245.0 - 6595531.0, "LS"),
        "a-openb-pod-0017": (9437497.0, 8, 10769854.0 - 9437497.0, "Burstable"),
        "a-openb-pod-0033": (9965463.0, 1, 182.0, "BE"),  # Failed after it ran: kept
        "a-openb-pod-0422": (10195438.0, 2, 1707.0, "LS"),  # last phase Running but deleted: a real end
        "a-openb-pod-1523": (10611842.0, 1, 3986.0, "Burstable"),  # memory_mib 0 is read, not refused
    }  # skipped: openb-pod-0005 (num_gpu 0), openb-pod-0061 (Pending, never scheduled)


def test_the_stored_trace_is_the_published_file_and_gives_6203_gpu_jobs():
    text = gzip.decompress(STORED.read_bytes())
    assert hashlib.sha256(text).hexdigest() == CSV_SHA256
    assert len(text) == 575_468 and text.count(b"\n") == 8_153  # header + 8,152 pods
    rows = parse_trace_text(STORED.name, text.decode(), "a", "alibaba-v2023").rows
    assert len(rows) == 6_203  # 7,064 GPU pods less 861 Pending
    assert Counter(r.gpus for r in rows) == {1: 6_129, 2: 15, 4: 15, 8: 44}
    assert round(sum(r.gpus * r.duration for r in rows) / 3600) == 59_612  # GPU-hours of trace run time


def test_unified_eval_replays_a_window_of_the_stored_trace_at_a_load(capsys):
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("unified_eval", STORED.parents[1] / "unified_eval.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rc = module.main(["--settings", "", "--trace", f"{STORED}:alibaba-v2023", "--file-nodes", "2",
                      "--file-window", "3358.9:3573", "--file-load", "1.5", "--jobs", "40", "--policies", "srtf",
                      "--workers", "1", "--json"])
    assert rc == 0
    s = json.loads(capsys.readouterr().out)["settings"][0]
    assert s["args"][s["args"].index("--window") + 1] == "3358.9:3573"
    assert s["args"][s["args"].index("--load") + 1] == "1.5"
    run = s["runs"][0]
    assert "error" not in run and run["jobs"] == 40 and run["completed"] == 40
