"""The nouns: job lifecycle transitions, time accounting, and `ClusterState.validate()`'s invariants."""

from __future__ import annotations

import itertools

import pytest

from meshsched.state import (
    ClusterState,
    InvalidTransition,
    InvariantViolation,
    Job,
    JobSpec,
    JobState,
    NodeSpec,
)

S = JobState

# The intended lifecycle, written out independently of the implementation's table:
# PENDING -> LOADING -> RUNNING -> PAUSING -> PREEMPTED -> LOADING ..., with a preemption during
# LOADING (-> PAUSING), a lost node or an innocent-neighbour requeue (LOADING/RUNNING/PAUSING ->
# PREEMPTED), completion from RUNNING or while saving the last checkpoint (PAUSING), failure and
# cancellation from every live state. Terminal states have no exits; nothing moves to itself.
INTENDED: dict[JobState, set[JobState]] = {
    S.PENDING: {S.LOADING, S.CANCELLED, S.FAILED},
    S.LOADING: {S.RUNNING, S.PAUSING, S.PREEMPTED, S.FAILED, S.CANCELLED},
    S.RUNNING: {S.PAUSING, S.PREEMPTED, S.COMPLETED, S.FAILED, S.CANCELLED},
    S.PAUSING: {S.PREEMPTED, S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMEOUT},
    S.PREEMPTED: {S.LOADING, S.CANCELLED, S.FAILED},
    S.COMPLETED: set(),
    S.FAILED: set(),
    S.CANCELLED: set(),
    S.TIMEOUT: set(),  # a time limit ends a job through its checkpoint (PAUSING)
}

ALL_PAIRS = list(itertools.product(list(JobState), repeat=2))
ALLOWED_PAIRS = [(a, b) for a, b in ALL_PAIRS if b in INTENDED[a]]
FORBIDDEN_PAIRS = [(a, b) for a, b in ALL_PAIRS if b not in INTENDED[a]]


def spec(job_id: str = "j", gpus: int = 2, iterations: int = 100, **kw) -> JobSpec:
    return JobSpec(job_id, gpus, "m", 100 * gpus, iterations, **kw)


def job_in(state: JobState, since: float = 3.0, gpus: int = 2) -> Job:
    return Job(spec(gpus=gpus), ideal_step_time=1.0, state=state, since=since)


def _pair_id(p) -> str:
    return f"{p[0].value}->{p[1].value}"


# ------------------------------------------------------------------ lifecycle


def test_matrix_covers_every_state():
    assert set(INTENDED) == set(JobState)
    assert len(ALLOWED_PAIRS) + len(FORBIDDEN_PAIRS) == len(JobState) ** 2


@pytest.mark.parametrize("pair", FORBIDDEN_PAIRS, ids=_pair_id)
def test_forbidden_transition_raises_and_changes_nothing(pair):
    old, new = pair
    job = job_in(old, since=3.0)
    before = (job.state, job.since, job.acct.wait_time, job.acct.load_time, job.acct.run_time, job.acct.pause_time)
    with pytest.raises(InvalidTransition, match=f"{old.value} -> {new.value}"):
        job.transition(new, 10.0)
    after = (job.state, job.since, job.acct.wait_time, job.acct.load_time, job.acct.run_time, job.acct.pause_time)
    assert after == before


@pytest.mark.parametrize("pair", ALLOWED_PAIRS, ids=_pair_id)
def test_allowed_transition_moves_and_restarts_the_clock(pair):
    old, new = pair
    job = job_in(old, since=3.0)
    job.transition(new, 10.0)
    assert job.state is new
    assert job.since == 10.0


@pytest.mark.parametrize("terminal", [S.COMPLETED, S.FAILED, S.CANCELLED])
def test_terminal_states_have_no_exit(terminal):
    assert terminal.is_terminal
    for new in JobState:
        with pytest.raises(InvalidTransition):
            job_in(terminal).transition(new, 5.0)


def test_state_classes_partition_the_lifecycle():
    assert {s for s in JobState if s.is_queued} == {S.PENDING, S.PREEMPTED}
    assert {s for s in JobState if s.holds_gpus} == {S.LOADING, S.RUNNING, S.PAUSING}
    assert {s for s in JobState if s.is_terminal} == {S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMEOUT}


# ------------------------------------------------------------------ accounting


def test_accounting_charges_each_state_to_its_bucket():
    job = Job(spec(gpus=2), ideal_step_time=1.0, since=0.0)
    path = [
        (S.LOADING, 5.0),  # waited 5
        (S.RUNNING, 15.0),  # loaded 10
        (S.PAUSING, 45.0),  # ran 30
        (S.PREEMPTED, 50.0),  # paused 5
        (S.LOADING, 70.0),  # waited 20
        (S.RUNNING, 82.0),  # loaded 12
        (S.COMPLETED, 100.0),  # ran 18
    ]
    for new, t in path:
        job.transition(new, t)
    a = job.acct
    assert a.wait_time == pytest.approx(25.0)
    assert a.load_time == pytest.approx(22.0)
    assert a.run_time == pytest.approx(48.0)
    assert a.pause_time == pytest.approx(5.0)
    assert a.attained_gpu_time == pytest.approx(48.0 * 2)  # GPU-seconds of training only
    assert a.wait_time + a.load_time + a.run_time + a.pause_time == pytest.approx(100.0)  # Lazer Eq. 1
    # transition() never decides futility or counts preemptions; the engine does
    assert a.futile_time == 0.0 and a.futile_preemptions == 0 and a.preemptions == 0


