"""Lazer as a preemption layer (meshsched/policies/lazer.py): Algorithm 2 on a hand-made snapshot, Eq. 2's futile
preemption avoided by a deferral (replayed by hand), deferral timers, F measurements, memory in engine state,
seeded determinism, the registry, and meshd with fake GPUs (a deferred preemption; the GP fit off the loop)."""

from __future__ import annotations

import pytest

from meshsched import events as ev
from meshsched.actions import FitModel
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.policies.base import Cycle, Trigger
from meshsched.policies.lazer import Lazer, LazerMemory
from meshsched.policies.lazer_opt import (
    DeferralOptimizer,
    OptimizerConfig,
    Stage,
    Suggestion,
    latin_hypercube,
)
from meshsched.policies.registry import UnknownPolicy, make_policy, parse_policy
from meshsched.policies.stack import PolicyHandle
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.sim.world import SimWorld
from meshsched.state import Job, JobSpec, JobState, NodeSpec
from tests.support.fakes import LinearPerf

LOAD, PAUSE = 10.0, 5.0  # LinearPerf: a step of 100 samples per GPU takes 1 s


def _spec(job_id: str, gpus: int, seconds: int, submit: float = 0.0) -> JobSpec:
    return JobSpec(job_id, gpus, "m", 100 * gpus, seconds, submit_time=submit)


def _seed_with_first_x(low: float, high: float, xmax: float = 100.0) -> tuple[int, float]:
    """A seed whose first bootstrap deferral (Latin hypercube) lies in [low, high]."""
    for seed in range(1, 500):
        x = latin_hypercube(10, 0.0, xmax, (seed, 0))[0]
        if low <= x <= high:
            return seed, x
    raise AssertionError("no seed found")


# ------------------------------------------------------------------------------------------ Algorithm 2


@pytest.fixture
def snapshot():
    """2 nodes x 4 GPUs: c (4 GPUs, 8000 s left) fills one node; a (2 GPUs, 5000 s) and b (2 GPUs, 3000 s) the other."""
    perf = LinearPerf(LOAD, PAUSE)
    engine = Engine(make_policy("lazer", PolicyHandle(perf=perf)), ProfileEstimator(perf))
    for n in ("n0", "n1"):
        engine.handle(ev.NodeJoined(f"join-{n}", NodeSpec(n, 4, "fake", 16384)), 0.0)
    for job_id, gpus, secs in (("c", 4, 8000), ("a", 2, 5000), ("b", 2, 3000)):
        engine.handle(ev.JobSubmitted(f"s-{job_id}", _spec(job_id, gpus, secs)), 0.0)
        engine.handle(ev.JobStarted(f"l-{job_id}", job_id), 0.0)
    assert all(engine.state.jobs[j].state is JobState.RUNNING for j in "abc")
    assert len({engine.state.gpus[engine.state.jobs[j].gpus[0]].node for j in "ab"}) == 1
    return engine


@pytest.mark.parametrize(
    ("gpus", "seconds", "held", "expected"),
    [
        (4, 1000, set(), {"c"}),  # the longest running job alone frees a node
        (2, 1000, set(), {"c"}),  # longest first, even when a shorter job would free just enough
        (6, 1000, set(), {"c", "a"}),  # longest first until the GPUs suffice
        (4, 6000, set(), {"c"}),  # only strictly longer jobs are candidates
        (6, 6000, set(), None),  # ... and c alone is too small
        (4, 1000, {"c"}, {"a", "b"}),  # c is in the deferred-run queue: not a candidate
        (4, 9000, set(), None),  # nobody is longer
    ],
)
def test_algorithm_2_candidates(snapshot, gpus, seconds, held, expected):
    lazer: Lazer = snapshot.policy.preemption
    view = snapshot.view()
    job = Job(_spec("new", gpus, seconds), ideal_step_time=1.0, since=0.0, progress_time=0.0)
    found = lazer.orchestrate(view, Cycle(view, 0.0, Trigger.ARRIVAL), job, set(held))
    assert (None if found is None else {v.job_id for v in found.victims}) == expected
    if found is not None:
        assert sum(n for _, n in found.spot) == gpus


