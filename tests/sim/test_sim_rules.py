"""Simulator rules (meshsched.sim.rules): each of Lucid's rules on a hand-made trace whose outcome under Lucid's
simulator (S-Lab-System-Group/Lucid, simulation/policy/*.py) is worked out by hand in the test's docstring,
and the default rules leaving the golden Philly summaries where they were.

All traces run on one node of 4 GPUs of `LinearPerf` (tests/fakes.py): per-GPU batch 100 steps in 1.0 s, so a
job of N iterations trains N seconds; the model's load time is 10 s and its pause time 5 s (what the default
rules charge). Lucid times are integers: at each second it releases ended jobs, adds arrivals, runs one pass.
"""

from __future__ import annotations

import json

import pytest
from meshsched.cli.main import app
from typer.testing import CliRunner

from meshsched.loaders.profiles import installed_handle
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.sim.metrics import summarise, summary_dict
from meshsched.sim.rules import RULES, SimRules, rules_named
from meshsched.state import JobSpec, JobState
from tests.support.fakes import LinearPerf
from tests.support.sim import (
    GOLDEN,
    GOLDEN_SETUP,
    POLICIES,
    moved_metrics,
    perf_model,
    philly,
    v100,
)

LUCID = RULES["lucid"]


def _job(job_id: str, gpus: int, iterations: int, submit: float, per_gpu_batch: int = 100) -> JobSpec:
    return JobSpec(job_id, gpus, "m", per_gpu_batch * gpus, iterations, submit_time=submit)


def _run(jobs: list[JobSpec], policy: str, rules: SimRules) -> dict[str, tuple[float, float]]:
    """{job: (first start, finish)} after a validated replay on 1 x 4 GPUs."""
    r = simulate(jobs, make_policy(policy, installed_handle()), LinearPerf(10.0, 5.0), ClusterSpec(1, 4, "fake", 16384), rules=rules,
                 after_event=lambda e: e.state.validate())  # fmt: skip
    out = {}
    for j in r.engine.state.jobs.values():
        assert j.state is JobState.COMPLETED, j.job_id
        out[j.job_id] = (j.acct.first_start, j.acct.finish_time)
    return out


# r (2 GPUs, 100 s) runs from 0; x (4 GPUs, 50 s) and y (2 GPUs, 200 s) arrive at 1 with 2 GPUs free.
HOL = [_job("r", 2, 100, 0.0), _job("x", 4, 50, 1.0), _job("y", 2, 200, 1.0)]


def test_head_of_line_blocking_sjf_strict_is_lucids_sjf():
    """Lucid's sjf.py (ShortestJobFirst.simulate): the queue sorted by duration, `break` at the first job the
    placer refuses. t=0: r starts (end 100). t=1: queue [x 50, y 200]; x needs 4 of 2 free: break, y waits.
    t=100: r ends; x starts (end 150); y: 0 free, break. t=150: x ends; y starts (end 350).
    Our backfilling sjf starts y at 1 on r's neighbours (end 201) and x waits for both: 201-251."""
    assert _run(HOL, "sjf-strict", LUCID) == {"r": (0, 100), "x": (100, 150), "y": (150, 350)}
    assert _run(HOL, "sjf", LUCID) == {"r": (0, 100), "x": (201, 251), "y": (1, 201)}


def test_no_load_time_under_lucid_rules():
    """Lucid starts training at placement: end_time = start_time + duration (sjf.py). The default rules add
    the model's 10 s load to every start: r 0-110 (10 s loading), then x 110-170, y 170-380."""
    assert _run(HOL, "sjf-strict", SimRules(load_time=False)) == {"r": (0, 100), "x": (100, 150), "y": (150, 350)}
    assert _run(HOL, "sjf-strict", RULES["meshsched"]) == {"r": (0, 110), "x": (110, 170), "y": (170, 380)}


