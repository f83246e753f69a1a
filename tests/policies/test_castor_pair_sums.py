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
        want, got = _reference(*args), Castor._pair_sums(ta, ia, ha, hb, ta2, t_b, i_b, np.flatnonzero(masked))
        unmasked = Castor._pair_sums(ta, ia, ha, hb, ta2, t_b, i_b, None)  # None: no pair masked
        assert np.array_equal(unmasked, _reference(ta, ia, ha, hb, ta2, q, t_b, i_b, np.zeros_like(masked)),
                              equal_nan=True)
    assert got.shape == want.shape == (n, r, c)
    assert np.array_equal(got, want, equal_nan=True)
    assert (~(ta2 >= hb * i_b)).any()  # the branch computed only where A finishes first was taken


@pytest.mark.parametrize("seed", range(4))
def test_pair_sums_on_arrays_that_are_not_c_contiguous(seed):
    """`_kind_arrays` drops the columns no sub-batch can use; arrays cut so along their last axis (and products of
    them) are not C-contiguous, and `_pair_sums` wrote B's end when A finishes first through `x.ravel()`, a copy
    of such an array: those sums were silently left at the other branch's value."""
    g = np.random.default_rng(100 + seed)
    n, r, c = 3, 4, 80
    keep = g.random(c) > 0.3
    ta = g.uniform(0.05, 3.0, c)[keep]
    ia = g.uniform(1, 5e5, c)[keep]
    xa = g.uniform(0.9, 2.5, (r, c))[:, keep]
    xb = g.uniform(0.9, 2.5, (r, c))[:, keep]
    t_b = g.uniform(0.05, 3.0, (r, c))[:, keep] if seed % 2 else g.uniform(0.05, 3.0, (r, 1))
    masked = (g.random((r, c)) < 0.05)[:, keep]
    assert not xa.flags.c_contiguous
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ha, hb = ta * xa, t_b * xb
        ta2 = ha * ia
        q = ta2 / hb
        i_b = g.uniform(0, 4e5, n)[:, None, None]
        args = (ta, ia, ha, hb, ta2, q, t_b, i_b, masked)
        contiguous = tuple(np.ascontiguousarray(a) for a in args)
        want, got = _reference(*contiguous), Castor._pair_sums(ta, ia, ha, hb, ta2, t_b, i_b, np.flatnonzero(masked))
    assert (~(ta2 >= hb * i_b)).any()  # some pair where A finishes first
    assert np.array_equal(got, want, equal_nan=True)


def test_kind_arrays_drop_unusable_columns_into_contiguous_arrays():
    """The arrays `_kind_arrays` hands to `_pair_sums` after dropping columns are C-contiguous (the pair sums of the
    columns kept are those of the full block)."""
    from types import SimpleNamespace

    g = np.random.default_rng(7)
    r, groups, c = 3, 5, 40
    xa = g.uniform(0.9, 2.0, (1, r, groups))
    xa[0, :, 2] = np.nan  # group 2: no sub-batch fits
    kt = SimpleNamespace(nsubs=[r], xi_of=[0], xa=xa, xb=g.uniform(0.9, 2.0, (1, r, groups)), types=["v100"],
                         tb=g.uniform(0.05, 1.0, (1, r, 1)), profiled=np.ones((1, 1), dtype=bool))
    gidx = g.integers(0, groups, c)
    gidx[:3] = 2
    ta_all, ia_all = g.uniform(0.05, 3.0, c), g.uniform(1, 5e5, c)
    hosts = (np.arange(c), gidx, np.zeros(c, dtype=np.int64), ta_all, ia_all, ta_all * ia_all)
    k = Castor._kind_arrays(kt, 0, hosts)
    assert len(k.cols) == (gidx != 2).sum()
    assert np.array_equal(k.end_a, k.ta * k.ia)
    masked = np.zeros(k.xa.shape, dtype=bool)
    if k.masked is not None:  # (flat indices)
        masked.flat[k.masked] = True
    assert all(a.flags.c_contiguous for a in (k.xa, k.xb, k.ha, k.hb, k.ta2))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        i_b = np.array([1e3, 5e4, 3e5])[:, None, None]
        got = Castor._pair_sums(k.ta, k.ia, k.ha, k.hb, k.ta2, k.t_b, i_b, k.masked)
        want = _reference(k.ta, k.ia, k.ha, k.hb, k.ta2, k.ta2 / k.hb, k.t_b, i_b, masked)
    assert np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("seed", range(12))
def test_pair_sums_of_blocks_of_several_jobs(seed):
    """Blocks of several jobs on either side of each pair's threshold (A finishes first for some, B for others): the
    same numbers as both branches everywhere, also with a job with no iterations left, +inf iterations, +inf step
    times or a shared step time of +inf."""
    g = np.random.default_rng(200 + seed)
    n, r, c = int(g.integers(2, 7)), int(g.integers(1, 6)), int(g.integers(1, 80))
    ta = g.uniform(0.05, 3.0, c)
    ia = 10 ** g.uniform(0, 6, c)
    xa = g.uniform(0.9, 2.5, (r, c))
    xb = g.uniform(0.9, 2.5, (r, c))
    xa[g.random((r, c)) < 0.1] = np.nan
    t_b = g.uniform(0.05, 3.0, (r, 1) if seed % 2 else (r, c))
    i_b = 10 ** g.uniform(0, 6, n)
    if seed % 4 == 2:
        i_b[0] = 0.0
    if seed % 4 == 3:
        i_b[-1] = np.inf
    if seed % 3 == 1:
        xb[0, 0] = np.inf
        t_b[-1, 0] = np.inf
    masked = np.isnan(xa)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ha, hb = ta * xa, t_b * xb
        ta2 = ha * ia
        i_b = i_b[:, None, None]
        want = _reference(ta, ia, ha, hb, ta2, ta2 / hb, t_b, i_b, masked)
        got = Castor._pair_sums(ta, ia, ha, hb, ta2, t_b, i_b, np.flatnonzero(masked))
        first_b = ta2 >= hb * i_b
    assert np.array_equal(got, want, equal_nan=True)
    if c > 20:
        assert (~first_b).any() and (first_b.any(axis=(1, 2)) & (~first_b).any(axis=(1, 2))).any()
