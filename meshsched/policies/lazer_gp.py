"""The GP behind Lazer's deferral predictor, in numpy: the model BoTorch's SingleTaskGP builds by default
(botorch 0.18: constant mean, RBF kernel with one lengthscale per input and no outputscale, the lengthscales'
LogNormal(sqrt 2 + log(d) / 2, sqrt 3) prior and lower bound 0.025, a homoskedastic noise with a
LogNormal(-4, 1) prior and lower bound 1e-4; inputs normalised to the unit cube, the outcome standardised),
fitted by the same objective (the exact marginal log likelihood plus the priors' log densities, over n) with
scipy's L-BFGS-B and analytic gradients, without GPyTorch's per-call machinery.

Why not GPyTorch (issue 26, point 2): a replay spent most of its time in `fit_gpytorch_mll` (each closure call
~8 ms at a few dozen points, most of it generic bookkeeping) and in importing botorch; its noiseless fantasy
models for LogNoisyExpectedImprovement printed `NumericalWarning: A not p.d., added jitter`. Here the noise is
at least 1e-4 of the standardised outcome's variance (the kernel's diagonal is 1), so K + noise I is positive
definite by construction and its Cholesky needs no jitter; a posterior on the decision grid is one kernel
matrix (grid x n) and two small products from the cached Cholesky factor and K^-1 (y - c).
tests/policies/test_lazer_gp.py checks the posterior against GPyTorch's for the same hyper-parameters.

Pure: numpy and scipy only, no I/O, no clock; deterministic (a fixed start, no random restarts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MIN_NOISE = 1e-4  # botorch's MIN_INFERRED_NOISE_LEVEL, on the standardised outcome
MIN_LENGTHSCALE = 2.5e-2
NOISE_LOC, NOISE_SCALE = -4.0, 1.0
LS_SCALE = math.sqrt(3.0)
MAX_ITER = 200


_blas_capped = False


def _one_blas_thread() -> None:
    """Cap numpy's and scipy's BLAS at one thread, once per process (threadpoolctl, a botorch dependency; skipped
    where it is missing). At these sizes (n <= a few hundred) BLAS threads never help, and on a busy 2-core
    machine OpenBLAS's spinning threads made a fit 20x slower in wall time and 20x costlier in CPU (measured:
    2.2 s against 0.10 s wall, 0.44 against 0.02 s CPU, load average 24). meshd's model worker sets
    OMP_NUM_THREADS=1 for the same reason (daemon/node.py)."""
    global _blas_capped
    if _blas_capped:
        return
    _blas_capped = True
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    import scipy.linalg  # noqa: F401  (load scipy's BLAS first, so that the cap reaches it too)

    threadpool_limits(1, user_api="blas")


def _ls_loc(d: int) -> float:
    return math.sqrt(2.0) + 0.5 * math.log(d)


def _rbf(a: np.ndarray, b: np.ndarray, ls: np.ndarray) -> np.ndarray:
    a, b = a / ls, b / ls
    sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return np.exp(-0.5 * np.maximum(sq, 0.0))


def _neg_objective(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """-(log N(y | c, K + s I) + log p(ls) + log p(s)) / n and its gradient in theta = (log ls, log s, c)."""
    from scipy.linalg import cho_factor, cho_solve

    n, d = x.shape
    # log values past 50 are capped: a line search may try any step (an unbounded exp overflowed, issue 26)
    ls, noise, c = np.exp(np.minimum(theta[:d], 50.0)), math.exp(min(theta[d], 50.0)), theta[d + 1]
    k = _rbf(x, x, ls)
    kn = k + noise * np.eye(n)
    cf = cho_factor(kn, lower=True, check_finite=False)
    r = y - c
    alpha = cho_solve(cf, r, check_finite=False)
    logdet = 2.0 * np.log(np.diag(cf[0])).sum()
    ll = -0.5 * r @ alpha - 0.5 * logdet - 0.5 * n * math.log(2.0 * math.pi)
    w = np.outer(alpha, alpha) - cho_solve(cf, np.eye(n), check_finite=False)  # d ll / d K = w / 2
    grad = np.empty(d + 2)
    wk = w * k
    for j in range(d):
        diff = x[:, j][:, None] - x[:, j][None, :]
        grad[j] = 0.5 * (wk * diff * diff).sum() / ls[j] ** 2  # dK/dlog ls_j = K * diff^2 / ls_j^2
    grad[d] = 0.5 * noise * np.trace(w)
    grad[d + 1] = alpha.sum()
    # LogNormal priors on the values: log p(v) = -log v - (log v - mu)^2 / (2 s^2) + const
    lloc = _ls_loc(d)
    logls = theta[:d]
    ll += float((-logls - (logls - lloc) ** 2 / (2 * LS_SCALE**2)).sum())
    grad[:d] += -1.0 - (logls - lloc) / LS_SCALE**2
    ll += -theta[d] - (theta[d] - NOISE_LOC) ** 2 / (2 * NOISE_SCALE**2)
    grad[d] += -1.0 - (theta[d] - NOISE_LOC) / NOISE_SCALE**2
    return -ll / n, -grad / n


@dataclass(frozen=True, eq=False)
class GridGP:
    """A fitted GP: hyper-parameters, the training data (normalised) and its cached posterior pieces.
    Plain numpy arrays (pickles small, encodes as lists)."""

    lo: np.ndarray  # (d,) input bounds: x -> (x - lo) / (hi - lo)
    hi: np.ndarray
    y_mean: float  # outcome standardisation: y -> (y - y_mean) / y_std
    y_std: float
    lengthscale: np.ndarray  # (d,)
    noise: float  # on the standardised outcome
    constant: float  # the constant mean, standardised
    train_x: np.ndarray  # (n, d) normalised
    train_y: np.ndarray  # (n,) standardised
    chol: np.ndarray = field(repr=False)  # lower Cholesky factor of K + noise I
    alpha: np.ndarray = field(repr=False)  # (K + noise I)^-1 (y - constant)

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> GridGP:
        from scipy.optimize import minimize

        _one_blas_thread()
        n, d = x.shape
        xn = (x - lo) / (hi - lo)
        y_mean = float(y.mean())
        y_std = float(y.std(ddof=1)) if n > 1 else 1.0
        if not y_std >= 1e-8:
            y_std = 1.0
        yn = (y - y_mean) / y_std
        start = np.concatenate([np.full(d, _ls_loc(d) - LS_SCALE**2), [NOISE_LOC - NOISE_SCALE**2, 0.0]])
        bounds = [(math.log(MIN_LENGTHSCALE), None)] * d + [(math.log(MIN_NOISE), None), (None, None)]
        res = minimize(_neg_objective, start, args=(xn, yn), jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": MAX_ITER})
        return cls.build(lo, hi, y_mean, y_std, np.exp(res.x[:d]), math.exp(res.x[d]), float(res.x[d + 1]), xn, yn)

    @classmethod
    def build(cls, lo, hi, y_mean, y_std, lengthscale, noise, constant, train_x, train_y) -> GridGP:
        """The posterior's cached pieces for given hyper-parameters (no jitter: noise >= MIN_NOISE)."""
        from scipy.linalg import cho_factor, cho_solve

        k = _rbf(train_x, train_x, lengthscale) + noise * np.eye(train_x.shape[0])
        cf = cho_factor(k, lower=True, check_finite=False)
        alpha = cho_solve(cf, train_y - constant, check_finite=False)
        chol = np.tril(cf[0])
        return cls(lo, hi, y_mean, y_std, lengthscale, noise, constant, train_x, train_y, chol, alpha)

    def posterior(self, x: np.ndarray, variance: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """Mean and variance of the latent f at raw inputs x (m, d), in the outcome's units (seconds)."""
        from scipy.linalg import solve_triangular

        _one_blas_thread()  # a model decoded in another process than its fit's
        ks = _rbf((x - self.lo) / (self.hi - self.lo), self.train_x, self.lengthscale)  # (m, n)
        mean = (self.constant + ks @ self.alpha) * self.y_std + self.y_mean
        if not variance:
            return mean, None
        v = solve_triangular(self.chol, ks.T, lower=True, check_finite=False)
        var = np.maximum(1.0 - (v * v).sum(0), 1e-12) * self.y_std**2
        return mean, var


def log_ei_minimising(mean: np.ndarray, sigma: np.ndarray, best_f: float) -> np.ndarray:
    """log of the closed-form expected improvement below `best_f`: log(sigma (phi(u) + u Phi(u))), u = (best_f -
    mean) / sigma, stable for very negative u (below -20: log phi(u) - 2 log(-u) + log(1 - 3/u^2 + 15/u^4))."""
    from scipy.special import log_ndtr

    u = (best_f - mean) / sigma
    out = np.empty_like(u)
    big = u > -20.0  # phi(u) + u Phi(u) loses at most ~3 digits to cancellation above -20
    ub = u[big]
    log_phi = -0.5 * ub * ub - 0.5 * math.log(2 * math.pi)
    out[big] = np.log(np.exp(log_phi) + ub * np.exp(log_ndtr(ub)))
    us = u[~big]
    out[~big] = -0.5 * us * us - 0.5 * math.log(2 * math.pi) - 2.0 * np.log(-us) + np.log1p(-3.0 / (us * us) + 15.0 / us**4)
    return out + np.log(sigma)