def test_restart_charge_of_40_s_by_hand():
    """Lucid's srtf.py (ShortestRemainingTimeFirst.simulate) with Policy.ckpt_overhead = 40 s (<= 8 GPUs).
    a (4 GPUs, 100 s) at 0; b (4 GPUs, 10 s) at 50. Each second, step 1 ends a running job whose remain is 0,
    else counts it down; step 3 walks queued + running jobs by remain under a quota of 4 GPUs.
    t=0: a placed, remain 100. t=50: a's remain 50; b (10) takes the quota, a is preempted: remain 50 + 40 = 90,
    GPUs released at once; b placed at 50. b's remain reaches 0 at 60, so it ends at t=61 (the one-step lag).
    t=61: a placed again, remain 90: 0 at 151, ends at t=152. Per job: a (0, 152), b (50, 61).
    Ours under lucid rules: b preempts a at 50, a pauses in no time, b trains 50-60 (+1 s lag: ends 61); a
    restarts at 61, pays 40 s, trains its last 50 its 101-151, ends 152."""
    jobs = [_job("a", 4, 100, 0.0), _job("b", 4, 10, 50.0)]
    assert _run(jobs, "srtf", LUCID) == {"a": (0, 152), "b": (50, 61)}
    # the charge alone, without the end lag or the time step: a restarts at 60, 40 s + 50 s: ends 150
    assert _run(jobs, "srtf", SimRules(load_time=False, restart_charge_s=40.0)) == {"a": (0, 150), "b": (50, 60)}
    # the default rules: a pauses 50-55, b loads 55-65 and trains 65-75, a reloads 75-85 and trains 85-135;
    # a had loaded 0-10 and trained 10-50 (40 its) first
    assert _run(jobs, "srtf", RULES["meshsched"]) == {"a": (0, 145), "b": (55, 75)}


def test_restart_charge_is_60_s_above_8_gpus():
    assert LUCID.restart_charge(8) == 40.0 and LUCID.restart_charge(16) == 60.0
    assert RULES["meshsched"].restart_charge(8) is None


def test_two_jobs_ending_in_one_step_are_placed_by_one_pass():
    """p (2 GPUs, 199 steps of 0.5 s: ends at 99.5) and q (2 GPUs, 100 s) run from 0; x (4 GPUs, 50 s) and
    y (2 GPUs, 300 s) arrive at 1. Lucid (1 s steps, whole-second times): p's end, at 99.5, is delivered at the
    nearest step, 100, so at t=100 both release before the one pass: x (shortest) takes all 4 GPUs, 100-150;
    then y 150-450. With a pass per event (no time step), p's release alone lets backfilling sjf start y on
    its 2 GPUs at 99.5 (ends 399.5), and x waits for y: 399.5-449.5."""
    jobs = [_job("p", 2, 199, 0.0, per_gpu_batch=50), _job("q", 2, 100, 0.0), _job("x", 4, 50, 1.0),
            _job("y", 2, 300, 1.0)]  # fmt: skip
    stepped = _run(jobs, "sjf", SimRules(load_time=False, time_step_s=1.0))
    assert stepped == {"p": (0, 100), "q": (0, 100), "x": (100, 150), "y": (150, 450)}
    per_event = _run(jobs, "sjf", SimRules(load_time=False))
    assert per_event == {"p": (0, 99.5), "q": (0, 100), "x": (399.5, 449.5), "y": (99.5, 399.5)}


def test_arrival_and_release_in_one_step_see_each_other():
    """Lucid releases, then adds arrivals, then runs one pass (sjf.py steps 1 and 2). L (4 GPUs, 500 s) waits
    behind R (4 GPUs, 100 s, 0-100); S (4 GPUs, 10 s) arrives at 100, when R ends: the pass sees both L and S and
    starts S (shorter) at 100-110, then L 110-610."""
    jobs = [_job("R", 4, 100, 0.0), _job("L", 4, 500, 1.0), _job("S", 4, 10, 100.0)]
    assert _run(jobs, "sjf-strict", LUCID) == {"R": (0, 100), "L": (110, 610), "S": (100, 110)}


def test_events_go_to_the_nearest_step():
    """A trace duration rounded to whole iterations ends a fraction of a step early or late; Lucid's end is the
    whole second (sjf.py: end_time = start_time + duration)."""
    assert [LUCID.step_of(t) for t in (149.97, 150.0, 150.03, 99.5, 99.49)] == [150, 150, 150, 100, 99]
    assert SimRules().step_of(99.49) == 99.49


def test_rules_by_name_and_refusals():
    assert rules_named("lucid") is LUCID and rules_named(" meshsched ") == SimRules()
    with pytest.raises(ValueError, match="unknown simulator rules 'nope'; known: meshsched, lucid"):
        rules_named("nope")
    with pytest.raises(ValueError, match="positive"):
        SimRules(time_step_s=0.0)
    with pytest.raises(ValueError, match="periodic policy"):
        simulate([], make_policy("srtf@60"), LinearPerf(), ClusterSpec(1, 4, "fake", 16384), rules=LUCID)


