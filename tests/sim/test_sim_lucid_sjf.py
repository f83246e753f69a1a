"""Lucid's sjf (and fifo) per job under `--rules lucid`: each job runs for its trace duration and sjf ranks the
queue by that duration, ties in arrival order (meshsched.sim.durations).

`lucid_loop` is a small reference of Lucid's loop (S-Lab-System-Group/Lucid, simulation/policy/sjf.py and
fifo.py, read, not copied) on one node: each second, release the jobs whose end_time is now, append the jobs
submitted this second to the queue in trace order, sort the queue stably (sjf: by duration; fifo: by
submit_time), walk it and break at the first job the placer refuses; end_time = start + duration. On one node
the consolidate placer accepts a job iff the node has that many GPUs free.

Our jobs are built as trace_synth builds them: iterations = max(1, round(duration / step)) at `LinearPerf`'s
step (per-GPU batch x 0.01 s), so a step of 3 s rounds a duration of 20 s to 21 s.
"""

from __future__ import annotations

import random
from dataclasses import replace

from meshsched.loaders.profiles import installed_handle
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import ClusterSpec, simulate
from meshsched.sim.rules import RULES, SimRules
from meshsched.state import JobSpec, JobState
from tests.support.fakes import LinearPerf
from tests.support.sim import perf_model, philly, v100

LUCID = RULES["lucid"]
OLD_LUCID = replace(LUCID, trace_durations=False)  # the lucid rules before trace durations
GPUS = 8

# (job, GPUs, submit second, trace duration in seconds, per-GPU batch: step = batch x 0.01 s)
Row = tuple[str, int, int, int, int]


def lucid_loop(trace: list[Row], policy: str) -> dict[str, tuple[int, int]]:
    """{job: (start, end)} as Lucid's simulate() gives them on one node of GPUS GPUs (trace sorted by submit)."""
    key = (lambda r: r[3]) if policy == "sjf" else (lambda r: r[2])
    free, now, nxt, ended = GPUS, 0, 0, 0
    queue: list[Row] = []
    running: list[tuple[Row, int]] = []
    out: dict[str, tuple[int, int]] = {}
    while ended < len(trace):
        for item in [x for x in running if x[1] == now]:  # 1. release the jobs ending now
            running.remove(item)
            free += item[0][1]
            ended += 1
        while nxt < len(trace) and trace[nxt][2] == now:  # 2. the jobs submitted now, in trace order
            queue.append(trace[nxt])
            nxt += 1
        queue.sort(key=key)  # stable: ties keep the queue's order
        for row in list(queue):
            if row[1] > free:
                break  # head-of-line blocking
            free -= row[1]
            queue.remove(row)
            running.append((row, now + row[3]))
            out[row[0]] = (now, now + row[3])
        now += 1
    return out


def _jobs(trace: list[Row]) -> list[JobSpec]:
    return [JobSpec(j, g, "m", b * g, max(1, round(d / (b * 0.01))), submit_time=float(s)) for j, g, s, d, b in trace]


def _run(trace: list[Row], policy: str, rules: SimRules, with_durations: bool = True) -> dict[str, tuple[float, float]]:
    durations = [float(r[3]) for r in trace] if with_durations else None
    r = simulate(_jobs(trace), make_policy(policy, installed_handle()), LinearPerf(10.0, 5.0),
                 ClusterSpec(1, GPUS, "fake", 16384), rules=rules, durations=durations,
                 after_event=lambda e: e.state.validate())  # fmt: skip
    out = {}
    for j in r.engine.state.jobs.values():
        assert j.state is JobState.COMPLETED, j.job_id
        out[j.job_id] = (j.acct.first_start, j.acct.finish_time)
    return out


# R holds all 8 GPUs 0-100; A and B (50 s) arrive at 1 and 2, C and D (20 s) both at 3, C first in the trace.
# A and C step 3 s: 17 and 7 iterations, 51 s and 21 s.
TIES: list[Row] = [("R", 8, 0, 100, 100), ("A", 8, 1, 50, 300), ("B", 8, 2, 50, 100), ("C", 8, 3, 20, 300),
                   ("D", 8, 3, 20, 100)]  # fmt: skip