def test_time_in_a_terminal_state_is_never_charged():
    job = Job(spec(), ideal_step_time=1.0, since=0.0)
    job.transition(S.CANCELLED, 7.0)
    assert job.acct.wait_time == 7.0
    with pytest.raises(InvalidTransition):
        job.transition(S.LOADING, 20.0)
    assert job.acct.wait_time == 7.0 and job.acct.load_time == 0.0


def test_progress_extrapolates_only_while_running():
    job = Job(spec(iterations=100), ideal_step_time=2.0, state=S.RUNNING, since=0.0)
    job.done_iterations, job.progress_time, job.step_time = 10.0, 100.0, 4.0
    assert job.iterations_at(140.0) == pytest.approx(20.0)
    assert job.iterations_at(10_000.0) == 100.0  # capped at the job's length
    assert job.remaining_time(140.0) == pytest.approx(80 * 2.0)  # priced at the ideal step time
    assert job.remaining_time(10_000.0) == 0.0
    assert job.expected_duration == pytest.approx(200.0)
    job.state = S.PAUSING
    assert job.iterations_at(140.0) == 10.0


@pytest.mark.parametrize(
    "kw",
    [dict(job_id=""), dict(gpus=0), dict(batch_size=0), dict(iterations=0)],
)
def test_jobspec_rejects_nonsense(kw):
    args = dict(job_id="j", gpus=1, model="m", batch_size=10, iterations=10) | kw
    with pytest.raises(ValueError):
        JobSpec(**args)


def test_nodespec_needs_a_gpu():
    with pytest.raises(ValueError):
        NodeSpec("n", 0, "fake", 1)


# ------------------------------------------------------------------ cluster state


def cluster() -> ClusterState:
    """Two 4-GPU nodes (GPUs 0-3 on a, 4-7 on b) with one running 2-GPU job on GPUs 0,1."""
    c = ClusterState()
    c.add_node(NodeSpec("a", 4, "fake", 16384))
    c.add_node(NodeSpec("b", 4, "fake", 16384))
    add_job(c, "r", S.RUNNING, (0, 1))
    c.validate()
    return c


def add_job(c: ClusterState, job_id: str, state: JobState, gpus: tuple[int, ...], n: int | None = None) -> Job:
    job = Job(spec(job_id, gpus=n or max(1, len(gpus))), ideal_step_time=1.0, state=state)
    c.jobs[job_id] = job
    if gpus:
        c.assign(job_id, gpus)
        job.gpus = gpus
    return job


def test_add_node_and_assign_release_keep_free_counts():
    c = cluster()
    assert c.total_gpus == 8 and c.free_gpus == 6
    assert c.free_by_node == {"a": 2, "b": 4}
    assert [g.index for g in c.gpus] == list(range(8))
    assert [(g.node, g.local_index) for g in c.gpus[3:5]] == [("a", 3), ("b", 0)]
    with pytest.raises(ValueError):
        c.add_node(NodeSpec("a", 4, "fake", 16384))
    # a second job sharing GPU 1 does not change the free count; releasing one of two keeps it busy
    c.assign("x", (1,))
    assert c.free_by_node["a"] == 2
    c.release("x", (1,))
    assert c.free_by_node["a"] == 2
    c.release("r", (0, 1))
    assert c.free_by_node["a"] == 4
    del c.jobs["r"]
    c.validate()


def test_assign_refuses_a_third_job_on_a_gpu():
    c = cluster()
    c.assign("x", (0,))
    with pytest.raises(InvariantViolation):
        c.assign("y", (0,))
    assert c.gpus[0].jobs == ["r", "x"]


def test_lost_node_rejoins_with_recomputed_free_count():
    c = cluster()
    c.mark_lost("b")
    c.validate()
    assert c.total_gpus == 4
    c.add_node(NodeSpec("b", 4, "fake", 16384))
    assert c.nodes["b"].alive and c.free_by_node["b"] == 4 and c.total_gpus == 8
    assert len(c.gpus) == 8  # same GPUs, not new ones
    c.validate()


def _gpu_with_three_jobs(c):
    for j in ("x", "y"):
        add_job(c, j, S.RUNNING, ())
        c.jobs[j].gpus = (0,)
    c.gpus[0].jobs.extend(["x", "y"])
    c.jobs["r"].gpus = (0, 1)


def _wrong_gpu_count(c):
    c.jobs["r"].gpus = (0,)
    c.gpus[1].jobs.clear()
    c.free_by_node["a"] += 1


def _gpu_held_twice(c):
    c.jobs["r"].gpus = (0, 0)
    c.gpus[1].jobs.clear()
    c.free_by_node["a"] += 1
    c.gpus[0].jobs.append("r")