@pytest.mark.parametrize(("spec", "expected"), [("lazer:loading=preempt", {"l"}), ("lazer", {"l"}),
                                              ("lazer:loading=spare", None)])
def test_a_loading_job_is_a_candidate_unless_spared(spec, expected):
    perf = LinearPerf(LOAD, PAUSE)
    engine = Engine(make_policy(spec, PolicyHandle(perf=perf)), ProfileEstimator(perf))
    engine.handle(ev.NodeJoined("join", NodeSpec("n0", 4, "fake", 16384)), 0.0)
    engine.handle(ev.JobSubmitted("s-l", _spec("l", 4, 8000)), 0.0)
    assert engine.state.jobs["l"].state is JobState.LOADING
    view = engine.view()
    job = Job(_spec("new", 4, 1000), ideal_step_time=1.0, since=0.0, progress_time=0.0)
    found = engine.policy.preemption.orchestrate(view, Cycle(view, 1.0, Trigger.ARRIVAL), job, set())
    assert (None if found is None else {v.job_id for v in found.victims}) == expected


@pytest.mark.parametrize(("spec", "expected"), [("lazer:loading=preempt", {"l"}), ("lazer:loading=last", {"r"}),
                                              ("lazer", {"r"}), ("lazer:loading=spare", {"r"})])
def test_a_loading_job_is_taken_last_by_loading_last(spec, expected):
    """n0: l (8000 s left) still loading; n1: r (7000 s) running. Algorithm 2 takes the longest, l; `last`
    takes the loading job only when the others do not suffice, `spare` never."""
    perf = LinearPerf(LOAD, PAUSE)
    engine = Engine(make_policy(spec, PolicyHandle(perf=perf)), ProfileEstimator(perf))
    for n in ("n0", "n1"):
        engine.handle(ev.NodeJoined(f"join-{n}", NodeSpec(n, 4, "fake", 16384)), 0.0)
    engine.handle(ev.JobSubmitted("s-r", _spec("r", 4, 7000)), 0.0)
    engine.handle(ev.JobStarted("l-r", "r"), 0.0)
    engine.handle(ev.JobSubmitted("s-l", _spec("l", 4, 8000)), 0.0)
    assert engine.state.jobs["l"].state is JobState.LOADING
    view = engine.view()
    lazer: Lazer = engine.policy.preemption
    job = Job(_spec("new", 4, 1000), ideal_step_time=1.0, since=0.0, progress_time=0.0)
    found = lazer.orchestrate(view, Cycle(view, 1.0, Trigger.ARRIVAL), job, set())
    assert {v.job_id for v in found.victims} == expected
    if lazer.loading == "last":  # with r held in a deferral, the loading job is the only candidate
        found = lazer.orchestrate(view, Cycle(view, 1.0, Trigger.ARRIVAL), job, {"r"})
        assert {v.job_id for v in found.victims} == {"l"}


class _FixedX:
    """Stands in for the optimiser: always suggests `x`."""

    def __init__(self, x: float) -> None:
        self.x, self._inner = x, DeferralOptimizer()

    def decide(self, ctx):
        return Suggestion(self.x, Stage.BOOTSTRAP)

    def observe(self, context, x: float, f: float) -> bool:
        return False

    def needs_fit(self) -> bool:
        return False

    def state(self):
        return self._inner.state()


def test_a_deferral_ending_as_a_load_ends_still_gets_its_pass():
    """l starts loading at 0 (10 s); `new`, shorter, arrives at 1 and is deferred by X = 9 s, to 10, the
    instant of l's JobLoaded, an event that runs no pass. The engine used to drop the deferral's timer then,
    and `new` waited for l's completion at 8010 (this test failed before that fix); now the orchestrator runs
    again at 10 and preempts l."""
    perf = LinearPerf(LOAD, PAUSE)
    stack = make_policy("lazer", PolicyHandle(perf=perf))
    stack.preemption._opt = _FixedX(9.0)
    r = simulate([_spec("l", 4, 8000, 0.0), _spec("new", 4, 1000, 1.0)], stack, perf,
                 ClusterSpec(1, 4, "fake", 16384), after_event=lambda e: e.state.validate())
    evicted = [e for e in r.engine.explain("l") if "preempted for new" in e.message]
    assert [e.time for e in evicted] == [pytest.approx(LOAD)]
    assert r.engine.state.jobs["new"].acct.first_start == pytest.approx(LOAD + PAUSE)


