"""Public trace adapters (Alibaba PAI v2020 and v2023, Helios, Pollux/Sia) and the comparable `util` column.

Each sample under tests/data/traces/ is written by hand in its source's exact layout (docs/trace-format.md,
"Public traces"), with rows the adapter must skip; a bad row is appended in a copy to check the one-line error.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from meshsched.cli.main import app
from typer.testing import CliRunner

from meshsched.sim.metrics import summarise
from meshsched.sim.trace_formats import TraceError, parse_trace_text
from meshsched.state import Job, JobSpec, JobState

DATA = Path(__file__).resolve().parents[1] / "data" / "traces"
V2020 = DATA / "alibaba_v2020_pai_task_table.csv"
V2023 = DATA / "alibaba_v2023_openb_pod_list.csv"
HELIOS = DATA / "helios_cluster_log.csv"
POLLUX = DATA / "pollux_workload.csv"
V2020_HEADER = "job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type"


def _parse(path: Path, fmt: str = "auto", text: str | None = None):
    return parse_trace_text(path.name, path.read_text() if text is None else text, "t", fmt).rows


def _jobs(rows) -> dict[str, tuple[float, int, float]]:
    return {r.job_id: (r.submit, r.gpus, r.duration) for r in rows}


# ---------------------------------------------------------------------------------------------- each adapter


def test_alibaba_v2020_task_table_one_job_per_job_name_gpu_tasks_only():
    rows = _parse(V2020, "alibaba-v2020")  # the source ships its tables without a header line
    assert _jobs(rows) == {
        "t-6e8ce4a7b2a3d0d4c1a2b3c4": (1000.0, 1, 3600.0),  # its ps task (no plan_gpu) does not count
        "t-a1b2c3d4e5f60718293a4b5c": (1200.0, 2, 7200.0),  # 2 instances x ceil(50/100) GPUs
        "t-c3d4e5f60718293a4b5c6d7e": (1500.0, 8, 400.0),  # Failed, but it held 8 GPUs for 400 s
        "t-f60718293a4b5c6d7e8f9012": (2500.0, 4, 7200.0),
    }  # skipped: the Running task (no end_time), the CPU-only job
    assert [r.line for r in rows] == [1, 3, 4, 7]
    with_header = V2020_HEADER + "\n" + V2020.read_text()  # the published .header line put on top: auto-detected
    assert _jobs(_parse(V2020, text=with_header)) == _jobs(rows)


def test_alibaba_v2020_job_table_is_refused_with_what_to_give_instead():
    text = "job_name,inst_id,user,status,start_time,end_time\nabc,1,u1,Terminated,1,2\n"
    with pytest.raises(TraceError, match=r"^jt\.csv:1: this is pai_job_table, which has no GPU counts; give"):
        parse_trace_text("jt.csv", text, "t")


def test_alibaba_v2023_pods_skip_cpu_only_and_never_scheduled():
    rows = _parse(V2023)
    assert _jobs(rows) == {
        "t-openb-pod-0101": (9430000.0, 8, 30000.0),
        "t-openb-pod-0102": (9431000.0, 1, 7000.0),  # gpu_milli 220: one GPU (sharing is the scheduler's call)
        "t-openb-pod-0103": (9432000.0, 1, 4495.0),  # run time from scheduled_time, not creation_time
        "t-openb-pod-0106": (9435000.0, 2, 3200.0),  # Failed after 3200 s on 2 GPUs: kept
        "t-openb-pod-0107": (9436000.0, 4, 14390.0),
    }  # skipped: openb-pod-0104 (num_gpu 0), openb-pod-0105 (Pending, never scheduled)
    assert {r.tenant for r in rows} == {"Burstable", "BE", "LS"}


def test_helios_cluster_log_skips_cpu_jobs_and_jobs_that_never_ran():
    rows = _parse(HELIOS)
    first = 1591728061.0  # 2020-06-09 18:41:01 as seconds since 1970 (the file's own clock, no time zone)
    got = _jobs(rows)
    assert set(got) == {"t-1425511", "t-1425512", "t-1425513", "t-1425516", "t-1425517"}
    assert got["t-1425511"] == (first, 1, 36848.0)
    assert got["t-1425516"] == (first + 179, 16, 14400.0)  # submit, not start: its queue time is the scheduler's
    assert got["t-1425517"] == (first + 269, 2, 86400.0)  # TIMEOUT: it ran its full limit
    r = next(r for r in rows if r.job_id == "t-1425512")
    assert (r.user, r.tenant) == ("uVMrF", "vchbv")


def test_pollux_workload_durations_from_each_applications_size_class():
    rows = _parse(POLLUX)
    assert _jobs(rows) == {
        "t-cifar10-0": (107.0, 6, 0.5 * 3600 / 6),
        "t-deepspeech2-1": (110.0, 6, 5 * 3600 / 6),
        "t-ncf-2": (135.0, 1, 0.5 * 3600),
        "t-bert-3": (262.0, 12, 0.5 * 3600 / 12),
        "t-yolov3-4": (356.0, 4, 50 * 3600 / 4),
        "t-imagenet-5": (839.0, 16, 500 * 3600 / 16),
    }
    assert _jobs(_parse(POLLUX, "sia")) == _jobs(rows)  # Sia's workloads are the same layout


@pytest.mark.parametrize(
    ("path", "fmt", "bad", "message"),
    [
        (V2020, "alibaba-v2020", "zz,worker,1.5,Terminated,1,2,600,29,100,V100",
         r"alibaba_v2020_pai_task_table\.csv:8: column 'inst_num': '1\.5' is not a whole number"),
        (V2020, "alibaba-v2020", "zz,worker,1.0,Terminated,5,2,600,29,100,V100",
         r":8: column 'end_time': 2 is before start_time 5"),
        (V2023, "auto", "openb-pod-0200,4000,15258,two,1000,,BE,Running,1,2,1",
         r"alibaba_v2023_openb_pod_list\.csv:9: column 'num_gpu': 'two' is not a number"),
        (V2023, "auto", "openb-pod-0200,4000,15258,1,1000,,BE,Lost,1,2,1",
         r":9: column 'pod_phase': 'Lost' is not one of Succeeded, Running, Failed, Pending"),
        (HELIOS, "auto", "1425518,u1,vc1,1,1,1,COMPLETED,2020-06-09,2020-06-09 18:41:01,2020-06-10 04:55:09,60,0",
         r"helios_cluster_log\.csv:9: column 'submit_time': '2020-06-09' is not YYYY-MM-DD HH:MM:SS"),
        (HELIOS, "auto", "1425518,u1,vc1,1,1,1,COMPLETED,2020-06-09 18:41:01",
         r"helios_cluster_log\.csv:9: expected 12 fields, got 8"),
        (POLLUX, "auto", "gpt-6,900,gpt,4,64",
         r"pollux_workload\.csv:8: column 'application': 'gpt' is not one of cifar10, ncf, bert"),
        (POLLUX, "auto", "cifar10-6,-5,cifar10,4,2048",
         r"pollux_workload\.csv:8: column 'time': must be a finite number >= 0"),
    ],
)  # fmt: skip
def test_a_bad_row_is_one_line_naming_file_line_and_column(tmp_path, path, fmt, bad, message):
    copy = tmp_path / path.name
    copy.write_text(path.read_text() + bad + "\n")
    with pytest.raises(TraceError, match=message) as err:
        parse_trace_text(str(copy), copy.read_text(), "t", fmt)
    assert "\n" not in str(err.value)


def test_a_forced_format_checks_the_header():
    with pytest.raises(TraceError, match=r"^p\.csv:1: bad header for --trace-format helios: column 'job_id' missing"):
        parse_trace_text("p.csv", POLLUX.read_text(), "t", "helios")
    with pytest.raises(TraceError, match=r"unknown trace format 'slurm'; known: auto, meshsched, philly"):
        parse_trace_text("p.csv", POLLUX.read_text(), "t", "slurm")


# ---------------------------------------------------------------------------------------------- mesh simulate


@pytest.mark.parametrize(
    ("path", "fmt", "jobs"),
    [(V2020, "alibaba-v2020", 4), (V2023, "auto", 5), (HELIOS, "auto", 5), (POLLUX, "sia", 6)],
)
def test_mesh_simulate_replays_each_sample_end_to_end(path, fmt, jobs):
    r = CliRunner().invoke(app, ["simulate", "--trace", str(path), "--trace-format", fmt, "--nodes", "2",
                                 "--policy", "fifo,sjf", "--json"])  # fmt: skip
    assert r.exit_code == 0, (r.stdout, r.stderr, r.exception)
    data = json.loads(r.stdout)
    assert data["jobs"] == jobs
    for p in data["policies"]:
        assert p["completed"] == jobs and p["unfinished"] == 0
        # exclusive policies: no job trains faster than alone on its best placement, so useful <= busy
        assert 0 < p["useful_utilisation"] <= p["gpu_utilisation"] + 1e-9


def test_mesh_simulate_bad_trace_format_and_bad_row_are_one_line(tmp_path):
    r = CliRunner().invoke(app, ["simulate", "--trace", str(POLLUX), "--trace-format", "slurm", "--json"])
    assert r.exit_code == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert "unknown trace format 'slurm'" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "helios.csv"
    bad.write_text(HELIOS.read_text() + "1425518,u1,vc1,x,1,1,COMPLETED,2020-06-09 18:41:01,,,,\n")
    r = CliRunner().invoke(app, ["simulate", "--trace", str(bad), "--json"])
    assert r.exit_code == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert f"{bad}:9: column 'gpu_num': 'x' is not a number" in r.stderr


# ---------------------------------------------------------------------------------------------- comparable util


def _done(job_id: str, finish: float, run_time: float) -> Job:
    """A 1-GPU job of 100 iterations at 1 s each alone, submitted at 0, finished at `finish` after `run_time`."""
    job = Job(JobSpec(job_id, 1, "m", 8, 100), ideal_step_time=1.0, state=JobState.COMPLETED, done_iterations=100.0)
    job.acct.first_start, job.acct.finish_time, job.acct.run_time = finish - run_time, finish, run_time
    return job


def _summary(*jobs: Job):
    result = SimpleNamespace(
        engine=SimpleNamespace(state=SimpleNamespace(jobs={j.job_id: j for j in jobs})),
        cluster=SimpleNamespace(total_gpus=1), events=0,
    )
    return summarise(result, "p")


def test_util_counts_work_at_solo_speed_so_sharing_shows_only_what_it_gains():
    """Two 100 s jobs on one GPU. Exclusive: one after the other, makespan 200 s. Shared at half speed each
    (no gain): both end at 200 s. Shared at 0.8 speed each: both end at 125 s (a real gain)."""
    exclusive = _summary(_done("a", 100, 100), _done("b", 200, 100))
    no_gain = _summary(_done("a", 200, 200), _done("b", 200, 200))
    gain = _summary(_done("a", 125, 125), _done("b", 125, 125))
    assert exclusive.gpu_utilisation == exclusive.useful_utilisation == pytest.approx(1.0)
    # the old figure ("busy") doubles for a sharing that gained nothing; util does not move
    assert no_gain.gpu_utilisation == pytest.approx(2.0) and no_gain.gpu_utilisation > exclusive.gpu_utilisation
    assert no_gain.useful_utilisation == pytest.approx(1.0) and exclusive.useful_utilisation == pytest.approx(1.0)
    # a sharing that gains shows as exactly its gain: 200 s of solo work in 125 s on one GPU
    assert gain.useful_utilisation == pytest.approx(200 / 125)
    assert gain.gpu_utilisation == pytest.approx(2.0)
