"""Trace loaders: the built-in Philly traces against the real perf model, our CSV format, options, errors."""

from __future__ import annotations

import gzip
import math
from collections import Counter
from pathlib import Path

import pytest

from meshsched.loaders.profiles import load_perf_model
from meshsched.loaders.traces import (
    BUILTIN_TRACES,
    Trace,
    TraceError,
    TraceOptions,
    load_trace,
)
from meshsched.perf import DEFAULT_GPU_TYPE, PerfModel, UnknownProfile, ideal_placement

PHILLY_GPUS = {1: 76627, 2: 1818, 4: 1870, 8: 1643, 16: 199, 32: 67, 12: 7, 24: 7, 64: 6, 128: 3}  # SOURCES.md
RFOLD_GPUS = {
    1: 96662, 8: 5716, 4: 5487, 2: 2522, 16: 852, 32: 212, 24: 40, 64: 28, 12: 12, 128: 11, 48: 2, 7: 2,
    28: 1, 6: 1, 20: 1,
}  # profiles/traces/README.md


class TinyPerf:
    """Hand-checkable perf model: t = 0.01 * per-GPU batch * (1 + 0.5 * (nodes - 1)); 'solo' is one-GPU only."""

    def models(self, gpu_type: str, gpus: int = 1) -> tuple[str, ...]:
        if gpu_type != "tiny":
            raise UnknownProfile(f"unknown GPU type {gpu_type!r}", ["tiny"])
        return ("a", "b", "solo") if gpus <= 1 else ("a", "b")

    def profiled_batches(self, model: str, gpu_type: str) -> tuple[int, ...]:
        if model not in ("a", "b", "solo"):
            raise UnknownProfile(f"no profile for model {model!r} on {gpu_type}", ["a", "b", "solo"])
        return {"a": (10, 20), "b": (5,), "solo": (1,)}[model]

    def iteration_time(self, model, gpu_type, placement, per_gpu_batch, accumulation=1) -> float:
        self.profiled_batches(model, gpu_type)
        if sum(placement) > 1 and model == "solo":
            raise UnknownProfile("'solo' was measured on one GPU only", ["a", "b"])
        return 0.01 * per_gpu_batch * (1.0 + 0.5 * (len(placement) - 1))


TINY = TraceOptions(gpu_type="tiny", gpus_per_node=4)


@pytest.fixture(scope="module")
def perf() -> PerfModel:
    return load_perf_model()


@pytest.fixture(scope="module")
def opts() -> TraceOptions:
    return TraceOptions(gpu_type=DEFAULT_GPU_TYPE, gpus_per_node=8)


@pytest.fixture(scope="module")
def philly(perf: PerfModel, opts: TraceOptions) -> Trace:
    return load_trace("philly", perf, opts)


@pytest.fixture(scope="module")
def rfold(perf: PerfModel, opts: TraceOptions) -> Trace:
    return load_trace("philly-rfold", perf, opts)


