"""Throughput against the MPS active-thread share (Gimbal's LGRR), and a worker's step time under a calibration.

Source: our H100 measurements (`profiles/measured_h100.json`, `docs/gpu-measurements.md` section 2): six jobs
alone under MPS at 100% and at 50% active threads, and six pairs sharing one GPU under MPS at 100%/100% and
50%/50%. Gimbal (gimbal.txt section 2.2, Fig. 2-a, section 5.2) gives only the shape: the benefit of squeezing
a partner is concave in the share, and restricting a heavy job (about 60% in Fig. 2-a) can beat free
competition (200% in total). No number is read off the paper's figures.

The model, with every assumption:

1. Solo curve (one parameter per job, `ShareCurve.saturation` = u, the share the job fills alone):
       throughput(s) / throughput(100%) = min(1, s / u)
   concave, monotone, and flat above u (a job cannot use SMs it has no work for). u is fitted exactly to the
   one measured point: u = 0.5 / min(1, t_100 / t_50) with the MPS-100% alone time as t_100 (not the exclusive
   one: both jobs ran under the same MPS server). A job as fast at 50% as at 100% (lm, 1.01x) gets u = 0.5,
   an upper bound: below 50% it is assumed to slow linearly, which is unmeasured.
2. A job without an anchor uses its family's anchor at the nearest batch (log2 distance), else the median u
   of all anchors (DEFAULT: assumption, not a measurement).
3. Pair interference under shares (xi = step shared / step alone, both at 100%, from the colocation tables):
       I(s_self, s_other) = 1 + (xi - 1) * throughput_other(s_other) * (kappa + (1 - kappa) * overlap)
       overlap = clamp(s_self + s_other - 1, 0, 1)   (MPS partitions can overlap only above 100% in total)
   The partner interferes in proportion to how much work it does (its own curve); when the partitions
   cannot overlap, a residual kappa of the interference remains (memory bandwidth, L2: not SM time). kappa
   is the median over the measured pair sides with xi > 1.05 (below that the effect is inside the 5% run
   noise) of (r_50 - 1) / ((xi - 1) * throughput_other(50%)), r_50 = shared 50/50 step / alone-50% step.
   Sharing never speeds a job up (I >= 1).
4. A worker's step: t = t_alone(samples) / throughput_self(s_self) * I, with t_alone = alpha + beta * samples
   (Castor eq. 1 at full share), i.e. MPS scales the fixed and the per-sample parts alike, and u does not
   move with the worker's sample share under LISS (LISS moves a few samples at a time).
5. A job's step is its slowest worker's plus its all-reduce time (stragglers slow the whole job;
   communication is not overlapped here and not slowed by the share).
6. The curves were measured on an H100 (132 SMs); on a GPU with fewer SMs a job fills more of it, so u there
   is higher and squeezing costs more. `ShareCurve.on_fewer_sms` rescales u by the SM ratio, capped at 1
   (assumption: a job's kernels need the same number of SMs on any GPU).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FULL_SHARE = 1.0
HALF_SHARE = 0.5
NOISE_XI = 1.05  # pair sides below this xi are inside the measurement noise and do not inform kappa


@dataclass(frozen=True, slots=True)
class ShareCurve:
    """A job's throughput against its MPS active-thread share: min(1, share / saturation)."""

    saturation: float  # u in (0, 1]: the share the job fills alone

    def __post_init__(self) -> None:
        if not 0.0 < self.saturation <= 1.0:
            raise ValueError(f"saturation must be in (0, 1], got {self.saturation}")

    def throughput(self, share: float) -> float:
        """Throughput at `share` relative to the throughput at 100%."""
        if not 0.0 < share <= 1.0:
            raise ValueError(f"MPS share must be in (0, 1], got {share}")
        return min(1.0, share / self.saturation)

    def on_fewer_sms(self, sm_ratio: float) -> ShareCurve:
        """This curve on a GPU with `sm_ratio` = SMs measured on / SMs of the target GPU (>= 1)."""
        return ShareCurve(min(1.0, self.saturation * sm_ratio))


@dataclass(frozen=True, slots=True)
class SoloAnchor:
    """One job measured alone under MPS at 100% and at 50% active threads."""

    model: str
    batch: int
    step_full_s: float
    step_half_s: float

    @property
    def curve(self) -> ShareCurve:
        return ShareCurve(HALF_SHARE / min(1.0, self.step_full_s / self.step_half_s))


@dataclass(frozen=True, slots=True)
class PairAnchor:
    """A pair on one GPU: each side's xi at 100%/100% and its ratio r_50 at 50%/50% (vs alone at 50%)."""

    self_key: tuple[str, int]
    other_key: tuple[str, int]
    xi_full: float
    ratio_half: float