def test_meshsched_rules_leave_the_golden_summaries_unchanged():
    """`--rules meshsched` is today's simulator: the golden philly200 summaries, with the rules given explicitly."""
    golden = json.loads(GOLDEN.read_text())
    assert golden["setup"] == GOLDEN_SETUP
    g = GOLDEN_SETUP
    moved = []
    for p in POLICIES:
        r = simulate(philly(g["first_n"]).jobs, make_policy(p, installed_handle()), perf_model(), v100(g["nodes"]), rules=rules_named("meshsched"))
        moved += moved_metrics(p, golden["summaries"][p], summary_dict(summarise(r, p)))
    assert not moved, moved


def test_cli_rules_option():
    runner = CliRunner()
    bad = runner.invoke(app, ["simulate", "--rules", "nope", "--jobs", "5"])
    assert bad.exit_code != 0 and "unknown simulator rules 'nope'" in bad.stderr
    ok = runner.invoke(app, ["simulate", "--rules", "lucid", "--policy", "sjf-strict", "--jobs", "30", "--nodes", "2",
                             "--json"])  # fmt: skip
    assert ok.exit_code == 0, (ok.stdout, ok.stderr)
    data = json.loads(ok.stdout)
    assert data["rules"] == "lucid" and data["policies"][0]["policy"] == "sjf-strict"
    assert data["policies"][0]["completed"] + data["policies"][0]["unschedulable"] == 30


def test_a_step_whose_events_include_a_load_ending_still_gets_its_pass():
    """Within a step, events that trigger no pass (a load ending) are delivered before releases and arrivals,
    so the step's last event runs the pass. Time step 1 s with the 10 s load: R (2 GPUs, 100 s) loads 0-10 and
    trains 10-110; X (2 GPUs, 50 s) arrives at 100 and loads 100-110; Y (4 GPUs, 10 s) arrives at 105 and waits.
    At 110 X's load ends and R ends in one step: one pass, Y still finds only 2 GPUs. X trains 110-160; Y then
    loads 160-170 and trains 170-180."""
    jobs = [_job("R", 2, 100, 0.0), _job("X", 2, 50, 100.0), _job("Y", 4, 10, 105.0)]
    assert _run(jobs, "sjf", SimRules(time_step_s=1.0)) == {"R": (0, 110), "X": (100, 160), "Y": (160, 180)}


def test_a_timer_is_never_delivered_before_it_is_due():
    """las asks to be woken when a 7-GPU job crosses 3600 GPU-seconds (b, 2 GPUs, waits for it): at 3600 / 7 =
    514.29 s. Delivered at the nearest step (514), the tick would come before the crossing, las would ask again
    for 514.29, and the replay would spin at 514 for ever; timers go to the next step (515) instead."""
    count = [0]

    def guard(engine) -> None:
        count[0] += 1
        assert count[0] < 1000, "the replay spins"

    r = simulate([_job("a", 7, 1000, 0.0), _job("b", 2, 10, 0.0)], make_policy("las"), LinearPerf(),
                 ClusterSpec(1, 8, "fake", 16384), rules=LUCID, after_event=guard)  # fmt: skip
    assert all(j.state is JobState.COMPLETED for j in r.engine.state.jobs.values())
    b = r.engine.state.jobs["b"]
    assert b.acct.first_start == 515  # a is demoted at the step after its crossing and gives way to b


def test_a_preemption_loop_at_one_instant_is_an_error_not_a_hang():
    """Free, immediate preemption lets a stack whose placement restarts a job that its preemption layer evicts
    again (castor+srtf on this Philly slice, at 867639 s) cycle without time advancing: the replay stops with
    one line instead of spinning. Under the default rules each cycle costs pause and load time."""
    perf = perf_model()
    from meshsched.loaders.profiles import load_interference
    from meshsched.policies.stack import PolicyHandle

    stack = make_policy("castor+srtf", PolicyHandle(perf, load_interference(), 1))
    with pytest.raises(RuntimeError, match="without time advancing"):
        simulate(philly(300).jobs, stack, perf, v100(2), rules=LUCID)
