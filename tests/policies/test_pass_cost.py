"""What a scheduling pass pays for (issue 26 point 9): the same decisions, less work.

- `fewest_nodes` gives the plans it always gave (a reference copy of the former algorithm, a max() per node taken,
  is compared on random maps with ties) and stops once a plan needs more than `most` nodes.
- A non-preemptive pass walks the queue by (id, GPUs): a pass that can start nothing reads no queued job.
"""

from __future__ import annotations

import random

from meshsched import events as ev
from meshsched.engine import Engine
from meshsched.estimate import ProfileEstimator
from meshsched.loaders.profiles import installed_handle
from meshsched.policies.base import ClusterView, Start, Trigger
from meshsched.policies.placement import fewest_nodes
from meshsched.policies.registry import make_policy
from meshsched.state import ClusterState, JobSpec, NodeSpec
from tests.support.fakes import LinearPerf


def reference_fewest_nodes(free: dict[str, int], want: int) -> list[tuple[str, int]] | None:
    """The algorithm as it was (issue 26's 609ef40..09352cf): best fit, else the emptiest node whole, repeated."""
    if want <= 0 or sum(free.values()) < want:
        return None
    left = dict(free)
    chosen: list[tuple[str, int]] = []
    remaining = want
    while remaining:
        best, best_free = None, 1 << 30
        for name, n in left.items():
            if remaining <= n < best_free:
                best, best_free = name, n
        if best is not None:
            chosen.append((best, remaining))
            return chosen
        name = max(left, key=lambda k: (left[k], k))
        chosen.append((name, left[name]))
        remaining -= left.pop(name)
    return chosen


def test_fewest_nodes_gives_the_former_plans_and_stops_past_the_node_limit():
    rng = random.Random(26)
    for _ in range(3000):
        names = [f"n{rng.randint(0, 20):02d}" for _ in range(rng.randint(0, 10))]
        free = {n: rng.choice((0, 1, 2, 3, 4, 8, 8, 8)) for n in names}  # zeros and ties in count
        want = rng.randint(-1, 40)
        before = dict(free)
        plan = reference_fewest_nodes(free, want)
        assert fewest_nodes(free, want) == plan, (free, want)
        most = rng.randint(1, 5)
        assert fewest_nodes(free, want, most) == (None if plan is None or len(plan) > most else plan), (free, want)
        assert free == before
    assert fewest_nodes({"a": 4, "b": 2, "c": 3}, 9, most=2) is None
    assert fewest_nodes({"a": 4, "b": 2, "c": 3}, 9, most=3) == [("a", 4), ("c", 3), ("b", 2)]


class CountingView(ClusterView):
    """The engine's view, counting the queued jobs a policy reads."""

    __slots__ = ("read",)

    def queue(self):
        for job in super().queue():
            self.read.append(job.job_id)
            yield job

    def job(self, job_id):
        self.read.append(job_id)
        return super().job(job_id)


def engine_with_queue(policy: str, gpus: int, queued: list[int]) -> Engine:
    eng = Engine(make_policy(policy, installed_handle()), ProfileEstimator(LinearPerf()), ClusterState())
    eng.handle(ev.NodeJoined("join", NodeSpec("n0", gpus, "fake", 16384)), 0.0)
    for i, g in enumerate([gpus, *queued]):  # the first takes every GPU
        eng.handle(ev.JobSubmitted(f"s{i}", JobSpec(f"j{i}", g, "m", 100 * g, 1000, submit_time=float(i))), float(i))
    return eng


def counting_view(eng: Engine) -> CountingView:
    w = eng.waiting
    v = CountingView(eng.state, w.entries, eng.active, w.sizes, None, None, None, w.needs, w.keys)
    v.read = []
    return v


def test_a_pass_that_can_start_nothing_reads_no_queued_job():
    for policy in ("sjf", "fifo"):
        eng = engine_with_queue(policy, 4, [2, 1, 3, 2, 1, 4] * 20)
        assert len(eng.waiting) == 120
        view = counting_view(eng)
        assert eng.policy.schedule(view, 200.0, Trigger.RELEASE) == []
        assert view.read == [], policy