def write(tmp_path: Path, text: str, name: str = "t.csv") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def step_time(perf, spec, gpu_type: str, gpus_per_node: int) -> float:
    placement = ideal_placement(spec.gpus, gpus_per_node)
    return perf.iteration_time(spec.model, gpu_type, placement, spec.batch_size // spec.gpus)


# -- built-in traces, real perf model -----------------------------------------------------------------------
def check_trace(trace: Trace, perf: PerfModel, opts: TraceOptions, histogram: dict[int, int]) -> None:
    jobs = trace.jobs
    assert Counter(j.gpus for j in jobs) == histogram
    assert len(trace.durations) == len(jobs) == sum(histogram.values())
    assert jobs[0].submit_time == 0.0
    assert all(a.submit_time <= b.submit_time for a, b in zip(jobs, jobs[1:]))
    assert len({j.job_id for j in jobs}) == len(jobs)
    for job, duration in zip(jobs, trace.durations):
        assert job.model in perf.models(opts.gpu_type, job.gpus)
        assert job.batch_size % job.gpus == 0
        assert job.batch_size // job.gpus in perf.profiled_batches(job.model, opts.gpu_type)
        step = step_time(perf, job, opts.gpu_type, opts.gpus_per_node)
        assert abs(job.iterations * step - duration) <= step  # a job alone on its ideal placement
        assert job.deadline is not None
        if duration > 0:
            assert 1.5 * duration - 1e-6 <= job.deadline - job.submit_time <= 2.5 * duration + 1e-6
        else:
            assert job.iterations == 1 and job.deadline > job.submit_time


def test_builtin_names() -> None:
    assert BUILTIN_TRACES == ("philly", "philly-rfold")


def test_philly(philly: Trace, perf: PerfModel, opts: TraceOptions) -> None:
    assert philly.name == "philly"
    check_trace(philly, perf, opts, PHILLY_GPUS)
    assert len({j.tenant for j in philly.jobs}) == 15  # the `cluster` column
    assert philly.jobs[0].job_id == "philly-0" and philly.durations[0] == 2240194.0
    assert max(philly.jobs, key=lambda j: j.submit_time).submit_time == pytest.approx(9408690.0)


def test_philly_rfold_keeps_zero_durations(rfold: Trace, perf: PerfModel, opts: TraceOptions) -> None:
    check_trace(rfold, perf, opts, RFOLD_GPUS)
    zero = [j for j, d in zip(rfold.jobs, rfold.durations) if d == 0]
    assert len(zero) == 10 and all(j.iterations == 1 for j in zero)
    assert rfold.jobs[1].job_id == "philly-rfold-1" and rfold.jobs[1].submit_time == 266563.0


def test_models_and_batches_cover_the_choices(philly: Trace, perf: PerfModel, opts: TraceOptions) -> None:
    single = {j.model for j in philly.jobs if j.gpus == 1}
    assert single == set(perf.models(opts.gpu_type, 1))  # 76k uniform draws hit every family


def test_first_n_is_a_prefix(philly: Trace, perf: PerfModel, opts: TraceOptions) -> None:
    head = load_trace("philly", perf, TraceOptions(opts.gpu_type, opts.gpus_per_node, first_n=500))
    assert head.jobs == philly.jobs[:500] and head.durations == philly.durations[:500]


def test_window(philly: Trace, perf: PerfModel, opts: TraceOptions) -> None:
    start, end = 30 * 86400.0, 31 * 86400.0
    win = load_trace("philly", perf, TraceOptions(opts.gpu_type, opts.gpus_per_node, window=(start, end)))
    inside = [j for j in philly.jobs if start <= j.submit_time < end]
    assert len(win.jobs) == len(inside) > 100
    assert [j.job_id for j in win.jobs] == [j.job_id for j in inside]
    offset = inside[0].submit_time
    assert win.jobs[0].submit_time == 0.0
    assert [j.submit_time for j in win.jobs] == [j.submit_time - offset for j in inside]
    both = load_trace("philly", perf, TraceOptions(opts.gpu_type, opts.gpus_per_node, window=(start, end), first_n=7))
    assert both.jobs == win.jobs[:7]


def test_load_factor(philly: Trace, perf: PerfModel, opts: TraceOptions) -> None:
    dense = load_trace("philly", perf, TraceOptions(opts.gpu_type, opts.gpus_per_node, load=2.0, first_n=1000))
    base = philly.jobs[:1000]
    assert [j.submit_time for j in dense.jobs] == [j.submit_time / 2.0 for j in base]
    assert [(j.model, j.batch_size, j.iterations) for j in dense.jobs] == [
        (j.model, j.batch_size, j.iterations) for j in base
    ]
    assert dense.durations == philly.durations[:1000]
    for job, duration in zip(dense.jobs, dense.durations):
        assert 1.5 * duration - 1e-6 <= job.deadline - job.submit_time <= 2.5 * duration + 1e-6


def test_seeds(perf: PerfModel, opts: TraceOptions) -> None:
    def load(seed: int) -> Trace:
        return load_trace("philly", perf, TraceOptions(opts.gpu_type, opts.gpus_per_node, seed=seed, first_n=300))

    a, again, b = load(3), load(3), load(4)
    assert a == again
    assert [j.model for j in a.jobs] != [j.model for j in b.jobs]
    assert [j.deadline for j in a.jobs] != [j.deadline for j in b.jobs]
    assert a.durations == b.durations and [j.submit_time for j in a.jobs] == [j.submit_time for j in b.jobs]


def test_builtin_data_is_package_data() -> None:
    from importlib.resources import files

    folder = files("meshsched.profiles") / "traces"
    for name in ("philly.csv.gz", "philly_rfold.csv.gz", "README.md"):
        assert (folder / name).is_file()


# -- our own CSV format ----------------------------------------------------------------------------------
def test_own_format_duration_form(tmp_path: Path) -> None:
    path = write(tmp_path, (
        "job_id, submit_time, gpus, duration, model, batch_size, deadline, tenant, user, name, guaranteed\n"
        "late,100,2,30,a,40,500,t1,alice,x,yes\n"
        "\n"
        "early,40,1,7,,,,,,,\n"
        "mid,70,5,0,b,,,,,,0\n"
    ))
    trace = load_trace(path, TinyPerf(), TINY)
    assert trace.name == "t"
    early, mid, late = trace.jobs
    assert [j.job_id for j in trace.jobs] == ["early", "mid", "late"] and trace.durations == (7.0, 0.0, 30.0)
    assert [j.submit_time for j in trace.jobs] == [0.0, 30.0, 60.0]
    # late: per-GPU batch 20, 2 GPUs on one 4-GPU node -> 0.2 s/it -> 150 iterations; deadline 500 s after submit
    assert (late.model, late.batch_size, late.iterations, late.deadline) == ("a", 40, 150, 560.0)
    assert (late.tenant, late.user, late.name, late.guaranteed) == ("t1", "alice", "x", True)
    # mid: 5 GPUs = (4, 1), two nodes: 0.01 * 5 * 1.5; duration 0 -> one iteration
    assert (mid.model, mid.batch_size, mid.iterations) == ("b", 25, 1)
    assert early.model in ("a", "b", "solo") and early.user == "nobody" and early.tenant == "default"
    assert early.deadline is None and mid.deadline is None  # the file has a deadline column: none drawn
    assert not early.guaranteed and not mid.guaranteed


def test_own_format_iterations_form_gzip(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv.gz"
    path.write_bytes(gzip.compress(b"submit_time,gpus,iterations,model,batch_size\n5,8,100,a,80\n2.5,1,3,solo,1\n"))
    trace = load_trace(str(path), TinyPerf(), TINY)
    assert trace.name == "mine"
    first, second = trace.jobs
    assert (first.job_id, first.submit_time, first.iterations) == ("mine-1", 0.0, 3)
    assert 1.5 * 0.03 <= first.deadline <= 2.5 * 0.03  # no deadline column: deadlines are drawn
    assert (second.job_id, second.submit_time, second.batch_size) == ("mine-0", 2.5, 80)
    assert trace.durations == pytest.approx((0.03, 100 * 0.01 * 10 * 1.5))  # 8 GPUs = (4, 4): two nodes


def test_own_format_draws_are_seeded(tmp_path: Path) -> None:
    path = write(tmp_path, "submit_time,gpus,duration\n" + "".join(f"{i},{1 + i % 3},{10 * i}\n" for i in range(60)))
    a, b = (load_trace(path, TinyPerf(), TraceOptions("tiny", 4, seed=s)) for s in (1, 2))
    assert a == load_trace(path, TinyPerf(), TraceOptions("tiny", 4, seed=1))
    assert [j.model for j in a.jobs] != [j.model for j in b.jobs]
    assert all(j.model != "solo" for j in a.jobs if j.gpus > 1)  # multi-GPU jobs get multi-GPU models
    for job, duration in zip(a.jobs, a.durations):
        assert 1.5 * duration - 1e-9 <= job.deadline - job.submit_time <= 2.5 * duration + 1e-9 or duration == 0


def test_crlf_and_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbfsubmit_time,gpus,duration\r\n0,1,5\r\n\r\n1,1,5\r\n2,x,5\r\n")
    with pytest.raises(TraceError, match=r"t\.csv:5: column 'gpus': 'x' is not an integer"):
        load_trace(str(path), TinyPerf(), TINY)
    path.write_bytes(b"\xef\xbb\xbfsubmit_time,gpus,duration\r\n0,1,5\r\n\r\n1,1,5\r\n")
    assert len(load_trace(str(path), TinyPerf(), TINY).jobs) == 2


def test_file_in_philly_format(tmp_path: Path) -> None:
    path = write(tmp_path, (
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-01 00:01:00,60.0,2,120.0,vcB\n"
        "2017-10-01 00:00:00,10.0,1,10.0,vcA\n"
    ))
    trace = load_trace(path, TinyPerf(), TINY)
    assert [(j.submit_time, j.gpus, j.tenant) for j in trace.jobs] == [(0.0, 1, "vcA"), (60.0, 2, "vcB")]


def test_real_perf_model_with_own_format(tmp_path: Path, perf: PerfModel, opts: TraceOptions) -> None:
    model = perf.models(opts.gpu_type, 4)[0]
    per_gpu = perf.profiled_batches(model, opts.gpu_type)[0]
    path = write(tmp_path, f"submit_time,gpus,iterations,model,batch_size\n0,4,1000,{model},{4 * per_gpu}\n")
    (job,) = load_trace(path, perf, opts).jobs
    assert (job.model, job.iterations, job.batch_size) == (model, 1000, 4 * per_gpu)
    path = write(tmp_path, "submit_time,gpus,duration,model\n0,1,10,no-such-model\n", "bad.csv")
    with pytest.raises(TraceError, match=r"bad\.csv:2: .*no-such-model"):
        load_trace(path, perf, opts)


# -- errors ----------------------------------------------------------------------------------------------
BAD_FILES = [
    ("", r"t\.csv: empty trace"),
    ("\n\n", r"t\.csv: empty trace"),
    ("submit_time,gpus,duration\n", r"t\.csv: empty trace"),
    ("submit_time,gpus,durration\n0,1,5\n", r"t\.csv:1: bad header: unknown column 'durration'"),
    ("submit_time,duration\n0,5\n", r"t\.csv:1: bad header: required column 'gpus' missing"),
    ("submit_time,gpus,gpus,duration\n", r"t\.csv:1: bad header: column 'gpus' appears twice"),
    ("submit_time,gpus\n0,1\n", r"t\.csv:1: bad header: give exactly one of"),
    ("submit_time,gpus,duration,iterations\n0,1,5,5\n", r"t\.csv:1: bad header: give exactly one of"),
    ("submit_time,gpus,iterations,model\n0,1,5,a\n", r"t\.csv:1: bad header: .*'batch_size'"),
    ("submit_time,gpus,duration\n0,1,5\n1,2\n", r"t\.csv:3: expected 3 fields, got 2"),
    ("submit_time,gpus,duration\n0,1,5\nx,1,5\n", r"t\.csv:3: column 'submit_time': 'x' is not a number"),
    ("submit_time,gpus,duration\n0,1,-5\n", r"t\.csv:2: column 'duration': must be a finite number >= 0"),
    ("submit_time,gpus,duration\n-1,1,5\n", r"t\.csv:2: column 'submit_time': must be"),
    ("submit_time,gpus,duration\n0,1,nan\n", r"t\.csv:2: column 'duration': must be a finite"),
    ("submit_time,gpus,duration\n0,0,5\n", r"t\.csv:2: column 'gpus': must be >= 1, got 0"),
    ("submit_time,gpus,duration\n0,1.5,5\n", r"t\.csv:2: column 'gpus': '1.5' is not an integer"),
    ("submit_time,gpus,duration\n0,1,\n", r"t\.csv:2: column 'duration': empty"),
    ("submit_time,gpus,duration\n\n0,,5\n", r"t\.csv:3: column 'gpus': empty"),
    ("submit_time,gpus,duration,deadline\n0,1,5,0\n", r"t\.csv:2: column 'deadline': must be > 0"),
    ("submit_time,gpus,duration,model\n0,1,5,c\n", r"t\.csv:2: column 'model': 'c' .*known: a, b, solo"),
    ("submit_time,gpus,duration,model\n0,2,5,solo\n", r"t\.csv:2: model 'solo' .* one GPU only"),
    ("submit_time,gpus,duration,batch_size\n0,3,5,10\n", r"t\.csv:2: column 'batch_size': 10 is not a multiple"),
    ("submit_time,gpus,iterations,model,batch_size\n0,1,0,a,10\n", r"t\.csv:2: column 'iterations': must be >= 1"),
    ("submit_time,gpus,iterations,model,batch_size\n0,1,5,,10\n", r"t\.csv:2: column 'model': empty"),
    ("job_id,submit_time,gpus,duration\nx,0,1,5\nx,1,1,5\n", r"t\.csv:3: duplicate job_id 'x'"),
    ("submit_time,gpus,duration,guaranteed\n0,1,5,maybe\n", r"t\.csv:2: column 'guaranteed'"),
    ("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01T00:00:00,1,1,1,a\n", r"t\.csv:2: column 'timestamp'"),
    ("timestamp,duration,num_gpus,gpu_time,cluster\n2017-13-01 00:00:00,1,1,1,a\n", r"t\.csv:2: column 'timestamp'"),
    ("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 00:00:00,1,two,1,a\n",
     r"t\.csv:2: column 'num_gpus'"),
    ("#job id,arrival,topology,shape,size,duration\n", r"t\.csv:1: bad header"),
    ("#job id,arrival time (sec),topology,shape,size,duration (sec)\n0,0.0,CLOS,4+2,4,5\n", r"t\.csv:2: column 'shape'"),
    ("#job id,arrival time (sec),topology,shape,size,duration (sec)\n0,0.0,CLOS,1,1,-5\n",
     r"t\.csv:2: column 'duration \(sec\)'"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_bad_file(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TraceError, match=message) as info:
        load_trace(path, TinyPerf(), TINY)
    assert "\n" not in str(info.value) and str(info.value).startswith(path)


def test_bad_gzip(tmp_path: Path) -> None:
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(b"submit_time,gpus,duration\n0,1,5\n")[:-6])
    with pytest.raises(TraceError, match="bad gzip data"):
        load_trace(str(path), TinyPerf(), TINY)


def test_unknown_trace_lists_builtins(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"unknown trace 'phily'.*philly, philly-rfold"):
        load_trace("phily", TinyPerf(), TINY)
    with pytest.raises(TraceError, match="no such file"):
        load_trace(str(tmp_path / "missing.csv"), TinyPerf(), TINY)
    with pytest.raises(TraceError, match="no such file"):
        load_trace(str(tmp_path), TinyPerf(), TINY)  # a directory


def test_unknown_gpu_type(tmp_path: Path) -> None:
    path = write(tmp_path, "submit_time,gpus,duration\n0,1,5\n")
    with pytest.raises(TraceError, match=r"unknown GPU type 'h100'"):
        load_trace(path, TinyPerf(), TraceOptions("h100", 8))


def test_empty_window(tmp_path: Path) -> None:
    path = write(tmp_path, "submit_time,gpus,duration\n10,1,5\n20,1,5\n")
    assert len(load_trace(path, TinyPerf(), TraceOptions("tiny", 4, window=(10.0, math.inf))).jobs) == 1
    with pytest.raises(TraceError, match=r"t\.csv: no job arrives in the window \[11, 100\)"):
        load_trace(path, TinyPerf(), TraceOptions("tiny", 4, window=(11.0, 100.0)))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"load": 0.0}, {"load": -1.0}, {"load": math.inf}, {"load": math.nan}, {"first_n": 0}, {"first_n": -3},
        {"window": (5.0, 5.0)}, {"window": (5.0, 1.0)}, {"window": (-1.0, 1.0)}, {"window": (math.nan, 1.0)},
        {"gpus_per_node": 0}, {"gpu_type": ""},
    ],
)
def test_bad_options(kwargs: dict) -> None:
    args = {"gpu_type": "tiny", "gpus_per_node": 4} | kwargs
    with pytest.raises(TraceError, match="bad options") as info:
        TraceOptions(**args)
    assert "\n" not in str(info.value)
