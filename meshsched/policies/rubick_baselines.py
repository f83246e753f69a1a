"""The allocators Rubick's paper compares against (Sec. 7.3), as knobs of the same allocator so that only what
the paper says differs does: Sia-like scales GPUs along the data-parallel size of the asked plan only (its
model knows DP; ZeRO/GC/TP/PP stay as asked), with CPUs as asked and no guarantees; Synergy-like keeps the
asked GPUs and plan and tunes CPUs and memory to the plan's sensitivity, first come first served with
backfilling and without preemption.

Simplified: Sia's goodput (statistical efficiency) is not modelled -- the batch never changes -- so Sia-like
maximises throughput per GPU the way Rubick does; Synergy-like's CPU sensitivity comes from the same plan model.
"""

from __future__ import annotations

from meshsched.policies.rubick import Knobs
from meshsched.policies.rubick_curves import PlanSpace

SIA = Knobs(PlanSpace.DP, elastic=True, tune_cpus=False, guarantees=False, preempt=True, by_slope=True)
SYNERGY = Knobs(PlanSpace.FIXED, elastic=False, tune_cpus=True, guarantees=False, preempt=False, by_slope=False)