# ------------------------------------------------------------------------------------------ Eq. 2 by hand


def _three_jobs(d: float) -> list[JobSpec]:
    """j1 holds the node for 10,000 s; j2 (1,000 s) arrives at 100; j3 (100 s), shorter still, at 100 + d."""
    return [_spec("j1", 4, 10_000, 0.0), _spec("j2", 4, 1000, 100.0), _spec("j3", 4, 100, 100.0 + d)]


def _run(jobs, policy: str):
    perf = LinearPerf(LOAD, PAUSE)
    return simulate(jobs, make_policy(policy, PolicyHandle(perf=perf)), perf, ClusterSpec(1, 4, "fake", 16384),
                    after_event=lambda e: e.state.validate())


def test_a_deferral_avoids_the_futile_preemption_of_eq_2():
    """SRTF: j1 pauses (5 s), j2 loads (10 s) from 105 to 115, j3 arrives at 108 during that load (Eq. 2: it is
    the shortest and arrives in the load phase) and preempts j2: its load is futile. Lazer defers j2's
    preemption by X (> 8 s): j3 finds j1 in the deferred-run queue and waits; when X ends j2 preempts j1,
    and on the release the shortest queued job, j3, starts. Nothing is loaded in vain."""
    d = 8.0
    srtf = _run(_three_jobs(d), "srtf").engine
    assert srtf.state.jobs["j2"].acct.futile_preemptions == 1
    assert srtf.state.jobs["j2"].acct.futile_time == pytest.approx(d - PAUSE)

    seed, x = _seed_with_first_x(20.0, 90.0)
    lazer = _run(_three_jobs(d), f"lazer:seed={seed}").engine
    jobs = lazer.state.jobs
    assert sum(j.acct.futile_preemptions for j in jobs.values()) == 0
    assert all(j.state is JobState.COMPLETED for j in jobs.values())
    # the timer fired at 100 + X and the pass decided again: j1 preempted then, not at j2's arrival
    deferred = [e for e in lazer.explain("j2") if e.message.startswith("deferred")]
    assert [e.time for e in deferred] == [100.0] and "preempting j1" in deferred[0].message
    evicted = [e for e in lazer.explain("j1") if "preempted for j2" in e.message]
    assert [e.time for e in evicted] == [pytest.approx(100.0 + x)]
    # j3 started before j2 once j1's GPUs came free
    assert jobs["j3"].acct.first_start == pytest.approx(100.0 + x + PAUSE)
    assert jobs["j2"].acct.first_start > jobs["j3"].acct.first_start
    # j3 arrived 8 s after the decision, in j2's load window (5, 15]: deferring by F = 8 - 5 = 3 would have let it
    # come while j1 paused, before j2 loaded; f = |X - 3|
    mem = lazer.memory
    assert isinstance(mem, LazerMemory) and not mem.pending and not mem.deferrals
    (obs,) = mem.optimizer.observations
    assert obs.x == pytest.approx(x) and obs.f == pytest.approx(abs(x - (d - PAUSE)))
    assert (obs.context.load_s, obs.context.max_pause_s) == (LOAD, PAUSE)


def test_f_is_zero_when_no_shorter_job_comes_within_pause_plus_load():
    """j3 arrives 40 s after the decision, after p + l = 15 s: F = 0, observed at that next pass."""
    seed, x = _seed_with_first_x(50.0, 90.0)
    engine = _run(_three_jobs(40.0), f"lazer:seed={seed}").engine
    (obs,) = engine.memory.optimizer.observations
    assert obs.f == pytest.approx(x)  # |X - 0|