@dataclass(frozen=True, slots=True)
class Partner:
    """What a worker's GPU partner does to it: the pair's xi at 100%/100%, the partner's curve and share."""

    xi: float
    curve: ShareCurve
    share: float


@dataclass(frozen=True, slots=True)
class MpsShareModel:
    """Solo curves per (model, batch) and the residual-interference fraction kappa, with the anchors they
    were fitted to."""

    curves: tuple[tuple[tuple[str, int], ShareCurve], ...]
    kappa: float
    default: ShareCurve
    solo: tuple[SoloAnchor, ...] = ()
    pairs: tuple[PairAnchor, ...] = ()

    def curve(self, model: str, batch: int) -> ShareCurve:
        """The measured curve; else the family's at the nearest batch (log2); else the median (`default`)."""
        same = [(abs(math.log2(b) - math.log2(batch)), b, c) for (m, b), c in self.curves if m == model]
        return min(same)[2] if same else self.default

    def interference(self, share_self: float, partner: Partner | None) -> float:
        """I >= 1: the slowdown from the partner on top of the worker's own share curve (assumption 3)."""
        if partner is None:
            return 1.0
        overlap = min(1.0, max(0.0, share_self + partner.share - 1.0))
        pressure = partner.curve.throughput(partner.share) * (self.kappa + (1.0 - self.kappa) * overlap)
        return 1.0 + max(0.0, partner.xi - 1.0) * pressure

    def worker_step_s(
        self, alpha_s: float, beta_s: float, samples: int, curve: ShareCurve, share: float, partner: Partner | None
    ) -> float:
        """Seconds per step of one worker with `samples` local samples at MPS `share` (assumption 4)."""
        if samples < 1:
            raise ValueError(f"a worker needs at least one sample, got {samples}")
        return (alpha_s + beta_s * samples) / curve.throughput(share) * self.interference(share, partner)


def job_step_s(worker_steps: Iterable[float], comm_s: float = 0.0) -> float:
    """A data-parallel job's step: its slowest worker's, plus the all-reduce (assumption 5)."""
    steps = list(worker_steps)
    if not steps:
        raise ValueError("a job has at least one worker")
    return max(steps) + comm_s


def fit_mps_share(solo: Iterable[SoloAnchor], pairs: Iterable[PairAnchor]) -> MpsShareModel:
    """Curves from the solo anchors; kappa = median of the pair sides above the noise (assumption 3)."""
    solo, pairs = tuple(solo), tuple(pairs)
    if not solo:
        raise ValueError("need at least one solo anchor")
    curves = {(a.model, a.batch): a.curve for a in solo}
    kappas = []
    for p in pairs:
        if p.xi_full <= NOISE_XI or p.other_key not in curves:
            continue
        k = (p.ratio_half - 1.0) / ((p.xi_full - 1.0) * curves[p.other_key].throughput(HALF_SHARE))
        kappas.append(min(1.0, max(0.0, k)))
    if not kappas:
        raise ValueError("no pair side above the noise to fit kappa")
    default = ShareCurve(statistics.median(c.saturation for c in curves.values()))
    return MpsShareModel(tuple(sorted(curves.items())), statistics.median(kappas), default, solo, pairs)


def _key(label: str) -> tuple[str, int]:
    model, batch = label.split(":")
    return model, int(batch)


def anchors_from_measurements(doc: Mapping[str, Any]) -> tuple[tuple[SoloAnchor, ...], tuple[PairAnchor, ...]]:
    """The anchors in measured_h100.json (`coloc.mps` at 100%, `coloc.mps50` at 50%; mean step times)."""
    full, half = doc["coloc"]["mps"], doc["coloc"]["mps50"]
    solo = tuple(
        SoloAnchor(*_key(k), float(full["alone"][k]["mean_step_s"]), float(half["alone"][k]["mean_step_s"]))
        for k in sorted(full["alone"])
        if k in half["alone"]
    )
    alone_full = {_key(k): float(v["mean_step_s"]) for k, v in full["alone"].items()}
    alone_half = {_key(k): float(v["mean_step_s"]) for k, v in half["alone"].items()}
    by_pair = {(tuple(p["a"]), tuple(p["b"])): p for p in full["pairs"]}
    pairs = []
    for p in half["pairs"]:
        q = by_pair.get((tuple(p["a"]), tuple(p["b"])))
        if q is None:
            continue
        for me, other in (("a", "b"), ("b", "a")):
            km, ko = (p[me][0], int(p[me][1])), (p[other][0], int(p[other][1]))
            pairs.append(
                PairAnchor(
                    km,
                    ko,
                    float(q[f"shared_{me}"]["mean_step_s"]) / alone_full[km],
                    float(p[f"shared_{me}"]["mean_step_s"]) / alone_half[km],
                )
            )
    return solo, tuple(pairs)
