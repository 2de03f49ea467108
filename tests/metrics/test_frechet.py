"""Frechet distance: closed forms (shared notes), scipy sqrtm / clean-fid reference, zero clamp, mergeable stats."""

from __future__ import annotations

import numpy as np
import pytest

from pcpo_eval.metrics.frechet import (
    FD_ZERO_RTOL,
    clamp_rounding,
    frechet_distance,
    frechet_distance_details,
    frechet_distance_from_features,
    frechet_distance_sqrtm,
    gaussian_stats,
)
from pcpo_eval.metrics.state import GaussianStats


def test_closed_form_scaled_identity() -> None:
    # mu1 = 0, S1 = I4 vs mu2 = 1, S2 = 4 I4: ||1||^2 = 4, tr = 4 + 16 - 2*8 = 4 -> 8
    assert frechet_distance(np.zeros(4), np.eye(4), np.ones(4), 4 * np.eye(4)) == pytest.approx(
        8.0, abs=1e-12
    )


def test_closed_form_correlated() -> None:
    s1 = np.array([[2.0, 1.0], [1.0, 2.0]])
    assert frechet_distance(np.zeros(2), s1, np.zeros(2), np.eye(2)) == pytest.approx(
        4 - 2 * np.sqrt(3), abs=1e-12
    )


def test_matches_scipy_sqrtm_and_cleanfid_on_random_data() -> None:
    from cleanfid.fid import frechet_distance as cleanfid_fd

    rng = np.random.default_rng(0)
    d = 64
    x = rng.normal(size=(500, d))
    a = rng.normal(size=(d, d)) / np.sqrt(d)
    y = rng.normal(size=(400, d)) @ a + 0.3
    mu1, s1 = gaussian_stats(x)
    mu2, s2 = gaussian_stats(y)
    ours = frechet_distance(mu1, s1, mu2, s2)
    assert ours == pytest.approx(frechet_distance_sqrtm(mu1, s1, mu2, s2), rel=1e-9)
    assert ours == pytest.approx(float(cleanfid_fd(mu1, s1, mu2, s2)), rel=1e-9)
    # symmetric in its arguments
    assert frechet_distance(mu2, s2, mu1, s1) == pytest.approx(ours, rel=1e-9)


@pytest.mark.parametrize("n", [20, 80])  # N < d (singular covariance) and N > d
def test_identical_sets_give_exactly_zero(n: int) -> None:
    x = np.random.default_rng(1).normal(size=(n, 50))
    mu, cov = gaussian_stats(x)
    res = frechet_distance_details(mu, cov, mu, cov.copy())
    assert res.value == 0.0 and str(res.value) == "0.0" and res.method == "identical"
    assert frechet_distance_from_features(x, x.copy()) == 0.0


def test_rounding_below_zero_is_clamped_and_reported() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 50)).astype(np.float32)  # N < d: eigh path, sqrt of round-off eigenvalues
    y = x[rng.permutation(20)]  # the same Gaussian, summed in another order: not bitwise equal
    mu1, s1 = gaussian_stats(x)
    mu2, s2 = gaussian_stats(y)
    res = frechet_distance_details(mu1, s1, mu2, s2)
    scale = float(np.trace(s1) + np.trace(s2))
    assert res.method == "eigh" and -FD_ZERO_RTOL * scale <= res.raw_value < 0  # -1.5e-06 before the clamp
    assert res.value == 0.0 and res.clamped_to_zero
    assert res.diagnostics()["raw_value"] == res.raw_value and res.diagnostics()["clamped_to_zero"] is True


def test_clamp_only_touches_rounding_level_negatives() -> None:
    assert clamp_rounding(-1e-7, 1.0) == (0.0, True)
    assert clamp_rounding(-1e-5, 1.0) == (-1e-5, False)  # a real numerical problem stays visible
    assert clamp_rounding(1e-9, 1.0) == (1e-9, False)  # a tiny positive distance is a distance
    value, clamped = clamp_rounding(float("nan"), 1.0)
    assert np.isnan(value) and not clamped
    res = frechet_distance_details(np.zeros(2), np.eye(2), np.ones(2), np.eye(2))
    assert res.value == res.raw_value == pytest.approx(2.0) and not res.clamped_to_zero


def test_gaussian_stats_merge_equals_numpy() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(301, 7)) * 3 + 5
    a = GaussianStats(7).update(x[:100])
    b = GaussianStats(7).update(x[100:250]).update(x[250:])
    a.merge(b)
    assert a.n == 301
    np.testing.assert_allclose(a.mean(), x.mean(0), rtol=1e-12)
    np.testing.assert_allclose(a.cov(), np.cov(x, rowvar=False), rtol=1e-10, atol=1e-12)


def test_from_features_helper_and_small_n_error() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(50, 3)), rng.normal(size=(60, 3)) + 1
    assert frechet_distance_from_features(x, y) > 2.0
    with pytest.raises(ValueError):
        gaussian_stats(x[:1])


def test_cholesky_and_eigh_paths_agree() -> None:
    from pcpo_eval.metrics.frechet import _psd_sqrt, trace_sqrt_product

    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(200, 30)), rng.normal(size=(150, 30)) * 2
    s1, s2 = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    tr, _, _, method = trace_sqrt_product(s1, s2)
    assert method == "cholesky"
    root, _, _ = _psd_sqrt(s1)
    ev = np.linalg.eigvalsh(root @ s2 @ root)
    assert tr == pytest.approx(np.sqrt(np.clip(ev, 0, None)).sum(), rel=1e-10)
    singular = np.cov(rng.normal(size=(10, 30)), rowvar=False)
    singular[0, 0] -= 1e-3  # make it indefinite: Cholesky must fail and eigh take over
    assert trace_sqrt_product(singular, s2)[3] == "eigh"