def test_f_is_zero_when_the_shorter_job_comes_during_the_pause():
    """Eq. 2's p < ΔA: j3 arrives 3 s after the decision, while j1 pauses (5 s): SRTF loads j3, not j2 (nothing
    futile), so F = 0 and f = X. Before the fix F was 3."""
    assert sum(j.acct.futile_preemptions for j in _run(_three_jobs(3.0), "srtf").engine.state.jobs.values()) == 0
    seed, x = _seed_with_first_x(20.0, 90.0)
    (obs,) = _run(_three_jobs(3.0), f"lazer:seed={seed}").engine.memory.optimizer.observations
    assert obs.f == pytest.approx(x)


def test_f_moves_past_every_shorter_arrival_in_the_shifted_load_window():
    """j3 (100 s) at 108 and j4 (50 s) at 114: deferring j2 by 3 (past j3) puts j2's load at (108, 118], on j4;
    the smallest deferral that avoids both is 14 - 5 = 9 (j2 would load in (114, 124]). Before the fix F was 8."""
    seed, x = _seed_with_first_x(30.0, 90.0)
    jobs = [*_three_jobs(8.0), _spec("j4", 4, 50, 114.0)]
    engine = _run(jobs, f"lazer:seed={seed}").engine
    assert sum(j.acct.futile_preemptions for j in engine.state.jobs.values()) == 0
    (obs,) = engine.memory.optimizer.observations
    assert obs.f == pytest.approx(abs(x - 9.0))


def test_an_immediate_x_preempts_at_once_like_srtf():
    seed, x = _seed_with_first_x(0.0, 4.0)
    engine = _run(_three_jobs(50.0), f"lazer:seed={seed}").engine
    evicted = [e.time for e in engine.explain("j1") if "preempted for j2" in e.message]
    assert evicted == [pytest.approx(100.0 + x if x > 0 else 100.0)]


# ------------------------------------------------------------------------------------------ memory, fits


def _philly(n: int):
    from meshsched.loaders.profiles import load_perf_model
    from meshsched.loaders.traces import TraceOptions, load_trace

    perf = load_perf_model(overheads="lazer")
    return perf, load_trace("philly", perf, TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, first_n=n)).jobs


def _records(engine) -> list[tuple]:
    return sorted((j.job_id, j.acct.finish_time, j.acct.first_start, j.acct.preemptions, j.acct.futile_preemptions,
                   j.restarts) for j in engine.state.jobs.values())


def _replay(jobs, perf, spec: str, swap_at: int | None = None, probe: list | None = None):
    """A replay on 2 x 8 V100; `swap_at`: replace the policy objects by fresh ones after that many events
    (a restart or a new leader: only engine state survives); `probe` gets (memory busy, no model yet) per event."""
    count = [0]
    seen: list = []

    def after(engine):
        count[0] += 1
        mem = engine.memory
        if probe is not None:
            probe.append((mem is not None and bool(mem.deferrals) and bool(mem.pending), engine.model is None))
        if count[0] == swap_at:
            seen.append(mem)
            engine.policy = make_policy(spec, PolicyHandle(perf=perf))

    r = simulate(jobs, make_policy(spec, PolicyHandle(perf=perf)), perf,
                 ClusterSpec(2, 8, "v100", perf.gpu_memory_mb("v100")), after_event=after)
    return r.engine, seen


@pytest.mark.slow
def test_a_seeded_replay_is_deterministic_fits_included():
    perf, jobs = _philly(100)
    spec = "lazer:seed=3:refit=1000"  # one fit (after the bootstrap): the test stays short
    a, _ = _replay(jobs, perf, spec)
    b, _ = _replay(jobs, perf, spec)
    assert a.model is not None and a.model.n_observations >= 10  # GP fits ran (FitModel -> ModelFitted)
    assert any("model fitted" in e.message for e in a.log)
    opt = a.memory.optimizer
    assert opt.bootstrap_issued < len(opt.observations) + len(a.memory.pending)  # the model chose some X
    assert _records(a) == _records(b)
    assert a.memory == b.memory
    assert sum(j.acct.preemptions for j in a.state.jobs.values()) > 0


