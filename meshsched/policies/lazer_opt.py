"""Lazer's deferral predictor (Lazer section 4.2): Bayesian optimisation of how long to defer a preemption.

When a new job j_new could preempt the jobs J_r (Algorithm 2), Lazer defers the preemption by X seconds,
X in [0, 100]. The context of the decision is Eq. 5:

    c = (mean inter-arrival time over the past hour, remaining time of j_new, load time of j_new,
         largest pause-and-save time among J_r)                                      -> DeferralContext

and the objective (Eq. 4), minimised, is f(X | c) = |X - F| with F the *ideal deferral*, known only after the
fact (see `ideal_deferral`): "deferred only by enough to avoid loading a job that would otherwise be preempted
shortly after" (section 4.2). Eq. 2 says when j_new's load is thrown away: a job with a shorter remaining time
than j_new arrives D seconds after j_new with p < D <= p + l (p = the largest pause time of J_r, l = j_new's
load time). A deferral by X shifts that load window to (X + p, X + p + l]; a shorter job arriving before it,
while the preemption is deferred (its candidates are held in the deferred-run queue) or while J_r pause, takes
nothing from j_new. So F is the smallest X >= 0 whose window holds none of the shorter arrivals: 0 when none
comes in (p, p + l]; otherwise D - p for the first arrival D that no other shorter arrival follows within l
(each arrival inside the current window pushes the window past it). F is capped at the upper bound h = 100 s:
when arrivals are so dense that no deferral within [0, h] avoids them, h is the closest. (Until this version
F was the first such D alone, counting arrivals during the pause too: X = F then moved j_new's load onto the
next shorter arrival, and in a busy cluster F was small, so the optimiser learned X = 0.) A deferral longer
than F costs |X - F| of waiting; one shorter than a positive F lets the load be wasted: the objective charges
both. Because F is random given c (arrivals are), the GP's mean of |X - F| is lowest at the conditional median
of F: that is the X the exploitation stage returns.

The three stages of the paper:
  bootstrap     the first M = 10 suggestions come from a seeded Latin hypercube over [0, 100] (one point in
                each tenth, in random order); no model exists yet. If more suggestions are asked for before
                the first model is installed, further seeded Latin-hypercube blocks follow.
  acquisition   a GP over (X, c) (inputs: X and log1p of each context variable, normalised to the unit cube
                by the observed range; outcome standardised): BoTorch's default SingleTaskGP (RBF kernel
                with one lengthscale per input, its priors, its noise level learned by the marginal
                likelihood, at least 1e-4), fitted and evaluated in numpy by `lazer_gp.GridGP` (the same
                hyper-parameters and posterior as BoTorch's to float tolerance, tested; a fit takes tens of
                ms where fit_gpytorch_mll took ~0.5 s, and no jitter is ever needed). X maximises the
                closed-form expected improvement of the posterior below the incumbent (the lowest posterior
                mean at the observed inputs: the noisy incumbent; until issue 26 LogNoisyExpectedImprovement,
                whose noiseless fantasy models printed "A not p.d., added jitter"). The paper maximises EI
                with L-BFGS from 5 random starts; here EI is evaluated on a grid of X (101 points: whole
                seconds, 0 included, the resolution of the paper's grid-search baseline) in one kernel
                matrix: in one dimension as good, deterministic, and cheap (~0.1-0.3 ms CPU).
  exploitation  once the installed model has been updated with at least 100 observations AND the EI of the
                X chosen by the acquisition is under 10 %, the stage switches, for good, to returning the X
                that minimises the GP's posterior mean on the same grid; observations are then ignored (the
                paper stops updating the GP). "EI under 10 %" is precise: the expected improvement of the
                chosen X, in seconds, is below 10 % of the standard deviation of the observed objective
                values (the scale the outcome was standardised by), i.e. below 0.1 in the GP's outcome units.

Amortised and off the event loop: a model is fitted first when M observations exist, then again after every
`refit_every` new observations; between fits suggestions use the last installed model. The expensive part is
a pure function, `fit_model(FitRequest) -> FittedModel`, of a frozen snapshot of the observations, so meshd
can run it in an executor while `suggest` goes on with the installed model, then `install` the result.

Determinism: the same config (seed included), the same sequence of suggest/observe/install calls and the
same observations give bit-identical suggestions, on the same machine with the same library versions (tested:
two replays; a FittedModel pickled to another process and back). `fit_model` draws no random numbers (L-BFGS-B
from a fixed start), nor does `suggest`; a fit in a thread or a process gives the same model.

Pure: no I/O, no clock, no threads. scipy is imported inside the functions that need it, and torch/botorch not
at all, so importing this module is fast.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

LOW_S = 0.0  # Lazer section 4.2: l = 0 allows immediate preemption
HIGH_S = 100.0  # ... h = 100 s


@dataclass(frozen=True, slots=True)
class DeferralContext:
    """c of Lazer Eq. 5, all in seconds."""

    mean_interarrival_s: float  # mean inter-arrival time over the past hour (`mean_interarrival`)
    remaining_s: float  # j_new's remaining (estimated) duration
    load_s: float  # j_new's load time
    max_pause_s: float  # the largest pause-and-save time among the jobs to preempt

    def __post_init__(self) -> None:
        for name in ("mean_interarrival_s", "remaining_s", "load_s", "max_pause_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0.0):
                raise ValueError(f"DeferralContext.{name} must be finite and >= 0, got {v!r}")

    def features(self) -> tuple[float, float, float, float]:
        """What the GP sees: log1p of each variable (they span seconds to weeks)."""
        return (
            math.log1p(self.mean_interarrival_s),
            math.log1p(self.remaining_s),
            math.log1p(self.load_s),
            math.log1p(self.max_pause_s),
        )


def mean_interarrival(arrivals: Sequence[float], now: float, window_s: float = 3600.0) -> float:
    """Mean inter-arrival time over the window before `now`: window / (arrivals in (now - window, now]),
    the window itself when there were none. (Counting arrivals rather than averaging the gaps between the
    first and last one does not break down with one or two arrivals.)"""
    n = sum(1 for t in arrivals if now - window_s < t <= now)
    return window_s / max(n, 1)


def ideal_step(candidate: float, delay_s: float, max_pause_s: float, load_s: float) -> float:
    """One step of F: `candidate` is the smallest deferral whose load window (candidate + p, candidate + p + l]
    holds none of the shorter arrivals seen so far; a shorter job arriving `delay_s` after the decision inside
    that window pushes it past itself (candidate = delay - p). Arrivals must come in time order."""
    if delay_s < 0.0:
        raise ValueError(f"the shorter job arrived before the decision ({delay_s} s)")
    if candidate + max_pause_s < delay_s <= candidate + max_pause_s + load_s:
        return delay_s - max_pause_s
    return candidate


def ideal_deferral(
    shorter_arrivals_after_s: Sequence[float], max_pause_s: float, load_s: float, high_s: float = HIGH_S
) -> float:
    """F of Lazer Eq. 4, in hindsight (see the module docstring), from the delays after the decision at which
    jobs with a shorter remaining time than j_new arrived (all of them up to F + p + l): the smallest deferral
    whose load window (F + p, F + p + l] holds none of them, capped at `high_s`. Known at t0 + F + p + l
    whatever X was, or as soon as the candidate passes `high_s`: observe then."""
    f = 0.0
    for d in sorted(shorter_arrivals_after_s):
        if d > f + max_pause_s + load_s:
            break  # the window of f passed with no shorter arrival in it
        f = ideal_step(f, d, max_pause_s, load_s)
        if f > high_s:
            return high_s
    return f


def objective(x: float, ideal: float) -> float:
    """f(X | c) = |X - F| (Lazer Eq. 4)."""
    return abs(x - ideal)


def latin_hypercube(n: int, low: float, high: float, seed: int | tuple[int, ...]) -> tuple[float, ...]:
    """n points in [low, high]: one uniformly drawn in each of n equal intervals, in a seeded random order."""
    rng = np.random.default_rng(seed)
    strata = rng.permutation(n)
    offsets = rng.random(n)
    width = (high - low) / n
    return tuple(float(low + (s + u) * width) for s, u in zip(strata, offsets, strict=True))


class Stage(enum.Enum):
    BOOTSTRAP = "bootstrap"
    ACQUISITION = "acquisition"
    EXPLOITATION = "exploitation"


@dataclass(frozen=True, slots=True)
class OptimizerConfig:
    seed: int = 0
    low_s: float = LOW_S
    high_s: float = HIGH_S
    bootstrap: int = 10  # M, Latin-hypercube points before the first model (Lazer footnote 2)
    min_updates: int = 100  # acquisition lasts at least this many GP updates (observations in the model) ...
    ei_stop: float = 0.10  # ... and until the chosen X's EI is below this fraction of the objective's std
    refit_every: int = 5  # k: refit after this many new observations (the paper refits after each, k = 1)
    grid_points: int = 101  # X grid for the acquisition and the exploitation (whole seconds on [0, 100])
    num_fantasies: int = 20  # unused since the closed-form EI (issue 26); kept for configs that name it

    def __post_init__(self) -> None:
        if not (self.low_s < self.high_s):
            raise ValueError(f"need low_s < high_s, got {self.low_s}, {self.high_s}")
        if self.bootstrap < 2 or self.refit_every < 1 or self.grid_points < 2 or self.num_fantasies < 1:
            raise ValueError("need bootstrap >= 2, refit_every >= 1, grid_points >= 2, num_fantasies >= 1")


@dataclass(frozen=True, slots=True)
class Observation:
    context: DeferralContext
    x: float  # the deferral that was used
    f: float  # the objective observed for it, |x - F|


@dataclass(frozen=True, slots=True)
class Suggestion:
    x: float
    stage: Stage
    ei_ratio: float | None = None  # acquisition: the chosen X's EI / std of the observed objective


@dataclass(frozen=True, slots=True)
class OptimizerState:
    """Everything a DeferralOptimizer remembers, for engine state / a journal: the model itself is a pure
    function of the first `fitted_observations` observations, so `DeferralOptimizer.restore` refits it."""

    observations: tuple[Observation, ...]
    fitted_observations: int  # 0: no model installed
    bootstrap_issued: int
    exploiting: bool


@dataclass(frozen=True, slots=True)
class FitRequest:
    """A frozen snapshot of what a fit needs: hand it to `fit_model`, in an executor if you like."""

    config: OptimizerConfig
    observations: tuple[Observation, ...]


@dataclass(frozen=True, eq=False)
class FittedModel:
    """A fitted GP (`lazer_gp.GridGP`: numpy arrays) and what its acquisition needs; safe to share (read-only)."""

    n_observations: int
    model: Any  # lazer_gp.GridGP: the GP with its learned noise, posterior pieces cached
    acquisition: Any  # the incumbent best_f (seconds): the lowest posterior mean at the observed inputs
    y_std: float  # the standardisation scale of the objective (seconds)
    grid: Any = field(repr=False)  # (grid_points,) numpy array of X values

    def _inputs(self, context: DeferralContext) -> np.ndarray:
        out = np.empty((self.grid.shape[0], 5))
        out[:, 0] = self.grid
        out[:, 1:] = context.features()
        return out

    def best_ei(self, context: DeferralContext) -> tuple[float, float]:
        """(X with the highest expected improvement on the grid, that EI / y_std): the closed-form EI of the
        GP's posterior below the incumbent (`acquisition`), one kernel matrix per decision."""
        from meshsched.policies.lazer_gp import log_ei_minimising

        mean, var = self.model.posterior(self._inputs(context))
        log_ei = log_ei_minimising(mean, np.sqrt(var), float(self.acquisition))
        i = int(np.argmax(log_ei))
        return float(self.grid[i]), math.exp(float(log_ei[i])) / self.y_std

    def mean_argmin(self, context: DeferralContext) -> float:
        """X with the lowest posterior mean of f(X | c) on the grid."""
        mean, _ = self.model.posterior(self._inputs(context), variance=False)
        return float(self.grid[int(np.argmin(mean))])


