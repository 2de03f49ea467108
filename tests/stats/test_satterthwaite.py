"""Numerical derivatives and the Satterthwaite formula (pure functions)."""

from __future__ import annotations

import numpy as np
import pytest

from pcpo_eval.stats.lmm_core import LMMCore, REBlock
from pcpo_eval.stats.satterthwaite import hessian, jacobian, satterthwaite_df, satterthwaite_dfs


def test_hessian_and_jacobian_of_known_functions():
    x = np.array([0.7, -1.3, 2.0])

    def f(v):
        return np.exp(v[0]) * v[1] ** 2 + np.sin(v[2]) * v[0]

    h_ref = np.array(
        [
            [np.exp(x[0]) * x[1] ** 2, 2 * np.exp(x[0]) * x[1], np.cos(x[2])],
            [2 * np.exp(x[0]) * x[1], 2 * np.exp(x[0]), 0.0],
            [np.cos(x[2]), 0.0, -np.sin(x[2]) * x[0]],
        ]
    )
    np.testing.assert_allclose(hessian(f, x), h_ref, rtol=1e-7, atol=1e-8)

    def g(v):
        return np.array([v[0] * v[1], v[2] ** 3, np.log(v[0] ** 2)])

    j_ref = np.array([[x[1], x[0], 0], [0, 0, 3 * x[2] ** 2], [2 / x[0], 0, 0]])
    np.testing.assert_allclose(jacobian(g, x), j_ref, rtol=1e-8, atol=1e-10)


def test_satterthwaite_formula():
    # df = 2 v^2 / (g' A g)
    assert satterthwaite_df(2.0, np.array([1.0, 0.0]), np.eye(2)) == pytest.approx(8.0)
    assert np.isnan(satterthwaite_df(1.0, np.zeros(2), np.eye(2)))


def test_balanced_one_way_between_group_df():
    """Balanced one-way random-intercept model: the intercept's Satterthwaite df is groups - 1."""
    rng = np.random.default_rng(0)
    g, m = 9, 4
    codes = np.repeat(np.arange(g), m)
    y = rng.normal(0, 2, g)[codes] + rng.normal(0, 1, g * m)
    X = np.ones((g * m, 1))
    core = LMMCore(y, X, [REBlock("g", codes, g, np.ones((g * m, 1)), ("(Intercept)",))])
    theta, _, _ = core.fit_theta(np.array([1.0]))
    vp = np.r_[theta, core.sigma_hat(theta)]
    dfs, _, ok = satterthwaite_dfs(core.deviance_vp, core.vcov_beta, vp, np.eye(1))
    assert ok
    assert dfs[0] == pytest.approx(g - 1, rel=1e-5)


def test_df_invariant_to_parameterization():
    """Same df from (theta, sigma) and from variances (sigma_b^2, sigma^2): g and H co-transform."""
    rng = np.random.default_rng(1)
    g, m = 12, 3
    codes = np.repeat(np.arange(g), m)
    x = rng.normal(size=g * m)
    y = rng.normal(0, 1.5, g)[codes] + 0.5 * x + rng.normal(0, 1, g * m)
    X = np.column_stack([np.ones(g * m), x])
    core = LMMCore(y, X, [REBlock("g", codes, g, np.ones((g * m, 1)), ("(Intercept)",))])
    theta, _, _ = core.fit_theta(np.array([1.0]))
    sig = core.sigma_hat(theta)
    df_theta, _, _ = satterthwaite_dfs(core.deviance_vp, core.vcov_beta, np.r_[theta, sig], np.eye(2))

    def to_vp(v):  # variances -> (theta, sigma)
        return np.r_[np.sqrt(v[0] / v[1]), np.sqrt(v[1])]

    v_hat = np.array([(theta[0] * sig) ** 2, sig**2])
    df_var, _, _ = satterthwaite_dfs(
        lambda v: core.deviance_vp(to_vp(v)), lambda v: core.vcov_beta(to_vp(v)), v_hat, np.eye(2)
    )
    np.testing.assert_allclose(df_theta, df_var, rtol=1e-4)