@pytest.mark.slow
def test_the_memory_survives_new_policy_objects():
    """Fresh policy objects swapped in mid-replay, while a deferral and a measurement are in flight (before the
    first fit), change nothing: the deferral queues, pending measurements and observations are engine state."""
    perf, jobs = _philly(60)
    spec = "lazer:seed=2:refit=1000"  # one fit (after the bootstrap), not a refit every 5 observations
    probe: list = []
    base, _ = _replay(jobs, perf, spec, probe=probe)
    swap = next(i + 1 for i, (busy, no_model) in enumerate(probe) if busy and no_model)
    swapped, seen = _replay(jobs, perf, spec, swap_at=swap)
    assert seen[0].deferrals and seen[0].pending
    assert _records(swapped) == _records(base)
    assert swapped.memory == base.memory


def test_the_simulator_fits_at_once_and_answers_at_the_same_time():
    world = SimWorld(LinearPerf(), [NodeSpec("n0", 1, "fake", 16384)])
    world.execute([FitModel(sum, (1, 2, 3))], 7.5)
    at, event = world.pop()
    assert at == 7.5 and isinstance(event, ev.ModelFitted) and event.model == 6


# ------------------------------------------------------------------------------------------ registry


def test_registry_parses_lazer_and_its_parameters():
    assert parse_policy("lazer") == {"preemption": ("lazer", {})}
    assert parse_policy("lazer:refit=3:xmax=50:seed=7") == {
        "preemption": ("lazer", {"refit": 3, "xmax": 50.0, "seed": 7})}
    stack = make_policy("lazer:refit=3:xmax=50:seed=7", PolicyHandle(perf=LinearPerf()))
    lazer = stack.preemption
    assert isinstance(lazer, Lazer) and stack.placement.name == "lazer"  # alone: greedy placement, SRTF order
    assert lazer.config == OptimizerConfig(seed=7, high_s=50.0, refit_every=3)
    assert make_policy("lazer", PolicyHandle(perf=LinearPerf(), seed=4)).preemption.config.seed == 4
    assert parse_policy("castor+lazer") == {"placement": ("castor", {}), "preemption": ("lazer", {})}
    assert make_policy("lazer:loading=spare", PolicyHandle(perf=LinearPerf())).preemption.spare_loading
    assert not lazer.spare_loading


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sjf+lazer", "sjf's queue order is replaced by lazer's"),
        ("srtf+lazer", "both preemption policies"),
        ("lazer@60", "runs on every event"),
        ("lazer:xmax=0", "positive"),
        ("lazer:refit=two", "refit must be int"),
        ("lazer:depth=3", "no parameter 'depth'"),
        ("lazer:loading=maybe", "loading must be one of preempt, spare, last"),
    ],
)
def test_registry_refuses_what_makes_no_sense(spec, message):
    with pytest.raises(UnknownPolicy, match=message):
        parse_policy(spec)


# ------------------------------------------------------------------------------------------ meshd


_SDK_JOB = (
    "import os, signal, sys, time\nfrom meshsched.job.client import JobClient\n"
    "c = JobClient.from_env()\n"
    "if os.environ['MESH_RESTART_COUNT'] != '0': sys.exit(0)\n"
    "def term(*_):\n    c.checkpoint(42)\n    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\nc.hello()\nprint('ready', flush=True)\ntime.sleep(60)\n"
)


@pytest.mark.slow
async def test_meshd_fits_in_another_process_while_the_loop_answers(dirs):
    """A FitModel runs the real GP fit in a worker process: meshd's API answers while it runs, and the model
    comes back as ModelFitted."""
    import aiohttp
    from meshsched.daemon.node import NodeDaemon

    from meshsched.executor import dispatch
    from meshsched.policies.lazer_opt import (
        DeferralContext,
        FitRequest,
        Observation,
        fit_model,
    )
    from tests.support.daemon import make_config, wait_for

    d = NodeDaemon(make_config(*dirs, policy="lazer"))
    await d.start()
    try:
        obs = tuple(Observation(DeferralContext(30.0 + i, 600.0 * (i + 1), 120.0, 8.0), 10.0 * i, abs(10.0 * i - 40.0))
                    for i in range(12))
        dispatch("meshd", d._handlers, FitModel(fit_model, FitRequest(OptimizerConfig(seed=1), obs)))
        assert d.engine.model is None  # the handler returned without fitting
        conn = aiohttp.UnixConnector(path=str(d.config.api_socket))
        async with aiohttp.ClientSession(connector=conn) as http:
            async with http.get("http://meshd/v1/jobs") as resp:
                assert resp.status == 200
        assert d.engine.model is None  # the loop answered while the fit was still running
        await wait_for(lambda: d.engine.model is not None, timeout=180, what="the fitted model")
        assert d.engine.model.n_observations == 12
        assert any("model fitted (FittedModel)" in e.message for e in d.engine.log)
    finally:
        await d.close()