def _gpu_lists_a_non_holder(c):
    add_job(c, "q", S.PENDING, ())
    c.gpus[5].jobs.append("q")
    c.free_by_node["b"] -= 1


def _holder_missing_from_gpu_list(c):
    c.gpus[1].jobs.clear()
    c.free_by_node["a"] += 1


def _stale_free_count(c):
    c.free_by_node["b"] = 3


def _missing_free_count(c):
    del c.free_by_node["b"]


def _queued_job_holds_gpus(c):
    c.jobs["r"].state = S.PREEMPTED


def _terminal_job_holds_gpus(c):
    c.jobs["r"].state = S.CANCELLED


def _completed_early(c):
    add_job(c, "done", S.COMPLETED, ())
    c.jobs["done"].done_iterations = c.jobs["done"].checkpoint_iterations = 99.0


def _progress_beyond_end(c):
    c.jobs["r"].done_iterations = 101.0


def _negative_progress(c):
    c.jobs["r"].done_iterations = -1.0


def _checkpoint_ahead(c):
    c.jobs["r"].done_iterations = 10.0
    c.jobs["r"].checkpoint_iterations = 20.0


def _lost_node_still_used(c):
    c.mark_lost("a")


def _lost_node_counted_free(c):
    free = c.free_by_node["b"]
    c.mark_lost("b")
    c.free_by_node["b"] = free


def _stale_cluster_size(c):
    c.nodes["b"].alive = False  # behind mark_lost's back


CORRUPTIONS = {
    "cached cluster size stale": (_stale_cluster_size, "cached sizes"),
    "cached shared GPU count stale": (lambda c: setattr(c, "shared_gpus", 1), "cached shared_gpus"),
    "gpu with 3 jobs": (_gpu_with_three_jobs, "holds 3 jobs"),
    "job holds wrong number of GPUs": (_wrong_gpu_count, "holds 1 GPUs, asked for 2"),
    "job holds a GPU twice": (_gpu_held_twice, "holds a GPU twice"),
    "gpu lists a job that does not hold it": (_gpu_lists_a_non_holder, "GPU 5 lists"),
    "holder missing from gpu list": (_holder_missing_from_gpu_list, "GPU 1 lists"),
    "stale free count": (_stale_free_count, "node b: free count 3"),
    "missing free count": (_missing_free_count, "node b: free count None"),
    "queued job holds GPUs": (_queued_job_holds_gpus, "PREEMPTED but still holds"),
    "terminal job holds GPUs": (_terminal_job_holds_gpus, "CANCELLED but still holds"),
    "COMPLETED without all iterations": (_completed_early, "COMPLETED with 99"),
    "progress beyond the end": (_progress_beyond_end, "progress 101"),
    "negative progress": (_negative_progress, "progress -1"),
    "checkpoint ahead of progress": (_checkpoint_ahead, "checkpoint ahead"),
    "lost node GPUs still used": (_lost_node_still_used, "on lost node a"),
    "lost node counted free": (_lost_node_counted_free, "node b: free count 4 but 0"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_validate_catches(name):
    corrupt, message = CORRUPTIONS[name]
    c = cluster()
    corrupt(c)
    with pytest.raises(InvariantViolation, match=message):
        c.validate()


def test_validate_accepts_a_legal_mixed_state():
    c = cluster()
    add_job(c, "load", S.LOADING, (4, 5, 6))
    add_job(c, "pause", S.PAUSING, (7,))
    add_job(c, "share", S.RUNNING, (1,))  # two jobs on GPU 1 is allowed
    add_job(c, "q", S.PREEMPTED, ())
    c.jobs["q"].done_iterations = c.jobs["q"].checkpoint_iterations = 40.0
    fin = add_job(c, "fin", S.COMPLETED, ())
    fin.done_iterations = fin.checkpoint_iterations = 100.0
    c.validate()
    assert c.free_by_node == {"a": 2, "b": 0}


def test_free_summary_follows_assign_and_release():
    """assign / release move the kept free map along (a copy each time) where node order allows: after any mix of
    starts, shared starts and releases it equals a fresh count, in node order, and a map handed out never changes."""
    import random

    rng = random.Random(7)
    c = ClusterState()
    for name in "dcab":  # node order is join order, not name order
        c.add_node(NodeSpec(name, 4, "fake", 16384))
    held: dict[str, tuple[int, ...]] = {}
    for step in range(400):
        before = c.free_summary()
        frozen = (dict(before[0]), before[1])
        if held and rng.random() < 0.45:
            job_id = rng.choice(sorted(held))
            c.release(job_id, held.pop(job_id))
        else:
            gpus = tuple(g for g in rng.sample(range(16), rng.randint(1, 3)) if len(c.gpus[g].jobs) < 2)
            if not gpus:
                continue
            held[f"j{step}"] = gpus
            c.assign(f"j{step}", gpus)
        assert (before[0], before[1]) == frozen  # handed out: unchanged
        fresh = {n: k for n, k in c.free_by_node.items() if k}
        free, total = c.free_summary()
        assert list(free.items()) == list(fresh.items()) and total == sum(fresh.values())
        assert c.shared_gpus == sum(len(g.jobs) > 1 for g in c.gpus)
