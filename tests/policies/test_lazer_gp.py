"""Lazer's numpy GP (meshsched/policies/lazer_gp.py) against BoTorch/GPyTorch: the same posterior for the same
hyper-parameters, a fit at least as good as BoTorch's by BoTorch's own objective, and no jitter warning in a
replay (issue 26, point 2)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from meshsched.policies.lazer_opt import (
    DeferralContext,
    FitRequest,
    Observation,
    OptimizerConfig,
    fit_model,
)

torch = pytest.importorskip("torch")
pytest.importorskip("botorch")


def _observations(n: int, seed: int = 7) -> tuple[Observation, ...]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        c = DeferralContext(float(rng.uniform(10, 200)), float(rng.uniform(600, 36000)), float(rng.uniform(20, 120)),
                            float(rng.uniform(5, 16)))
        x = float(rng.uniform(0, 100))
        f = abs(x - min(100.0, c.load_s * 0.5 + float(rng.normal(0, 5))))
        out.append(Observation(c, x, f))
    # repeated decisions (the same context and X), common in a replay: the old fantasy models' jitter source
    return tuple(out) + tuple(out[:3])


def _gpytorch_twin(gp):
    """BoTorch's SingleTaskGP on the same (normalised, standardised) data with gp's hyper-parameters."""
    from botorch.models import SingleTaskGP

    x = torch.tensor(gp.train_x)
    y = torch.tensor(gp.train_y).unsqueeze(-1)
    model = SingleTaskGP(x, y, train_Yvar=torch.full_like(y, gp.noise), outcome_transform=None)
    model.covar_module.lengthscale = torch.tensor(gp.lengthscale).unsqueeze(0)
    model.mean_module.constant = torch.tensor(gp.constant)
    model.eval()
    return model


def test_the_cheap_posterior_equals_gpytorchs():
    from meshsched.policies.lazer_gp import log_ei_minimising

    fitted = fit_model(FitRequest(OptimizerConfig(), _observations(60)))
    gp = fitted.model
    twin = _gpytorch_twin(gp)
    for o in _observations(4, seed=11):
        raw = fitted._inputs(o.context)
        mean, var = gp.posterior(raw)
        with torch.no_grad():
            post = twin.posterior(torch.tensor((raw - gp.lo) / (gp.hi - gp.lo)))
        ref_mean = post.mean.squeeze(-1).numpy() * gp.y_std + gp.y_mean
        ref_var = post.variance.squeeze(-1).numpy() * gp.y_std**2
        np.testing.assert_allclose(mean, ref_mean, rtol=1e-6, atol=1e-9 * gp.y_std)
        np.testing.assert_allclose(var, ref_var, rtol=1e-6, atol=1e-9 * gp.y_std**2)
        # the closed-form EI equals BoTorch's LogExpectedImprovement on that posterior
        from botorch.acquisition.analytic import LogExpectedImprovement

        best = (fitted.acquisition - gp.y_mean) / gp.y_std
        with torch.no_grad():
            ref = LogExpectedImprovement(twin, best_f=best, maximize=False)(
                torch.tensor((raw - gp.lo) / (gp.hi - gp.lo)).unsqueeze(-2)).numpy() + math.log(gp.y_std)
        ours = log_ei_minimising(mean, np.sqrt(var), fitted.acquisition)
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)  # log EI: EI itself to a relative 1e-6
        x, ratio = fitted.best_ei(o.context)
        assert x == float(fitted.grid[int(np.argmax(ref))])
        assert math.log(ratio * fitted.y_std) == pytest.approx(float(ref.max()), abs=1e-6)


@pytest.mark.slow
def test_the_fit_is_as_good_as_botorchs():
    """The same objective (marginal likelihood and priors) as fit_gpytorch_mll, reached at least as well."""
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from botorch.models.transforms.input import Normalize
    from botorch.models.transforms.outcome import Standardize
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from meshsched.policies.lazer_gp import _neg_objective

    obs = _observations(40)
    gp = fit_model(FitRequest(OptimizerConfig(), obs)).model
    x = torch.tensor([(o.x, *o.context.features()) for o in obs], dtype=torch.float64)
    y = torch.tensor([[o.f] for o in obs], dtype=torch.float64)
    ref = SingleTaskGP(x, y, input_transform=Normalize(5, bounds=torch.tensor(np.stack([gp.lo, gp.hi]))),
                       outcome_transform=Standardize(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_gpytorch_mll(ExactMarginalLogLikelihood(ref.likelihood, ref))
    theirs = np.concatenate([np.log(ref.covar_module.lengthscale.detach().numpy().ravel()),
                             [math.log(ref.likelihood.noise.item()), ref.mean_module.constant.item()]])
    ours = np.concatenate([np.log(gp.lengthscale), [math.log(gp.noise), gp.constant]])
    assert _neg_objective(ours, gp.train_x, gp.train_y)[0] <= _neg_objective(theirs, gp.train_x, gp.train_y)[0] + 1e-6
    assert gp.noise >= 1e-4  # the lower bound that keeps K + noise I positive definite without jitter


def test_repeated_decisions_need_no_jitter():
    """Observations a replay repeats (the same context and X): the old fit (LogNEI's noiseless fantasy models)
    printed `NumericalWarning: A not p.d., added jitter` on them; any NumericalWarning now fails this."""
    from linear_operator.utils.warnings import NumericalWarning

    obs = _observations(40)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NumericalWarning)
        fitted = fit_model(FitRequest(OptimizerConfig(), obs))
        for o in obs[:5]:
            fitted.best_ei(o.context)
            fitted.mean_argmin(o.context)


def test_a_replay_emits_no_numerical_warning():
    """A short replay (the 60-job slice of tests/policies/test_lazer.py, fits every observation) with every
    NumericalWarning an error."""
    from linear_operator.utils.warnings import NumericalWarning

    from meshsched.loaders.profiles import load_perf_model
    from meshsched.loaders.traces import TraceOptions, load_trace
    from meshsched.policies.registry import make_policy
    from meshsched.policies.stack import PolicyHandle
    from meshsched.sim.loop import ClusterSpec, simulate

    perf = load_perf_model(overheads="lazer")
    jobs = load_trace("philly", perf, TraceOptions(gpu_type="v100", gpus_per_node=8, seed=1, first_n=60)).jobs
    with warnings.catch_warnings():
        warnings.simplefilter("error", NumericalWarning)
        r = simulate(jobs, make_policy("lazer:refit=1", PolicyHandle(perf=perf)), perf,
                     ClusterSpec(2, 8, "v100", perf.gpu_memory_mb("v100")))
    assert r.engine.model is not None and r.engine.model.n_observations >= 10  # fits ran