@pytest.mark.slow
def test_a_real_meshd_process_defers_a_preemption_then_preempts(tmp_path):
    """`meshd --policy lazer` as a process on fake GPUs, through its HTTP API: the short job pends with reason
    Deferred (saying whom it will preempt) while the long one keeps running; the long one is told to checkpoint
    only when the deferral ends, then both complete."""
    from tests.support.daemon import (
        kill_sessions,
        poll,
        py,
        remove,
        short_dir,
        start_meshd,
    )

    seed, x = _seed_with_first_x(2.0, 4.0, xmax=4.0)
    runtime = short_dir()
    proc, client = start_meshd(tmp_path / "state", runtime, "--fake-gpus", "4", "--policy", f"lazer:xmax=4:seed={seed}",
                               "--kill-grace", "1", "--node-name", "e2e")

    def job(job_id: str) -> dict:
        return client.call("GET", f"/v1/jobs/{job_id}")

    try:
        long = client.call("POST", "/v1/jobs", {"command": py(_SDK_JOB), "cwd": "/tmp", "gpus": 4,
                                                "iterations": 1000})["job_id"]
        log = tmp_path / "state" / "jobs" / long / "logs" / "rank0.log"
        poll(lambda: log.exists() and "ready" in log.read_text(), timeout=60, what="long job ready")
        short = client.call("POST", "/v1/jobs", {"command": py("pass"), "cwd": "/tmp", "gpus": 2,
                                                 "iterations": 1})["job_id"]
        info = job(short)
        assert info["state"] == "PENDING"
        assert info["reason"].startswith(f"Deferred (lazer: preempting {long} in "), info["reason"]
        assert job(long)["state"] == "RUNNING"  # not told to checkpoint yet
        poll(lambda: job(short)["state"] == "COMPLETED", timeout=60, what="short job done")
        poll(lambda: job(long)["state"] == "COMPLETED", timeout=60, what="long job resumed and done")
        states = [h[1] for h in job(long)["history"]]
        assert states[:5] == ["PENDING", "LOADING", "RUNNING", "PAUSING", "PREEMPTED"]
        evict = [e for e in client.call("GET", f"/v1/jobs/{long}/explain") if "preempted for" in e["message"]]
        defer = [e for e in client.call("GET", f"/v1/jobs/{short}/explain") if e["message"].startswith("deferred")]
        assert len(evict) == 1 and len(defer) == 1 and evict[0]["time"] - defer[0]["time"] >= x - 0.05
    finally:
        pids = [j["supervisor_pid"] for j in client.call("GET", "/v1/jobs?all=1")]
        proc.terminate()
        proc.wait(10)
        kill_sessions(pids)
        remove(runtime)


