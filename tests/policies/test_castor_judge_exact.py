"""Castor's release-pass arithmetic after its trims (`Castor._kind_arrays`, its arrays shared by the kinds of one xi
within a pass, with the columns no sub-batch can use left out; `_judge_block` keeping twice the pair's best and the
wait alternative's over the block's columns only) gives the same numbers, bit for bit, as the straightforward
version kept here (masked pairs set to +inf at the end, every column in full, halved): random small clusters of one
or two GPU types, dead hosts, pairs that do not fit, kinds without a profile on a type, jobs with no iterations left
and hosts with odd step times."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from meshsched.policies.castor import Castor


def _ref_kind_arrays(kt, kid, hosts):
    cols, gidx, code_c, ta, ia, _ = hosts
    r = kt.nsubs[kid]
    xid = kt.xi_of[kid]
    xa = np.take(kt.xa[xid, :r], gidx, axis=1)
    xb = np.take(kt.xb[xid, :r], gidx, axis=1)
    masked = np.isnan(xa)
    if len(kt.types) == 1:
        t_b = kt.tb[kid, :r, :]
    else:
        off = ~kt.profiled[kid][code_c]
        masked |= off[None, :]
        t_b = kt.tb[kid, :r][:, code_c]
    keep = ~masked.all(axis=0)
    cols, ta, ia = cols[keep], ta[keep], ia[keep]
    xa, xb, masked = (np.compress(keep, a, axis=1) for a in (xa, xb, masked))
    if t_b.shape[1] > 1:
        t_b = np.compress(keep, t_b, axis=1)
    ha, hb = ta * xa, t_b * xb
    ta2 = ha * ia
    return xa, cols, ta, ia, xb, masked, t_b, ha, hb, ta2, ta2 / hb


def _ref_pair_sums(ta, ia, ha, hb, ta2, q, t_b, i_b, masked):
    tb1 = hb * i_b
    x = tb1 + ta * (ia - tb1 / ha) + tb1
    y = ta2 + t_b * (i_b - q) + ta2
    return np.where(masked, np.inf, np.where(ta2 >= tb1, x, y))


def _ref_block(tab, kt, kid, shared, i_bs, start_b):
    _, cols, ta, ia, _, masked, t_b, ha, hb, ta2, q = shared
    code = tab.code
    ib = np.array(i_bs)[:, None]
    t_b_alone = kt.tb[kid, 0, 0] if len(kt.types) == 1 else kt.tb[kid, 0][code][None, :]
    sums = _ref_pair_sums(ta, ia, ha, hb, ta2, q, t_b, ib[:, :, None], masked)
    best = np.full((len(i_bs), len(code)), np.inf)
    best[:, cols] = sums.min(axis=1) / 2
    wait = (tab.end_a + np.array(start_b)[:, None] + t_b_alone * ib) / 2
    feasible = np.isfinite(best)
    pays = feasible & (best < wait)
    low = np.where(feasible, best, np.inf).argmin(axis=1)
    return sums, best, wait, pays, feasible.any(axis=1), pays.any(axis=1), low, feasible.sum(axis=1)


def _cluster(g, types: int, odd: bool, nan_free: bool):
    width, groups, r = int(g.integers(1, 50)), int(g.integers(1, 6)), int(g.integers(1, 6))
    xa = g.uniform(0.9, 2.5, (2, r, groups))
    xb = g.uniform(0.9, 2.5, (2, r, groups))
    nan = g.random((2, r, groups)) < (0.0 if nan_free else 0.25)  # pairs that do not fit
    xa[nan] = xb[nan] = np.nan
    if groups > 1 and not nan_free:
        xa[0, :, 0] = xb[0, :, 0] = np.nan  # a group where no sub-batch of xi 0 fits
    tb = g.uniform(0.05, 3.0, (3, r, types))
    profiled = np.ones((3, types), dtype=bool)
    if types > 1:
        profiled[1, 1] = False  # kind 1 has no profile on type 1
        tb[1, :, 1] = np.nan
        profiled[2, 0] = False  # nor kind 2 on type 0 (kind 0's xi: their shared arrays, then its own columns)
        tb[2, :, 0] = np.nan
    kt = SimpleNamespace(types=["v100", "a100"][:types], nsubs=[r, max(1, r - 1), r], xi_of=[0, 1, 0], xa=xa, xb=xb,
                         tb=tb, profiled=profiled)
    code = g.integers(0, types, width)
    ta_all = g.uniform(0.05, 3.0, width)
    ia_all = g.uniform(0, 5e5, width) * (g.random(width) > 0.2)  # some hosts have no work left
    ia_all[0] = 0.0 if g.random() < 0.5 else ia_all[0]
    if odd:
        ta_all[g.integers(0, width)] = g.choice([0.0, np.inf])
    with np.errstate(invalid="ignore"):
        end_a = ta_all * ia_all
    alive = np.flatnonzero(ia_all > 0)
    tab = SimpleNamespace(code=code, end_a=end_a, claims=0)
    hosts = (alive, g.integers(0, groups, width)[alive], code[alive], ta_all[alive], ia_all[alive], end_a[alive])
    return tab, kt, hosts


@pytest.mark.parametrize("seed", range(40))
def test_trimmed_judgement_matches_the_straightforward_one(seed):
    g = np.random.default_rng(seed)
    tab, kt, hosts = _cluster(g, types=1 + seed % 2, odd=seed % 5 == 4, nan_free=seed % 3 == 0)
    memo: dict = {}  # (the pass's: kinds 0 and 2 share their xi)
    for kid in range(3):
        n = int(g.integers(1, 5))
        i_bs = [float(v) for v in g.uniform(0, 4e5, n)]
        if seed % 3 == 2:
            i_bs[0] = 0.0  # a job with no iterations left: the fold does not hold, the mask is used
        if seed % 4 == 1:
            i_bs[-1] = np.inf  # no column feasible for it (its lowest column is then 0, as argmin's over +inf)
        start_b = [float(v) for v in g.uniform(0, 1e5, n)]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ref_shared = _ref_kind_arrays(kt, kid, hosts)
            shared = Castor._kind_arrays(kt, kid, hosts, memo)
            want = _ref_block(tab, kt, kid, ref_shared, i_bs, start_b)
        sums, best, wait, pays, want_f, want_p, low, count = want
        cols = shared.cols
        assert np.array_equal(cols, ref_shared[1])  # the same columns judged
        if not len(cols):  # (`_judge` judges no job of a kind with no column)
            assert not want_f.any()
            continue
        blk, any_f = Castor._judge_block(Castor, tab, kt, kid, shared, i_bs, start_b)
        assert np.array_equal(blk.sums, sums, equal_nan=True)
        assert any_f == want_f.tolist() and blk.any_p == want_p.tolist() and blk.count == count.tolist()
        # the block keeps twice the best and the wait, over its columns (every other column: +inf, never pays)
        assert (~np.isfinite(np.delete(best, cols, axis=1))).all() and not np.delete(pays, cols, axis=1).any()
        for j in range(n):
            assert np.array_equal(blk.best[j] / 2, best[j][cols], equal_nan=True), j
            assert np.array_equal(blk.wait[j] / 2, wait[j][cols], equal_nan=True), j
            assert np.array_equal(blk.pays[j], pays[j][cols]), j
            if want_f[j]:  # (a row with no column feasible is not judged: its lowest column is never asked)
                assert cols[blk.low[j]] == low[j], j
