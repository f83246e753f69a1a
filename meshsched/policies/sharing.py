"""Castor's pair arithmetic as pure functions: Theorem 1 (share now or run after) and Algorithm 2 (sub-batch search).

Notation (castor.txt section 5.1): job A runs, job B is new. t_X is X's step time alone, i_X its remaining
iterations, xi_X = t_X(shared) / t_X(alone) (eq. 14-15), kappa the time B is inserted after now.

Theorem 1: the mean JCT of the pair, as a function of kappa in [0, t_A i_A], is piecewise linear with
slope +1/2 while B would finish first (eq. 16-19) and slope (2 xi_B + xi_A - 2 xi_A xi_B) / (2 xi_B) once A
finishes first (eq. 20-23), so its minimum is at kappa = 0 (start B now, full overlap) or kappa = t_A i_A
(run B after A). `pair_times` evaluates any kappa (the brute-force tests use it); `theorem1` compares
the two ends.

Algorithm 2 searches B's per-GPU sub-batch b in {B, B/2, ..., 1} with gradient accumulation s = B / b (B's
global batch never changes), rejects sub-batches whose memory does not fit next to A, and keeps the sub-batch
with the shortest shared mean JCT. The "run after" alternative uses B's full per-GPU batch (no accumulation):
nothing forces B to accumulate when it runs alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PairOutcome:
    share: bool  # True: start B now (kappa = 0); False: run B after A (kappa = t_A i_A)
    mean_jct: float  # mean of T_A and T_B (from now) under the chosen option
    t_a: float  # A's completion time from now under the chosen option
    t_b: float  # B's completion time from now under the chosen option
    shared_mean: float  # mean JCT if B starts now
    wait_mean: float  # mean JCT if B runs after A


def pair_times(
    t_a: float, i_a: float, xi_a: float, t_b: float, i_b: float, xi_b: float, kappa: float,
    t_b_after: float | None = None,
) -> tuple[float, float]:
    """(T_A, T_B) from now when B is inserted `kappa` seconds from now (0 <= kappa <= t_A i_A).

    A runs alone until kappa, then both run slowed by xi until one finishes; the survivor continues alone.
    `t_b_after`: B's step time alone once A has finished (default t_b; B keeps its sub-batch).
    """
    tb_solo = t_b if t_b_after is None else t_b_after
    kappa = min(max(kappa, 0.0), t_a * i_a)
    left_a = i_a - kappa / t_a
    ha, hb = t_a * xi_a, t_b * xi_b  # shared step times (eq. 14-15)
    if left_a <= 0.0:  # sequential: A is done before B starts
        return t_a * i_a, t_a * i_a + tb_solo * i_b
    if ha * left_a >= hb * i_b:  # B finishes first (case 1, eq. 16-17)
        tb = kappa + hb * i_b
        done_a = i_b * hb / ha
        return tb + t_a * (left_a - done_a), tb
    ta = kappa + ha * left_a  # A finishes first (case 2, eq. 20-21)
    done_b = ha * left_a / hb
    return ta, ta + tb_solo * (i_b - done_b)


def eq23_slope(xi_a: float, xi_b: float) -> float:
    """d(mean JCT)/d(kappa) where A finishes first (eq. 23): positive means start B now."""
    return (2 * xi_b + xi_a - 2 * xi_a * xi_b) / (2 * xi_b)


def theorem1(
    t_a: float, i_a: float, xi_a: float, t_b: float, i_b: float, xi_b: float, t_b_alone: float | None = None
) -> PairOutcome:
    """Share now (kappa = 0) or run B after A (kappa = t_A i_A), whichever gives the lower mean JCT.

    `t_b` is B's step time in the shared configuration (its sub-batch and accumulation) before the xi
    slowdown; `t_b_alone` B's step time if it runs after A on its own (default t_b). Ties go to waiting.
    """
    tb_wait = t_b if t_b_alone is None else t_b_alone
    sa, sb = pair_times(t_a, i_a, xi_a, t_b, i_b, xi_b, 0.0)
    wa, wb = t_a * i_a, t_a * i_a + tb_wait * i_b
    shared, wait = (sa + sb) / 2, (wa + wb) / 2
    if shared < wait:
        return PairOutcome(True, shared, sa, sb, shared, wait)
    return PairOutcome(False, wait, wa, wb, shared, wait)


@dataclass(frozen=True, slots=True)
class BatchChoice:
    share: bool  # Algorithm 2's SF: some sub-batch makes sharing beat waiting
    sub_batch: int  # B's per-GPU micro-batch b
    accumulation: int  # s = B / b: B's per-GPU batch per optimizer step stays B
    xi_a: float
    xi_b: float
    outcome: PairOutcome  # Theorem 1 at the chosen sub-batch


def sub_batches(per_gpu_batch: int) -> list[int]:
    """B, B/2, ..., down to 1, keeping only exact divisors (s = B / b must be an integer)."""
    out, b = [], per_gpu_batch
    while b >= 1:
        if per_gpu_batch % b == 0:
            out.append(b)
        if b == 1:
            break
        b //= 2
    if out[-1] != 1:
        out.append(1)
    return out


def best_sub_batch(
    t_a: float,
    i_a: float,
    i_b: float,
    per_gpu_batch: int,
    step_time: Callable[[int, int], float],
    xi: Callable[[int], tuple[float, float] | None],
    fits: Callable[[int], bool],
) -> BatchChoice | None:
    """Algorithm 2: the best sub-batch of B next to A, or None when no sub-batch fits or is feasible.

    step_time(b, s): B's step time alone with micro-batch b and s accumulation steps.
    xi(b): (xi_A, xi_B) of the pair with B at micro-batch b, None if that colocation is infeasible.
    fits(b): whether B at micro-batch b fits in GPU memory next to A.
    The returned choice may have share=False: waiting beats every feasible sub-batch.
    """
    t_alone = step_time(per_gpu_batch, 1)
    best: BatchChoice | None = None
    for b in sub_batches(per_gpu_batch):
        if not fits(b):
            continue
        x = xi(b)
        if x is None:
            continue
        s = per_gpu_batch // b
        o = theorem1(t_a, i_a, x[0], step_time(b, s), i_b, x[1], t_alone)
        if best is None or o.shared_mean < best.outcome.shared_mean:
            best = BatchChoice(o.share, b, s, x[0], x[1], o)
    return best
