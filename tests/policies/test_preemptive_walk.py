"""What SRTF's preemptive pass leaves out (issue 26, round 14) decides nothing differently:

- a count that found no room in the free and pausing GPUs is not looked for again until an eviction adds to them
  (`_pass`'s third `Unplaced`), and with no pausing GPUs a job whose own start failed is not looked for there at all;
- victims' GPUs are added to the pool node by node (`_per_node`), not GPU by GPU;
- a stack whose pass is a QueueScheduler's, SRTF's preemptive one included, is not asked for a timer after each
  event (`greedy.never_times`: only LAS, a period or another layer asks for one).

Each replay below is compared with one that does the work left out."""

from __future__ import annotations

from meshsched.policies import placement as placement_mod
from meshsched.policies.queue import QueueScheduler, _per_node
from meshsched.policies.registry import make_policy
from meshsched.sim.loop import simulate
from meshsched.sim.rules import SimRules
from tests.support.sim import perf_model, philly, v100


class _Foreign(QueueScheduler):
    """The same scheduler under another class: its pass cannot tell its `try_start` is its own (`take`)."""


def _run(policy: str, rules: SimRules, full: bool, monkeypatch, compacts: list[int]):
    stack = make_policy(policy)
    with monkeypatch.context() as m:
        if full:
            stack.placement.__class__ = _Foreign
            m.setattr(placement_mod.Unplaced, "failed", lambda self, need: None)  # nothing ever ruled out
        original = placement_mod.Planner.compact

        def counted(self, free, want, top=None):
            compacts.append(want)
            return original(self, free, want, top)

        m.setattr(placement_mod.Planner, "compact", counted)
        r = simulate(philly(500).jobs, stack, perf_model(), v100(4), rules=rules)
    jobs = r.engine.state.jobs
    return r.events, [(jid, j.state, j.acct.preemptions, j.acct.first_start, j.since, j.gpus)
                      for jid, j in sorted(jobs.items())], [(e.time, e.job_id, e.message) for e in r.engine.log]


def test_srtf_decides_as_a_pass_that_rules_nothing_out(monkeypatch):
    # an evicted job's checkpoint takes a while (the profile's pause time): its GPUs are pausing across passes
    rules = SimRules()
    lean_compacts, full_compacts = [], []
    lean = _run("srtf", rules, False, monkeypatch, lean_compacts)
    full = _run("srtf", rules, True, monkeypatch, full_compacts)
    assert sum(1 for _, state, pre, *_ in lean[1] if pre) > 20  # the replay does preempt
    assert lean == full
    assert len(lean_compacts) < len(full_compacts)  # and the lean pass did leave searches out


def test_per_node_counts_each_node_once_in_first_seen_order():
    assert _per_node(["b", "a", "b", "b", "c", "a"]) == (("b", 3), ("a", 2), ("c", 1))
    assert _per_node(["n0"] * 8) == (("n0", 8),)
    assert _per_node([]) == ()


def test_stacks_whose_pass_is_a_queue_schedulers_ask_for_no_timer():
    from meshsched.greedy import never_times
    from meshsched.loaders.profiles import installed_handle

    handle = installed_handle()
    for name in ("sjf", "fifo", "sjf-strict", "srtf", "castor+srtf"):
        assert never_times(make_policy(name, handle)), name
    for name in ("las", "srtf@360", "lazer", "castor", "castor+lazer"):  # LAS demotes, a period ticks, Lazer defers
        assert not never_times(make_policy(name, handle)), name


def test_srtf_replays_alike_without_asking_for_timers(monkeypatch):
    import meshsched.engine as engine_mod
    import meshsched.greedy as greedy_mod

    def replay(asks: list[int]):
        original = QueueScheduler.next_timer

        def counted(self, view, now):
            asks.append(1)
            return original(self, view, now)

        with monkeypatch.context() as m:
            m.setattr(QueueScheduler, "next_timer", counted)
            m.setattr(greedy_mod, "_TIMER", (greedy_mod._TIMER[0], counted))  # (counted, yet the stock one)
            r = simulate(philly(300).jobs, make_policy("srtf"), perf_model(), v100(2))
        return r.events, [(e.time, e.job_id, e.message) for e in r.engine.log]

    skipped, asked = [], []
    lean = replay(skipped)
    with monkeypatch.context() as m:
        m.setattr(engine_mod, "never_times", lambda policy: False)  # every event asks the stack for its timer
        full = replay(asked)
    assert lean == full
    assert not skipped and len(asked) >= lean[0]