def test_a_pass_reads_only_the_jobs_it_tries():
    eng = engine_with_queue("sjf", 4, [3, 3, 1, 2, 2, 1, 4])  # equal durations: SJF keeps arrival order
    eng.state.release("j0", eng.active["j0"].gpus)  # 4 GPUs free in this view (the engine is not asked again)
    view = counting_view(eng)
    out = eng.policy.schedule(view, 20.0, Trigger.RELEASE)
    assert [(type(d), d.job_id) for d in out] == [(Start, "j1"), (Start, "j3")]
    # j2 asks 3 of the 1 left: not read; j3 takes the last GPU: nothing queued fits in none, the walk ends
    assert view.read == ["j1", "j3"]


def test_one_node_compact_is_best_fit_in_node_order():
    """`Planner.compact` for a job that fits one node picks what `fewest_nodes` picks:
    the first node, in the map's order, of the fewest free GPUs that still hold it (ties by order, not name), and
    None where no node holds it."""
    from meshsched.policies.placement import Planner

    state = ClusterState()
    for name in ("n3", "n1", "n2", "n0"):
        state.add_node(NodeSpec(name, 8, "v100", 16000))
    plan = Planner(state)
    rng = random.Random(3)
    for _ in range(2000):
        names = rng.sample(["n0", "n1", "n2", "n3", "n4", "n5"], rng.randint(0, 6))
        free = {n: rng.randint(0, 8) for n in names}
        want = rng.randint(1, 8)
        got = fewest_nodes(free, want)
        assert plan.compact(free, want) == (got if got is not None and len(got) == 1 else None), (free, want)


def test_take_places_what_compact_places():
    """`Planner.take` rules a count out before looking for a place (no node has that many free, or the fewest nodes
    that could hold it have too few between them) only where `compact` finds none: on random clusters, each of a
    pass's takes places what `compact` places on the GPUs the pass has left, node by node."""
    from meshsched.policies.placement import Planner

    rng = random.Random(5)
    for _ in range(400):
        state = ClusterState()
        for i in range(rng.randint(1, 6)):
            state.add_node(NodeSpec(f"n{i}", 8, "v100", 16000))
        gpus = list(range(len(state.gpus)))
        for k, g in enumerate(rng.sample(gpus, rng.randint(0, len(gpus)))):
            state.assign(f"busy{k}", (g,))
        plan = Planner(state)
        for _ in range(6):
            want = rng.randint(1, 20)
            expected = plan.compact(plan.free_map(), want)
            got = plan.take(want)
            assert (got is None) == (expected is None), (state.free_by_node, want)
            if got is not None:
                on = {}
                for g in got:
                    on[state.gpus[g].node] = on.get(state.gpus[g].node, 0) + 1
                assert sorted(on.items()) == sorted(expected), (state.free_by_node, want)


def test_pausing_by_node_follows_the_state():
    """`ClusterView.pausing_by_node`, kept between state versions unless a job the change log names begins or ends a
    pause, equals a fresh count (nodes in start order) after every event of a preemptive replay."""
    from meshsched.loaders.profiles import load_perf_model
    from meshsched.sim.loop import ClusterSpec, simulate
    from meshsched.state import JobState

    perf = load_perf_model()
    rng = random.Random(21)
    t, jobs = 0.0, []
    for i in range(160):
        t += rng.expovariate(1 / 30)
        gpus = rng.choice((1, 1, 2, 4, 8, 12))
        jobs.append(JobSpec(f"p{i}", gpus, rng.choice(("resnet18", "resnet50", "lm")), 32 * gpus,
                            rng.choice((50, 200, 3000, 20000)), submit_time=round(t, 3)))
    seen = [0]

    def check(eng: Engine) -> None:
        want: dict[str, int] = {}
        for j in eng.active.values():
            if j.state is JobState.PAUSING:
                for g in j.gpus:
                    node = eng.state.gpus[g].node
                    want[node] = want.get(node, 0) + 1
        assert list(eng.view().pausing_by_node().items()) == list(want.items())
        seen[0] += bool(want)

    simulate(jobs, make_policy("srtf", installed_handle()), perf, ClusterSpec(3, 8, "v100", perf.gpu_memory_mb("v100")),
             after_event=check)
    assert seen[0] > 0  # the replay preempts: pauses were counted
