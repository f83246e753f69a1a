"""Castor over a preemption layer that evicts longer jobs for a shorter one (srtf, lazer): the other way to start now.

Theorem 1 (castor.txt) weighs sharing now against B running "after A"; Castor's wait alternative is the
earliest any GPUs are forecast free (`Forecast`). Under SRTF-style preemption neither is what B would get: the
layer below evicts running jobs with a longer remaining time until their GPUs make room, and B starts at once,
alone, after they pause and it loads. On Sia's Helios-Saturn workload, Castor paired 6-GPU cifar10 jobs of 5 min
with yolov3 jobs of 9 h because the forecast wait was 9 h; shared, at a sub-batch with accumulation, they took
up to 36 min, where SRTF started them within 10 s by preempting a yolov3 job for their 5 min (issue 26).

The comparison counts what each way adds to the sum of JCTs, as Theorem 1's pair mean does:
* sharing: B's shared completion D (its slowest partner's pace) plus each partner's delay, (1 - 1/xi_A) of the
  time it overlaps B (min(D, A's shared end)): A runs xi_A slower for that long;
* preempting: B's completion T = the victims' longest pause + B's load + B's solo run, plus each victim's delay,
  T + its own load (it stops now and resumes when B's GPUs come free).
The victims are chosen as the layer chooses them (`lazer_room.room_with_partners`: strictly longer remaining
time, longest first, until they and the free GPUs make a compact spot). Pure arithmetic over the view.

Under such a layer the same sum also checks Castor's per-pair test against waiting (forecast start + solo run):
the pair arithmetic weighs B's gain against one partner's slowdown, but a multi-GPU B slows every partner and
goes at the slowest one's pace (there: imagenet-23, 46 h left, shared beside three yolov3 jobs for 12 h at
2.4x its solo step).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshsched.perf.errors import UnknownProfile
from meshsched.policies.lazer_room import room_with_partners
from meshsched.state import Job, JobState


@dataclass(frozen=True, slots=True)
class Preemption:
    """Starting B now by preempting `victims`: B's completion from now and the JCT it adds in all."""

    victims: tuple[Job, ...]
    jct: float  # B's completion from now: the victims' longest pause, B's load, B's solo run
    cost: float  # jct plus each victim's delay (jct + its own load)


def victims_for(view, cycle, job: Job, order, now: float) -> tuple[Job, ...]:
    """The running jobs the preemption layer would evict to start `job` now (its `order`: strictly longer remaining
    time, longest first, until they and the free GPUs make a compact spot); () when no such set exists."""
    prio = order.priority(job, now)
    plan = cycle.plan
    spot, chosen = room_with_partners(view, plan, plan.free_map(), job.spec.gpus, prio, cycle.worst_first(order),
                                      set())
    if spot is None:
        return ()
    on_spot = {node for node, _ in spot}
    gpus = view.cluster_state().gpus
    ids = {v.job_id for v in chosen}  # a victim whose every GPU keeps another job frees nothing: not one
    return tuple(v for v in chosen if any(gpus[g].node in on_spot and ids.issuperset(gpus[g].jobs) for g in v.gpus))


def preemption(view, cycle, job: Job, order, perf, now: float, solo_s: float) -> Preemption | None:
    """Preempting for `job` (solo run `solo_s` seconds) in `cycle`'s pass, or None when the layer could not make room
    by it."""
    victims = victims_for(view, cycle, job, order, now)
    if not victims:
        return None
    pause = max(0.0 if v.state is JobState.LOADING else overhead(perf, "pause_time", v.spec.model) for v in victims)
    jct = pause + overhead(perf, "load_time", job.spec.model) + solo_s
    return Preemption(victims, jct, jct + sum(jct + overhead(perf, "load_time", v.spec.model) for v in victims))


def sharing_cost(shared: list[tuple[float, float, float, float]]) -> tuple[float, float]:
    """(B's shared completion D, D plus the partners' delays) from (A's solo step, A's remaining iterations, xi_A,
    B's completion beside A) per partner: B goes at its slowest partner's pace; A loses (1 - 1/xi_A) of the time
    it overlaps B."""
    d = max(sb for _, _, _, sb in shared)
    return d, d + sum((1.0 - 1.0 / xa) * min(d, ta * xa * ia) for ta, ia, xa, _ in shared if xa > 0)


def overhead(perf, what: str, model: str) -> float:
    """A model's load or pause seconds (0 for a model without measured overheads)."""
    try:
        return float(getattr(perf, what)(model))
    except (KeyError, UnknownProfile, AttributeError):
        return 0.0