def fit_model(request: FitRequest) -> FittedModel:
    """Fit the GP and find its incumbent: a pure function of `request` (milliseconds to tens of ms of CPU)."""
    from meshsched.policies.lazer_gp import GridGP

    cfg, obs = request.config, request.observations
    if len(obs) < 2:
        raise ValueError(f"a fit needs at least 2 observations, got {len(obs)}")
    train_x = np.array([(o.x, *o.context.features()) for o in obs], dtype=np.float64)
    train_y = np.array([o.f for o in obs], dtype=np.float64)
    lo, hi = train_x.min(axis=0), train_x.max(axis=0)
    lo[0], hi[0] = cfg.low_s, cfg.high_s
    hi = np.where(hi - lo < 1e-9, lo + 1.0, hi)  # a constant context variable: any unit range
    gp = GridGP.fit(train_x, train_y, lo, hi)
    best_f = float(gp.posterior(train_x, variance=False)[0].min())  # the noisy incumbent (minimising)
    grid = np.linspace(cfg.low_s, cfg.high_s, cfg.grid_points)
    return FittedModel(len(obs), gp, best_f, gp.y_std, grid)


class DeferralOptimizer:
    """The deferral predictor's state: observations, the installed model and the stage.

    Typical use (the simulator; meshd runs `fit_model(opt.fit_request())` in an executor instead):

        x = opt.suggest(ctx)             # defer the preemption by x seconds
        ...                              # later, when F is known:
        opt.observe(ctx, x, objective(x, F))
        if opt.needs_fit():
            opt.install(opt.fit())
    """

    def __init__(self, config: OptimizerConfig | None = None) -> None:
        self.config = config or OptimizerConfig()
        self._observations: list[Observation] = []
        self._fitted: FittedModel | None = None
        self._bootstrap_issued = 0
        self._exploiting = False
        self._refit_on = 0  # restored without its model: how many observations that model had

    def state(self) -> OptimizerState:
        fitted = self._fitted
        return OptimizerState(
            tuple(self._observations), self._refit_on if fitted is None else fitted.n_observations,
            self._bootstrap_issued, self._exploiting
        )

    @classmethod
    def restore(cls, config: OptimizerConfig, state: OptimizerState, fit: bool = True) -> DeferralOptimizer:
        """The optimiser `state` was taken from (same config), its model refitted here (synchronously); with
        `fit=False` without a model: `needs_fit` then asks for that model (a fit of the same observations, also
        in the exploitation stage, whose model is frozen) and X comes from the Latin hypercube until it is
        installed."""
        opt = cls(config)
        opt._observations = list(state.observations)
        opt._bootstrap_issued = state.bootstrap_issued
        opt._exploiting = state.exploiting
        if state.fitted_observations and fit:
            opt._fitted = fit_model(FitRequest(config, state.observations[: state.fitted_observations]))
        elif state.fitted_observations:
            opt._refit_on = state.fitted_observations
        return opt

    @property
    def stage(self) -> Stage:
        if self._exploiting:
            return Stage.EXPLOITATION
        return Stage.BOOTSTRAP if self._fitted is None else Stage.ACQUISITION

    @property
    def observations(self) -> tuple[Observation, ...]:
        return tuple(self._observations)

    @property
    def fitted(self) -> FittedModel | None:
        return self._fitted

    def suggest(self, context: DeferralContext) -> float:
        """The deferral X in [low_s, high_s] for this context (cheap: uses the installed model)."""
        return self.decide(context).x

    def decide(self, context: DeferralContext) -> Suggestion:
        """`suggest`, with the stage that produced X and the EI it had (for the decision log)."""
        fitted = self._fitted
        if fitted is None:
            cfg = self.config
            block, i = divmod(self._bootstrap_issued, cfg.bootstrap)
            self._bootstrap_issued += 1
            return Suggestion(latin_hypercube(cfg.bootstrap, cfg.low_s, cfg.high_s, (cfg.seed, block))[i], Stage.BOOTSTRAP)
        if self._exploiting:
            return Suggestion(fitted.mean_argmin(context), Stage.EXPLOITATION)
        x, ei_ratio = fitted.best_ei(context)
        if fitted.n_observations >= self.config.min_updates and ei_ratio < self.config.ei_stop:
            self._exploiting = True
            return Suggestion(fitted.mean_argmin(context), Stage.EXPLOITATION, ei_ratio)
        return Suggestion(x, Stage.ACQUISITION, ei_ratio)

    def observe(self, context: DeferralContext, x: float, f: float) -> bool:
        """Record f(x | context); False (ignored) in the exploitation stage, where the GP is no longer updated."""
        if self._exploiting:
            return False
        if not (math.isfinite(x) and math.isfinite(f) and f >= 0.0):
            raise ValueError(f"need finite x and f >= 0, got x={x!r}, f={f!r}")
        self._observations.append(Observation(context, float(x), float(f)))
        return True

    def needs_fit(self) -> bool:
        """True when a (re)fit is due: M observations for the first (or the model a restore left out), then
        `refit_every` new ones until the exploitation stage."""
        n = len(self._observations)
        if self._fitted is None:
            return n >= self.config.bootstrap
        if self._exploiting:
            return False
        return n - self._fitted.n_observations >= self.config.refit_every

    def fit_request(self) -> FitRequest:
        obs = self._observations
        if self._fitted is None and self._refit_on:
            obs = obs[: self._refit_on]  # the model the state had, first
        return FitRequest(self.config, tuple(obs))

    def fit(self) -> FittedModel:
        """`fit_model(self.fit_request())`, synchronously."""
        return fit_model(self.fit_request())

    def install(self, fitted: FittedModel) -> bool:
        """Use `fitted` from now on; False (ignored) if it is older than the installed model."""
        if self._fitted is not None and fitted.n_observations <= self._fitted.n_observations:
            return False
        self._fitted = fitted
        return True
