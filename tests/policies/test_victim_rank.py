"""RemainingRank (meshsched.policies.victim_rank): SRTF's lazily ranked victims equal the plain ranking
(`ShortestRemaining.worst_first` over `view.holding()`) on random evolving states, ties included, and a preemptive
SRTF replay makes the same decisions with it as with the plain ranking."""

from __future__ import annotations

import random

import pytest

from meshsched.policies import queue as queue_mod
from meshsched.policies.queue import ShortestRemaining
from meshsched.policies.victim_rank import RemainingRank
from meshsched.state import ClusterState, Job, JobSpec, JobState


class _View:
    """What RemainingRank reads of a ClusterView: the state and the holding jobs (in start order)."""

    def __init__(self, state: ClusterState, active: dict[str, Job]) -> None:
        self._state, self._active = state, active

    def cluster_state(self) -> ClusterState:
        return self._state

    def holding(self):
        return self._active.values()


def _job(rng: random.Random, i: int) -> Job:
    # few distinct sizes and submit times: equal keys (ties) happen often
    spec = JobSpec(f"j{i}", rng.choice([1, 2, 4, 8]), "m", 32, rng.choice([100, 200, 400]),
                   submit_time=float(rng.choice([0, 10, 20])))
    return Job(spec, ideal_step_time=rng.choice([0.5, 1.0]))


def _plain(view: _View, now: float) -> list:
    return ShortestRemaining().worst_first(view.holding(), now)


def _read(ranked, limit: int | None) -> list:
    out = []
    for item in ranked:
        if limit is not None and len(out) >= limit:
            break
        out.append(item)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_lazy_ranking_equals_the_plain_one_on_random_states(seed):
    rng = random.Random(seed)
    state, active = ClusterState(), {}
    view, rank = _View(state, active), RemainingRank()
    now, n = 0.0, 0
    for _step in range(120):
        for _ in range(rng.randint(0, 4)):  # changes between two passes, each touching its job
            op = rng.random()
            if op < 0.3 or not active:
                j = _job(rng, n)
                n += 1
                state.jobs[j.job_id] = j
                j.state = rng.choice([JobState.LOADING, JobState.RUNNING])
                j.progress_time, j.step_time = now, rng.choice([0.0, 0.5, 1.0, 2.0])
                j.done_iterations = float(rng.choice([0, 0, 50]))
                active[j.job_id] = j
                state.touch(j.job_id)
            else:
                j = rng.choice(list(active.values()))
                if op < 0.5:
                    del active[j.job_id]  # released (it may start again later: a new place in start order)
                    j.state = JobState.PREEMPTED
                elif op < 0.6:
                    j.state = JobState.PAUSING
                elif op < 0.9:  # a progress report or a new rate
                    j.done_iterations = j.iterations_at(now)
                    j.progress_time, j.step_time = now, rng.choice([0.5, 1.0, 3.0])
                    j.state = JobState.RUNNING
                else:
                    j.state = JobState.RUNNING  # LOADING -> RUNNING
                    j.progress_time = now
                state.touch(j.job_id)
        if rng.random() < 0.05:
            state.touch()  # a change the log cannot attribute: rebuilt from scratch
        now += rng.choice([0.0, 0.0, 1.0, 7.5, 60.0])
        ranked = rank.ranked(view, now)
        want = _plain(view, now)
        # a pass reads a prefix, perhaps several times from the start
        for limit in (rng.choice([0, 1, 3, None]), rng.choice([2, None])):
            got = _read(ranked, limit)
            assert [(p, j.job_id) for p, j in got] == [(p, j.job_id) for p, j in want[:len(got)]]
        if rng.random() < 0.3:
            got = _read(ranked, None)
            assert [(p, j.job_id) for p, j in got] == [(p, j.job_id) for p, j in want]


def test_srtf_replay_decides_as_with_the_plain_ranking(monkeypatch):
    from meshsched.policies.registry import make_policy
    from meshsched.sim.loop import simulate
    from tests.support.sim import perf_model, philly, v100

    def run():
        r = simulate(philly(600).jobs, make_policy("srtf"), perf_model(), v100(4))
        jobs = r.engine.state.jobs
        assert sum(j.acct.preemptions for j in jobs.values()) > 20  # the replay does preempt
        return r.events, [(jid, j.state, j.acct.preemptions, j.acct.first_start, j.since) for jid, j in sorted(jobs.items())]

    lazy = run()
    monkeypatch.setattr(queue_mod.RemainingRank, "ranked",
                        lambda self, view, now: ShortestRemaining().worst_first(view.holding(), now))
    assert lazy == run()