def test_sjf_ties_keep_arrival_and_trace_order_and_jobs_run_their_duration():
    """Lucid at 100: queue sorted by duration [C 20, D 20, A 50, B 50] (C before D: trace order within the second;
    A before B: arrival): C 100-120, D 120-140, A 140-190, B 190-240. Ranked by iterations x step (21, 20, 51,
    50) the old rules ran D 100-120, C 120-141, B 141-191, A 191-242."""
    want = {"R": (0, 100), "C": (100, 120), "D": (120, 140), "A": (140, 190), "B": (190, 240)}
    assert lucid_loop(TIES, "sjf") == want
    assert _run(TIES, "sjf-strict", LUCID) == want
    assert _run(TIES, "sjf-strict", OLD_LUCID) == {"R": (0, 100), "D": (100, 120), "C": (120, 141),
                                                   "B": (141, 191), "A": (191, 242)}  # fmt: skip


def test_fifo_jobs_run_their_trace_duration():
    """fifo in trace order; A and C run 50 and 20 s (not 51 and 21)."""
    want = {"R": (0, 100), "A": (100, 150), "B": (150, 200), "C": (200, 220), "D": (220, 240)}
    assert lucid_loop(TIES, "fifo") == want
    assert _run(TIES, "fifo", LUCID) == want


def test_durations_are_recovered_when_the_replay_is_not_given_them():
    """`mesh simulate` passes the jobs alone: a duration is recovered as iterations x reference step, to the
    nearest second. F (10 s, step 1) arrives at 1, E (10 s, step 0.7: 14 iterations, 9.8 s) at 2, both behind R.
    Lucid: tie, F first: F 100-110, E 110-120. The old rules ranked E (9.8) first: E 100-110, F 110-120."""
    trace: list[Row] = [("R", 8, 0, 100, 100), ("F", 8, 1, 10, 100), ("E", 8, 2, 10, 70)]
    want = {"R": (0, 100), "F": (100, 110), "E": (110, 120)}
    assert lucid_loop(trace, "sjf") == want
    assert _run(trace, "sjf-strict", LUCID, with_durations=False) == want
    assert _run(trace, "sjf-strict", OLD_LUCID, with_durations=False) == {"R": (0, 100), "E": (100, 110),
                                                                          "F": (110, 120)}  # fmt: skip


def _random_trace(seed: int, n: int = 40) -> list[Row]:
    rng = random.Random(seed)
    out: list[Row] = []
    t = 0
    for i in range(n):
        t += rng.choice((0, 0, 1, 2, 3, 7, 20, 60))
        d = rng.choice((5, 10, 10, 20, 30, 30, 31, 45, 60, 90, 120, rng.randint(1, 300)))
        out.append((f"j{i:02d}", rng.choice((1, 1, 2, 2, 4, 8)), t, d, rng.choice((50, 70, 100, 300))))
    return out


def test_random_traces_match_lucids_loop_per_job():
    """Three seeded traces with duration ties, same-second arrivals and steps of 0.5-3 s: every job's start and end
    under sjf-strict and fifo with the lucid rules equal the reference loop's."""
    for seed in (1, 2, 3):
        trace = _random_trace(seed)
        for ours, theirs in (("sjf-strict", "sjf"), ("fifo", "fifo")):
            want = lucid_loop(trace, theirs)
            got = _run(trace, ours, LUCID)
            diff = {j: (got[j], want[j]) for j in want if got[j] != want[j]}
            assert not diff, (seed, ours, diff)


def test_default_rules_ignore_durations():
    """Without trace_durations the jobs run their iterations (A 17 x 3 s) with or without durations given."""
    rules = SimRules(load_time=False, time_step_s=1.0)
    assert _run(TIES, "sjf-strict", rules) == _run(TIES, "sjf-strict", rules, with_durations=False)
    assert _run(TIES, "fifo", rules)["A"] == (100, 151)


def test_philly_durations_are_recovered_exactly():
    """On a Philly slice (V100 steps under 1 s but for a few that round well), the replay without durations (as
    `mesh simulate` runs it) equals the one given them, and each job runs its trace duration."""
    tr = philly(200)
    per_job = []
    for durations in (tr.durations, None):
        r = simulate(tr.jobs, make_policy("sjf-strict", installed_handle()), perf_model(), v100(1), rules=LUCID,
                     durations=durations)  # fmt: skip
        per_job.append({j.job_id: (j.acct.first_start, j.acct.finish_time) for j in r.engine.state.jobs.values()})
    assert per_job[0] == per_job[1]
    ends = per_job[0]
    assert all(ends[j.job_id][1] - ends[j.job_id][0] == d for j, d in zip(tr.jobs, tr.durations) if d > 0
               and ends[j.job_id][1] is not None)  # fmt: skip