def test_a_restart_in_the_exploitation_stage_refits_the_frozen_model():
    """Fresh policy objects (a meshd restart, a new leader) over memory in the exploitation stage: the GP that
    was frozen is asked for again (a FitModel of the same observations) and X comes from it once it is back.
    Before the fix the restored optimiser never asked (no fits in exploitation) and drew Latin-hypercube X for
    good."""
    from meshsched.policies.lazer_opt import (
        DeferralContext,
        Observation,
        OptimizerState,
        Stage,
    )

    perf = LinearPerf(LOAD, PAUSE)
    engine = Engine(make_policy("lazer:seed=1", PolicyHandle(perf=perf)), ProfileEstimator(perf))
    engine.handle(ev.NodeJoined("join", NodeSpec("n0", 4, "fake", 16384)), 0.0)
    obs = tuple(Observation(DeferralContext(30.0 + i, 600.0 * (i + 1), 10.0, 5.0), 10.0 * i, abs(10.0 * i - 40.0))
                for i in range(12))
    engine.memory = LazerMemory(OptimizerState(obs, 10, 10, exploiting=True))
    fits = [a for a in engine.handle(ev.JobSubmitted("s-a", _spec("a", 4, 8000)), 0.0) if isinstance(a, FitModel)]
    assert len(fits) == 1 and fits[0].request.observations == obs[:10]  # the frozen model's observations
    assert not any(isinstance(a, FitModel) for a in engine.handle(ev.JobSubmitted("s-b", _spec("b", 4, 1000)), 1.0))
    engine.handle(ev.ModelFitted("fitted", fits[0].fit(fits[0].request)), 2.0)
    engine.handle(ev.JobSubmitted("s-c", _spec("c", 4, 500)), 3.0)
    lazer = engine.policy.preemption
    assert lazer._opt.stage is Stage.EXPLOITATION and lazer._opt.fitted.n_observations == 10
    assert engine.memory.optimizer.fitted_observations == 10 and engine.memory.optimizer.exploiting
    assert not any(isinstance(a, FitModel) for a in engine.handle(ev.JobSubmitted("s-d", _spec("d", 4, 400)), 4.0))


@pytest.mark.slow
def test_the_memory_goes_through_the_journal_and_back(tmp_path):
    """Lazer's memory in mid-replay (deferrals, pending F measurements, observations) encoded, written to meshd's
    journal, read back after the journal is closed and reopened, and decoded by fresh policy objects: an equal
    value, so they carry on from it (test_the_memory_survives_new_policy_objects), and its deferrals' ends are
    timers again (a restarted engine has none armed)."""
    from meshsched.daemon.journal import Journal

    perf, jobs = _philly(60)
    spec = "lazer:seed=2:refit=1000"
    seen: list = []

    def after(engine):
        mem = engine.memory
        if seen or mem is None or not (mem.deferrals and mem.pending and mem.optimizer.observations):
            return
        journal = Journal(tmp_path / "journal.db")
        with journal.batch():
            journal.put_memory(engine.policy.preemption.encode_memory(mem))
        journal.close()
        journal = Journal(tmp_path / "journal.db")
        fresh = make_policy(spec, PolicyHandle(perf=perf)).preemption
        back = fresh.decode_memory(journal.load_memory())
        journal.close()
        first = min(d.until for d in mem.deferrals)
        engine.memory = back
        seen.append((back == mem, fresh.next_timer(engine.view(), first - 1.0), first))

    simulate(jobs, make_policy(spec, PolicyHandle(perf=perf)), perf,
             ClusterSpec(2, 8, "v100", perf.gpu_memory_mb("v100")), after_event=after)
    (equal, timer, first), = seen
    assert equal and timer == first


def test_a_sharing_placement_runs_its_own_bounded_release_pass():
    """castor+lazer: a release pass goes through Castor's own pass (its sharing searches bounded by its depth),
    not one try_start (a sharing search) per queued job, 90 % of a busy-window replay before (issue 26)."""
    from meshsched.loaders.profiles import installed_handle

    perf, jobs = _philly(60)
    stack = make_policy("castor+lazer", installed_handle(1, True, False, perf))
    placement = stack.placement
    calls = {"release_try_start": 0, "release_place": 0}
    try_start, place = placement.try_start, placement.place

    def counted_try_start(view, cycle, job):
        calls["release_try_start"] += cycle.trigger is Trigger.RELEASE
        return try_start(view, cycle, job)

    def counted_place(view, cycle, **kw):
        calls["release_place"] += cycle.trigger is Trigger.RELEASE
        return place(view, cycle, **kw)

    placement.try_start, placement.place = counted_try_start, counted_place
    r = simulate(jobs, stack, perf, ClusterSpec(2, 8, "v100", perf.gpu_memory_mb("v100")))
    assert len(r.engine.state.jobs) == 60
    assert calls["release_place"] > 0 and calls["release_try_start"] == 0
