"""Castor's pair arithmetic (`Castor._pair_sums`) computes B's end when A finishes first only where A does: the
same numbers, bit for bit, as both branches everywhere (the code before, kept here as the reference), on random
blocks with both shapes of B's step times, masked pairs, NaN and +inf inputs."""

from __future__ import annotations

import numpy as np
import pytest

from meshsched.policies.castor import Castor


def _reference(ta, ia, ha, hb, ta2, q, t_b, i_b, masked):
    tb1 = hb * i_b
    first_b = ta2 >= tb1
    x = tb1 / ha
    np.subtract(ia, x, out=x)
    np.multiply(ta, x, out=x)
    np.add(tb1, x, out=x)
    np.add(x, tb1, out=x)
    y = i_b - q
    np.multiply(t_b, y, out=y)
    np.add(ta2, y, out=y)
    np.add(ta2, y, out=y)
    np.copyto(y, x, where=first_b)
    np.copyto(y, np.inf, where=masked)
    return y


@pytest.mark.parametrize("seed", range(6))
def test_pair_sums_match_both_branches_everywhere(seed):
    g = np.random.default_rng(seed)
    n, r, c = int(g.integers(1, 5)), int(g.integers(1, 7)), int(g.integers(1, 60))
    ta = g.uniform(0.05, 3.0, c)
    ia = g.uniform(0, 5e5, c) * (g.random(c) > 0.1)
    xa = g.uniform(0.9, 2.5, (r, c))
    xb = g.uniform(0.9, 2.5, (r, c))
    xa[g.random((r, c)) < 0.1] = np.nan  # pairs that do not fit
    t_b = g.uniform(0.05, 3.0, (r, 1) if seed % 2 else (r, c))
    if seed == 4:
        t_b[0, 0] = np.inf
    masked = np.isnan(xa) | (g.random((r, c)) < 0.05)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ha, hb = ta * xa, t_b * xb
        ta2 = ha * ia
        q = ta2 / hb
        i_b = g.uniform(0, 4e5, n)[:, None, None]
        args = (ta, ia, ha, hb, ta2, q, t_b, i_b, masked)
        want, got = _reference(*args), Castor._pair_sums(*args)
    assert got.shape == want.shape == (n, r, c)
    assert np.array_equal(got, want, equal_nan=True)
    assert (~(ta2 >= hb * i_b)).any()  # the branch computed only where A finishes first was taken
