"""Holm and Benjamini-Hochberg against a direct transcription of R's p.adjust."""

from __future__ import annotations

import numpy as np
import pytest

from pcpo_eval.stats.adjust import benjamini_hochberg, holm


def _r_holm(p):
    p = np.asarray(p, float)
    n = p.size
    o = np.argsort(p)
    adj = np.minimum(1, np.maximum.accumulate((n - np.arange(n)) * p[o]))
    out = np.empty(n)
    out[o] = adj
    return out


def _r_bh(p):
    p = np.asarray(p, float)
    n = p.size
    o = np.argsort(p)[::-1]
    i = np.arange(n, 0, -1)
    adj = np.minimum(1, np.minimum.accumulate(n / i * p[o]))
    out = np.empty(n)
    out[o] = adj
    return out


@pytest.mark.parametrize("seed", range(5))
def test_matches_r_formulas(seed):
    p = np.random.default_rng(seed).uniform(0, 0.2, 7)
    np.testing.assert_allclose(holm(p), _r_holm(p), rtol=1e-12)
    np.testing.assert_allclose(benjamini_hochberg(p), _r_bh(p), rtol=1e-12)


def test_known_values():
    # R: p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm") -> 0.03 0.06 0.06 0.02
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    # R: p.adjust(c(0.01, 0.04, 0.03, 0.005), "BH") -> 0.02 0.04 0.04 0.02
    np.testing.assert_allclose(benjamini_hochberg([0.01, 0.04, 0.03, 0.005]), [0.02, 0.04, 0.04, 0.02])


def test_nan_kept_and_excluded():
    out = holm([0.01, np.nan, 0.02])
    assert np.isnan(out[1])
    np.testing.assert_allclose(out[[0, 2]], [0.02, 0.02])


def test_holm_present_adjusts_the_entries_with_a_p_and_keeps_none():
    from pcpo_eval.stats.adjust import holm_present

    got = holm_present([0.03, None, 0.01, None])
    want = holm([0.03, 0.01])
    assert got[1] is None and got[3] is None
    assert got[0] == pytest.approx(want[0]) and got[2] == pytest.approx(want[1])
    assert holm_present([None, None]) == [None, None] and holm_present([]) == []
