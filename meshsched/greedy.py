"""When the engine may leave out a greedy stack's pass (at an arrival, or after GPUs came free): it starts nothing.

A greedy stack is a QueueScheduler alone (fifo, sjf, srtf, las, ... non-preemptive, backfilling, run on every
event, no other layer): its pass only starts queued jobs on free GPUs, in queue order, while they fit (one node,
best fit, for a job that fits one node; else the fewest nodes). After such a pass no queued job can start. Until
GPUs come free or a job joins the queue other than by arriving, every later pass would find the same jobs unable
to start on the same free GPUs, so an arrival's pass could start only the newcomer: when the newcomer cannot fit
either, the pass decides nothing and the engine leaves it out (`Engine._starts_nothing`; a full replay makes
about one pass per arrival and release, so this is most arrivals of a busy cluster); when it may fit, the pass is
told (`ClusterView.settled`) and tries the newcomer alone (`QueueScheduler._start_arrived`). Likewise a pass
after GPUs came free, when no queued GPU count can be placed on the free GPUs (`none_can_start`), decides nothing
and is left out (`Engine._releases_nothing`). Pure functions.
"""

from __future__ import annotations

from meshsched.policies.queue import LeastAttained, QueueScheduler
from meshsched.policies.stack import PolicyStack
from meshsched.state import ClusterState

_STOCK = (PolicyStack.schedule, QueueScheduler.place)  # the passes this module reasons about
_TIMER = (PolicyStack.next_timer, QueueScheduler.next_timer)  # and the timers


def stock_pass(policy: object) -> bool:
    """Whether a greedy stack's pass is still the stock one (a pass wrapped or patched, as tests do, may decide
    anything: its arrival passes all run). Asked at each arrival: a patch may come after the stack was judged."""
    return (type(policy).schedule, type(policy.placement).place) == _STOCK


def is_greedy(policy: object) -> bool:
    """Whether `policy` is a greedy stack (above)."""
    q = getattr(policy, "placement", None)
    return type(policy) is PolicyStack and policy.preemption is None and policy.plan is None and \
        policy.calibration is None and type(q) is QueueScheduler and not q.preemptive and not q.strict and \
        q.interval is None


def never_times(policy: object) -> bool:
    """Whether a stack never asks for a timer: its pass is a QueueScheduler's (the placement alone, or a preemptive
    one over it as in SRTF; greedy or not), run on every event, whose order is not Tiresias' LAS
    (PolicyStack.next_timer asks that scheduler; QueueScheduler.next_timer: only LAS asks)."""
    if type(policy) is not PolicyStack or policy.plan is not None or policy.calibration is not None:
        return False
    q = policy.preemption if policy.preemption is not None else policy.placement
    return type(q) is QueueScheduler and q.interval is None and not isinstance(q.order, LeastAttained) and \
        type(policy).next_timer is _TIMER[0] and type(q).next_timer is _TIMER[1]


def none_can_start(state: ClusterState, needs) -> bool:
    """Whether no job of any of the GPU counts `needs` can be placed on the free GPUs now (QueueScheduler.try_start
    fails): exact for a count one node can hold (no node has that many free); a larger one is ruled out over the
    free total or where as few nodes as it needs cannot hold it (`Planner.compact`'s first test), else it may fit."""
    free, total = state.free_summary()
    if not free:
        return True
    top, largest = max(free.values()), state.largest_node
    for need in needs:  # (top <= largest: a count up to top fits one node)
        if need <= top or (largest < need <= total and -(-need // largest) * top >= need):
            return False
    return True
