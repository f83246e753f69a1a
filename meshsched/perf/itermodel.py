"""The iteration-time model (Castor eq. 1-3, Pollux's all-reduce form), in pure Python.

t_comp(b)  = alpha_comp + beta_comp * b                                     (Castor eq. 1)
t_comm(P)  = 0 for one GPU; alpha_local + beta_local * (K - 2) on one node;
             alpha_inter + beta_inter * (K - 2) across nodes               (Pollux's form of Castor eq. 2)
t_iter     = (s - 1) * t_comp(b/s) + (t_comp(b/s)^delta + t_comm^delta)^(1/delta)   (Castor eq. 3)

b is the per-GPU batch of one optimizer step, s the gradient-accumulation steps, K the GPU count.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IterParams:
    """Fitted parameters of one (model, GPU type); comm parameters are None when only one GPU was measured."""

    alpha_comp: float
    beta_comp: float
    alpha_local: float | None = None
    beta_local: float | None = None
    alpha_inter: float | None = None
    beta_inter: float | None = None
    delta: float = 1.0

    @property
    def multi_gpu(self) -> bool:
        return self.alpha_local is not None


def comp_time(p: IterParams, batch: float) -> float:
    return p.alpha_comp + p.beta_comp * batch


def comm_time(p: IterParams, gpus: int, nodes: int) -> float:
    """All-reduce time for `gpus` GPUs on `nodes` nodes (0 for one GPU). Requires multi-GPU parameters."""
    if gpus <= 1:
        return 0.0
    if nodes <= 1:
        return p.alpha_local + p.beta_local * (gpus - 2)  # type: ignore[operator]
    return p.alpha_inter + p.beta_inter * (gpus - 2)  # type: ignore[operator]


def iter_time(p: IterParams, gpus: int, nodes: int, per_gpu_batch: float, accumulation: int = 1) -> float:
    """Seconds per optimizer step (Castor eq. 3)."""
    tc = comp_time(p, per_gpu_batch / accumulation)
    tm = comm_time(p, gpus, nodes)
    if tm <= 0.0:
        overlapped = tc
    else:  # the delta-norm of (tc, tm), scaled by the larger term so that large delta cannot overflow
        d = p.delta
        top = tc if tc >= tm else tm
        overlapped = top * ((tc / top) ** d + (tm / top) ** d) ** (1.0 / d)
    return (accumulation - 1) * tc + overlapped
