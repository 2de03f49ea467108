"""Linear mixed models for per-prompt / per-image scores, with lmerTest-style inference.

The paper (Sec. 3.1 and App. "Per-Prompt Analysis") fits e.g. ``FID ~ algorithm * batch + (1|prompt)``
by REML and reports coefficients with p-values; this module reproduces R's
``lmerTest::lmer`` output:

1. Fit by lme4's method (:mod:`pcpo_eval.stats.lmm_core`; Bates et al. 2015, J. Stat. Softw.
   67(1), Sec. 3): the REML (default) or ML deviance profiled over beta and sigma is minimized
   over theta, the relative Cholesky factors of the random-effect covariances, by a bounded
   derivative-free trust-region method from lme4's start, trying :data:`OPTIMIZERS` in order
   until one converges. Z is sparse and the cross-products are formed once, so a theta step costs
   nothing in the number of rows. Crossed groupings (``--group prompt --group seed``) are several
   random-intercept terms; random slopes: ``re_formula`` with a single grouping.
2. Estimates and SEs at the optimum: beta from the penalized least squares solution,
   Cov(beta) = sigma^2 (X'V^-1X)^-1, and lme4's convergence checks (``checkConv``).
3. Per fixed term: t = estimate / SE with Satterthwaite df (:mod:`pcpo_eval.stats.satterthwaite`),
   two-sided p from t(df), 95% CI estimate +- t_{0.975, df} SE (lmerTest ``confint`` of the
   contrast), plus the Wald z p-value and CI statsmodels would report.
4. Flags that are reported, never hidden: ``converged`` (an optimizer claimed convergence *and*
   lme4's gradient and Hessian checks pass) and ``singular`` (a variance parameter on the boundary,
   lme4's ``isSingular`` with tol 1e-4 on theta).
5. The guard: a fit is ``estimable`` only if it converged (which needs a response that varies by
   more than rounding), the deviance Hessian over the variance parameters has no negative
   eigenvalue (lmerTest's "failed to converge") and every Satterthwaite df is finite. Otherwise
   the estimates are kept for inspection but no p-value exists: ``to_dict`` gives ``p: null`` with
   the ``reason``, the text summary prints "NOT ESTIMABLE: <reason>" instead of p-values, and the
   fit is left out of the Holm / BH family.
6. A singular fit that is otherwise healthy is estimable, with the p-values lmerTest gives it:
   the boundary component stays in the parameter vector at 0, the Satterthwaite derivatives step
   to both sides of it, and a Hessian that is not positive definite is inverted on its
   eigenvalues above 1e-8 (lmerTest 3.1 ``as_lmerModLT``). Such a fit carries a remark
   (``remarks``: "singular fit: variance of X estimated at 0 (boundary); fixed-effect tests as
   lmerTest") in the summary and the JSON, and enters the Holm / BH family. A zero variance is an estimate, not a failure: the fit is the
   model with that grouping dropped, and its fixed-effect tests are that model's (e.g. with
   ``(1|prompt)`` at 0 the algorithm effect is still tested against ``(1|run)``; with ``(1|run)``
   at 0 it is tested against the residual, as lmerTest does -- the remark says which).

The REML criterion equals lme4's (``-2 * REML log-lik``); tests/stats/test_lme4.py checks fits
against lme4 / lmerTest themselves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as sst

from pcpo_eval.errors import UserError
from pcpo_eval.stats.adjust import benjamini_hochberg, holm
from pcpo_eval.stats.design import Design, build_design
from pcpo_eval.stats.lmm_core import SINGULAR_TOL, LMMCore, check_convergence
from pcpo_eval.stats.satterthwaite import EIG_TOL, satterthwaite

#: :func:`~pcpo_eval.stats.lmm_core.minimize_bounded` methods tried in order until one converges.
OPTIMIZERS = ("cobyqa", "nelder-mead")
QQ_MAX_POINTS = 2000
PRECISION_ULPS = 1e4  # residual SD below this many ulps of max|y| is rounding noise (noted, not converged)


@dataclass(frozen=True)
class FixedEffect:
    """One fixed-effects coefficient with its t-test (Satterthwaite df) and Wald z-test."""

    term: str
    estimate: float
    se: float
    df: float
    t: float
    p: float
    ci_low: float
    ci_high: float
    z_p: float
    z_ci_low: float
    z_ci_high: float

    def to_dict(self) -> dict[str, float]:
        """The per-term JSON shape of the CLI: estimate, se, df, t, p, ci_low, ci_high."""
        return {k: getattr(self, k) for k in ("estimate", "se", "df", "t", "p", "ci_low", "ci_high")}


@dataclass(frozen=True)
class FitAttempt:
    """One optimizer run, kept so a non-converged or rescued fit is visible."""

    optimizer: str
    converged: bool
    deviance: float
    warnings: tuple[str, ...]


@dataclass(frozen=True)
class ResidualDiagnostics:
    """Conditional residuals y - X beta - Z b (standardized by sigma) and their Q-Q data."""

    mean: float
    sd: float
    skewness: float
    excess_kurtosis: float
    max_abs_std: float
    normality_test: str
    normality_p: float
    qq_theoretical: tuple[float, ...]
    qq_sample: tuple[float, ...]
    qq_r: float

    def to_dict(self) -> dict[str, Any]:
        """Numbers only (the Q-Q points are for plotting, not the JSON)."""
        d = asdict(self)
        d.pop("qq_theoretical")
        d.pop("qq_sample")
        return d


@dataclass(frozen=True)
class LMMResult:
    """A fitted LMM, ready to render (the HTML report only formats this object)."""

    formula: str
    response: str
    groups: tuple[str, ...]
    re_formula: str | None
    coding: str
    reference_levels: dict[str, str]
    reml: bool
    fixed: tuple[FixedEffect, ...]
    random_sd: dict[str, float]  # "group" or "group:coef" -> SD, plus "Residual"
    random_corr: dict[str, list[list[float]]]
    icc: dict[str, float]
    deviance: float  # -2 log-lik (REML criterion when reml)
    loglik: float
    n_params: int  # fixed + variance parameters (for LRT / AIC)
    converged: bool
    singular: bool
    hessian_ok: bool
    optimizer: str
    attempts: tuple[FitAttempt, ...]
    max_grad: float
    n_obs: int
    n_groups: dict[str, int]
    theta: tuple[float, ...]
    diagnostics: ResidualDiagnostics | None = field(default=None, compare=False)
    notes: tuple[str, ...] = ()  # why converged is False / what is degenerate, in words
    remarks: tuple[str, ...] = ()  # facts that do not withhold p-values (a singular fit, lmerTest's warnings)

    @property
    def reasons(self) -> tuple[str, ...]:
        """Why this fit gives no p-values (empty when it is estimable); see the module's point 5.

        Non-convergence (including a response that varies by rounding only), a variance Hessian
        with negative eigenvalues and non-finite df; a singular fit alone is no reason (point 6).
        """
        return self.notes

    @property
    def estimable(self) -> bool:
        """True when the fit's p-values mean something (converged, finite df); singular fits included."""
        return not self.reasons

    @property
    def reason(self) -> str | None:
        """The reasons joined in one line, or None when estimable."""
        return "; ".join(self.reasons) or None

    @property
    def reml_criterion(self) -> float | None:
        """lme4's REML criterion (None for an ML fit)."""
        return self.deviance if self.reml else None

    def term(self, name: str) -> FixedEffect:
        """The fixed effect named ``name`` (UserError listing valid names otherwise)."""
        for fe in self.fixed:
            if fe.term == name:
                return fe
        raise UserError(f"no fixed term {name!r}; terms: {', '.join(f.term for f in self.fixed)}")

    def to_dict(self) -> dict[str, Any]:
        """JSON shape of ``pcpo-eval lmm --json``, plus coding / fit details (``p: null`` when not estimable)."""
        ok = self.estimable
        return {
            "formula": self.formula,
            "method": "REML" if self.reml else "ML",
            "coding": self.coding,
            "reference_levels": dict(self.reference_levels),
            "fixed": {fe.term: {**fe.to_dict(), "p": fe.p if ok else None} for fe in self.fixed},
            "wald": {
                fe.term: {"p": fe.z_p if ok else None, "ci_low": fe.z_ci_low, "ci_high": fe.z_ci_high}
                for fe in self.fixed
            },
            "estimable": ok,
            "reason": self.reason,
            "random": dict(self.random_sd),
            "random_corr": {k: v for k, v in self.random_corr.items()},
            "icc": dict(self.icc),
            "reml_criterion": self.reml_criterion,
            "deviance": self.deviance,
            "loglik": self.loglik,
            "converged": self.converged,
            "singular": self.singular,
            "hessian_ok": self.hessian_ok,
            "optimizer": self.optimizer,
            "max_grad": self.max_grad,
            "n_obs": self.n_obs,
            "n_groups": dict(self.n_groups),
            "notes": list(self.notes),
            "remarks": list(self.remarks),
            "diagnostics": self.diagnostics.to_dict() if self.diagnostics else None,
        }

    def to_frame(self) -> pd.DataFrame:
        """Fixed-effects table (one row per term) with the t-test and Wald z columns."""
        return pd.DataFrame([asdict(fe) for fe in self.fixed]).set_index("term")

    def summary(self) -> str:
        """Plain-text rendering in the spirit of ``summary(lmerTest::lmer(...))``."""
        lines = [
            f"Linear mixed model fit by {'REML' if self.reml else 'maximum likelihood'}; "
            f"t-tests use Satterthwaite's method",
            f"Formula: {self.formula}  groups: {' x '.join(self.groups)}"
            + (f"  random slopes: {self.re_formula}" if self.re_formula else ""),
            f"Coding: {self.coding}"
            + (
                "  (reference levels: "
                + ", ".join(f"{k}={v}" for k, v in self.reference_levels.items())
                + ")"
                if self.reference_levels
                else ""
            ),
            f"{'REML criterion' if self.reml else 'Deviance'}: {self.deviance:.4f}   "
            f"obs: {self.n_obs}   groups: " + ", ".join(f"{k} {v}" for k, v in self.n_groups.items()),
            f"Converged: {'yes' if self.converged else 'NO'}   Singular: {'YES' if self.singular else 'no'}"
            f"   optimizer: {self.optimizer}   max|grad|: {self.max_grad:.2e}",
            *(f"Note: {n}" for n in (*self.notes, *self.remarks)),
            *([] if self.estimable else [f"NOT ESTIMABLE: {self.reason}; no p-values are reported"]),
            "",
            "Random effects (SD):",
        ]
        for k, v in self.random_sd.items():
            lines.append(f"  {k:<28s} {v:12.6g}")
        lines.append("")
        cols = ["estimate", "se", "df", "t", "p", "ci_low", "ci_high"] if self.estimable else ["estimate", "se"]
        lines.append(self.to_frame()[cols].to_string(float_format=lambda x: f"{x:.6g}"))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


# -- fitting --------------------------------------------------------------------------------


def _diagnostics(core: LMMCore, theta: np.ndarray, sigma: float) -> ResidualDiagnostics:
    fitted, _ = core.conditional_fitted(theta)
    r = (core.y - fitted) / sigma
    n = r.size
    if 3 <= n <= 5000:
        test, pval = "shapiro-wilk", float(sst.shapiro(r).pvalue)
    elif n > 5000:
        test, pval = "dagostino-pearson", float(sst.normaltest(r).pvalue)
    else:
        test, pval = "none", float("nan")
    (osm, osr), (_, _, rr) = sst.probplot(r, dist="norm")
    if n > QQ_MAX_POINTS:  # evenly spaced order statistics keep the tails
        idx = np.unique(np.linspace(0, n - 1, QQ_MAX_POINTS).round().astype(int))
        osm, osr = osm[idx], osr[idx]
    return ResidualDiagnostics(
        mean=float(np.mean(r)),
        sd=float(np.std(r, ddof=1)),
        skewness=float(sst.skew(r)),
        excess_kurtosis=float(sst.kurtosis(r)),
        max_abs_std=float(np.max(np.abs(r))),
        normality_test=test,
        normality_p=pval,
        qq_theoretical=tuple(float(v) for v in osm),
        qq_sample=tuple(float(v) for v in osr),
        qq_r=float(rr),
    )


def fit_lmm(
    df: pd.DataFrame,
    formula: str,
    groups: list[str],
    coding: str = "treatment",
    reml: bool = True,
    re_formula: str | None = None,
    diagnostics: bool = True,
) -> LMMResult:
    """Fit ``formula`` with random intercepts per grouping (crossed if several) or random slopes.

    Parameters
    ----------
    df : table with the response, fixed-effect and grouping columns (no NaNs in those).
    formula : patsy formula of the fixed part, e.g. ``"fid ~ algorithm * batch"``.
    groups : grouping columns; several = crossed random intercepts (e.g. ``["prompt", "seed"]``).
    coding : ``"treatment"`` or ``"sum"`` for bare categorical columns (see :mod:`.design`).
    reml : REML (default, as in the paper) or ML (for likelihood-ratio tests).
    re_formula : random-slopes formula for a single grouping, e.g. ``"~Days"`` (R: ``(Days|g)``).
    """
    from threadpoolctl import threadpool_limits

    d = build_design(df, formula, list(groups), coding, re_formula)
    # Small dense algebra: BLAS threads only add contention (10x slower on a shared 2-core box).
    with threadpool_limits(limits=1, user_api="blas"):
        return _fit(d, formula, list(groups), coding, reml, re_formula, diagnostics)


def _standardize_response(d: Design) -> tuple[Design, np.ndarray, float, list[str]]:
    """Refit-invariant rescaling y' = (y - X b_ols) / s, s = OLS residual SD.

    An LMM is equivariant under y -> a y + X c: theta (relative Cholesky factors), t, df and p are
    unchanged; beta -> a beta + c, SEs, SDs -> a x, and the deviance shifts by (n - p) log a^2
    (REML) or n log a^2 (ML). Fitting on y' keeps every quantity O(1), so a nearly constant
    response (per-prompt IS ~1 + 1e-9 noise) neither loses r^2 to cancellation nor meets the
    absolute steps of the optimizers and of numDeriv's derivatives (1e-4 near zero) at the scale
    of its residual SD. Returns (design on y', shift c = b_ols, scale a = s, notes).
    """
    n, p = d.X.shape
    b_ols = np.linalg.lstsq(d.X, d.y, rcond=None)[0]
    r = d.y - d.X @ b_ols
    s = float(np.sqrt(r @ r / max(n - p, 1)))
    if not s > 0.0:
        raise UserError(
            f"response column {d.response!r} is exactly determined by the fixed effects "
            "(residual SD 0); nothing to model"
        )
    notes = []
    y_mag = float(np.max(np.abs(d.y)))
    if s < PRECISION_ULPS * np.finfo(float).eps * y_mag:
        notes.append(
            f"residual SD {s:.3g} is within {PRECISION_ULPS:.0f} ulps of the response magnitude "
            f"{y_mag:.3g}: the variation is floating-point rounding, estimates are not meaningful"
        )
    return replace(d, y=r / s), b_ols, s, notes


def _fit(
    d: Design,
    formula: str,
    groups: list[str],
    coding: str,
    reml: bool,
    re_formula: str | None,
    diagnostics: bool,
) -> LMMResult:
    """1. standardize y, 2. fit theta, 3. beta / SE / Satterthwaite df, 4. random effects, 5. assemble."""
    d, shift, scale, notes = _standardize_response(d)
    n_obs, p = d.X.shape
    log_jac = (n_obs - p if reml else n_obs) * np.log(scale**2)  # deviance(y) - deviance(y')
    core = LMMCore(d.y, d.X, list(d.blocks))
    fit = _fit_theta(d, core, reml, log_jac)
    notes += fit.notes
    converged = not notes  # an optimizer's claim, a small gradient, and more than rounding in y
    theta = fit.theta

    # Everything below is computed on y' and mapped back to y (see _standardize_response).
    state = core.solve(theta)
    sigma_s = core.sigma_hat(theta, reml)
    varpar = np.r_[theta, sigma_s]
    se = scale * np.sqrt(np.diag(core.vcov_beta(varpar)))
    beta = shift + scale * state.beta
    sigma = scale * sigma_s
    # Satterthwaite df on y' / sigma' (residual SD exactly 1): df is invariant to that rescaling,
    # and it keeps sigma away from numDeriv's absolute step (1e-4) for parameters near zero when a
    # random effect dwarfs the residual (sigma' << 1 after the OLS-based standardization).
    sat_core = LMMCore(core.y / sigma_s, core.X, list(d.blocks)) if sigma_s > 0 else core
    sat_varpar = np.r_[theta, 1.0] if sigma_s > 0 else varpar
    sat = satterthwaite(lambda vp: sat_core.deviance_vp(vp, reml), sat_core.vcov_beta, sat_varpar, np.eye(p))
    dfs = sat.dfs
    random_sd, random_corr, icc, singular = _random_effects(d, core, theta, sigma)
    remarks = []
    if singular:
        remarks.append(f"{_boundary_words(d, theta)}; fixed-effect tests as lmerTest")
    if sat.n_negative:  # lmerTest: "Model failed to converge with k negative eigenvalues"
        notes.append(
            f"the deviance Hessian over the variance parameters has {sat.n_negative} negative "
            "eigenvalue(s) (lmerTest: model failed to converge)"
        )
    elif sat.n_dropped:  # lmerTest warns and drops them from A = 2 H^+; so do we
        remarks.append(
            f"the deviance Hessian over the variance parameters has {sat.n_dropped} eigenvalue(s) within "
            f"{EIG_TOL:g} of 0, left out of the Satterthwaite df (lmerTest: model may not have converged)"
        )
    if not np.all(np.isfinite(dfs)):
        notes.append("Satterthwaite df not computable (deviance Hessian not finite)")
    dev = float(fit.deviance) + log_jac
    return LMMResult(
        formula=formula,
        response=d.response,
        groups=tuple(groups),
        re_formula=re_formula,
        coding=coding,
        reference_levels=d.reference_levels,
        reml=reml,
        fixed=_fixed_effects_table(d.fixed_names, beta, se, dfs),
        random_sd=random_sd,
        random_corr=random_corr,
        icc=icc,
        deviance=dev,
        loglik=float(-0.5 * dev),
        n_params=p + core.n_theta + 1,
        converged=converged,
        singular=singular,
        hessian_ok=sat.hessian_ok,
        optimizer=fit.optimizer,
        attempts=fit.attempts,
        max_grad=fit.max_grad,
        n_obs=n_obs,
        n_groups={b.name: b.n_levels for b in d.blocks},
        theta=tuple(float(v) for v in theta),
        diagnostics=_diagnostics(core, theta, sigma_s) if diagnostics else None,
        notes=tuple(notes),
        remarks=tuple(remarks),
    )


@dataclass(frozen=True)
class _ThetaFit:
    theta: np.ndarray
    deviance: float  # on the standardized response y'
    optimizer: str
    attempts: tuple[FitAttempt, ...]
    max_grad: float
    notes: tuple[str, ...]  # convergence problems, in words
    converged: bool


def _fit_theta(d: Design, core: LMMCore, reml: bool, log_jac: float) -> _ThetaFit:
    """lme4's ``optimizeLmer`` on the profiled deviance, then lme4's ``checkConv``.

    Tries :data:`OPTIMIZERS` in order from lme4's start and stops at the first whose optimizer
    reports success and that passes lme4's gradient and Hessian checks; otherwise keeps the lowest
    deviance. ``converged`` needs both, so a fit is never called converged on an optimizer's word
    alone. lme4's Hessian warnings that are not failures are kept in the attempt's ``warnings``.
    """
    attempts: list[FitAttempt] = []
    fits = []
    for method in OPTIMIZERS:
        theta, dev, ok = core.fit_theta(None, reml, method)
        check = check_convergence(core, theta, reml)
        good = bool(ok and np.isfinite(dev) and not check.failed)
        attempts.append(FitAttempt(method, good, dev + log_jac, check.failed + check.warnings))
        fits.append((theta, dev, ok, check))
        if good:
            break
    devs = [f[1] if np.isfinite(f[1]) else np.inf for f in fits]
    best = next((i for i, a in enumerate(attempts) if a.converged), int(np.argmin(devs)))
    theta, dev, ok, check = fits[best]
    notes = []
    if not ok:
        notes.append("no optimizer reported convergence")
    if not np.isfinite(dev):
        notes.append("the deviance at the optimum is not finite")
    notes += check.failed
    optimizer = f"{OPTIMIZERS[best]} on lme4's profiled deviance"
    return _ThetaFit(theta, float(dev), optimizer, tuple(attempts), check.max_grad, tuple(notes), not notes)


def _fixed_effects_table(
    names: Sequence[str], beta: np.ndarray, se: np.ndarray, dfs: np.ndarray
) -> tuple[FixedEffect, ...]:
    """Per term: t = estimate / SE, two-sided p from t(df), 95% CI with t_{0.975, df} (lmerTest), Wald z."""
    fixed = []
    zq = sst.norm.ppf(0.975)
    for i, name in enumerate(names):
        est, s, dfi = float(beta[i]), float(se[i]), float(dfs[i])
        t = est / s
        tq = sst.t.ppf(0.975, dfi) if np.isfinite(dfi) else float("nan")
        fixed.append(
            FixedEffect(
                term=name,
                estimate=est,
                se=s,
                df=dfi,
                t=t,
                p=float(2.0 * sst.t.sf(abs(t), dfi)) if np.isfinite(dfi) else float("nan"),
                ci_low=est - tq * s,
                ci_high=est + tq * s,
                z_p=float(2.0 * sst.norm.sf(abs(t))),
                z_ci_low=est - zq * s,
                z_ci_high=est + zq * s,
            )
        )
    return tuple(fixed)


def _boundary_words(d: Design, theta: np.ndarray) -> str:
    """What sits on the boundary (a diagonal theta below lme4's isSingular tol 1e-4), in words."""
    zero, rank, i = [], [], 0
    for b in d.blocks:
        diag = [theta[i + c] for c in np.cumsum([0, *range(b.k, 1, -1)])]  # column-major lower triangle
        if min(diag) < SINGULAR_TOL:
            (zero if b.k == 1 else rank).append(b.name)
        i += b.n_theta
    parts = [f"variance of {', '.join(zero)} estimated at 0"] if zero else []
    parts += [f"covariance matrix of the random effects of {g} estimated as singular" for g in rank]
    return f"singular fit: {'; '.join(parts)} (boundary)"


def _random_effects(
    d: Design, core: LMMCore, theta: np.ndarray, sigma: float
) -> tuple[dict[str, float], dict[str, list[list[float]]], dict[str, float], bool]:
    """Random-effect SDs ("group" / "group:coef" + "Residual"), correlations, ICCs, lme4's isSingular."""
    random_sd: dict[str, float] = {}
    random_corr: dict[str, list[list[float]]] = {}
    intercept_var: dict[str, float] = {}
    for b, cov in zip(d.blocks, core.block_covariances(theta, sigma), strict=True):
        sds = np.sqrt(np.diag(cov))
        for j, cname in enumerate(b.coef_names):
            key = b.name if cname == "(Intercept)" else f"{b.name}:{cname}"
            random_sd[key] = float(sds[j])
            if cname == "(Intercept)":
                intercept_var[b.name] = float(cov[j, j])
        if b.k > 1:
            with np.errstate(invalid="ignore", divide="ignore"):
                corr = cov / np.outer(sds, sds)
            random_corr[b.name] = [[float(v) for v in row] for row in corr]
    random_sd["Residual"] = float(sigma)
    total = sum(intercept_var.values()) + sigma**2
    icc = {g: v / total for g, v in intercept_var.items()}
    # isSingular: a diagonal element of a relative Cholesky factor (theta) at the boundary.
    diag_theta, i = [], 0
    for b in d.blocks:
        for j in range(b.k):
            for r in range(j, b.k):
                if r == j:
                    diag_theta.append(theta[i])
                i += 1
    return random_sd, random_corr, icc, bool(np.any(np.asarray(diag_theta) < SINGULAR_TOL))


# -- likelihood-ratio test ---------------------------------------------------------------------


@dataclass(frozen=True)
class LRTResult:
    """Likelihood-ratio test of nested models, both fitted by ML (R: ``anova(m0, m1)``)."""

    full_formula: str
    reduced_formula: str
    loglik_full: float
    loglik_reduced: float
    chi2: float
    df: int
    p: float

    def to_dict(self) -> dict[str, Any]:
        """Plain dict for JSON."""
        return asdict(self)


def lrt_from_fits(full: LMMResult, reduced: LMMResult) -> LRTResult:
    """LRT from two ML fits of nested models: chi2 = 2 (l_full - l_reduced), df = extra params."""
    if full.reml or reduced.reml:
        raise UserError("likelihood-ratio tests of fixed effects need ML fits (reml=False), not REML")
    if full.n_obs != reduced.n_obs:
        raise UserError(f"models are fitted to different data ({full.n_obs} vs {reduced.n_obs} rows)")
    missing = {f.term for f in reduced.fixed} - {f.term for f in full.fixed}
    if missing or full.n_params <= reduced.n_params:
        raise UserError(
            f"{reduced.formula!r} is not nested in {full.formula!r}"
            + (f" (terms {sorted(missing)} not in the full model)" if missing else "")
        )
    chi2 = max(0.0, 2.0 * (full.loglik - reduced.loglik))
    dfd = full.n_params - reduced.n_params
    return LRTResult(
        full.formula, reduced.formula, full.loglik, reduced.loglik, chi2, dfd, float(sst.chi2.sf(chi2, dfd))
    )


def lrt(
    df: pd.DataFrame,
    full_formula: str,
    reduced_formula: str,
    groups: list[str],
    coding: str = "treatment",
    re_formula: str | None = None,
) -> LRTResult:
    """Refit both models by ML and test the reduced (nested) one against the full one."""
    full = fit_lmm(df, full_formula, groups, coding, reml=False, re_formula=re_formula, diagnostics=False)
    red = fit_lmm(df, reduced_formula, groups, coding, reml=False, re_formula=re_formula, diagnostics=False)
    return lrt_from_fits(full, red)


# -- several metrics -------------------------------------------------------------------------


def adjust_across_metrics(results: Mapping[str, LMMResult]) -> dict[str, dict[str, dict[str, float]]]:
    """Holm and BH adjusted p-values; one family per fixed term across the metrics.

    The paper's LMM tables list, per effect (algorithm, batch, interaction), one p-value per
    metric (FID, FD-DINO, IS, LPIPS); the multiplicity family is that column. Returns
    ``{metric: {term: {"p", "p_holm", "p_bh"}}}``; a fit that is not estimable gets ``None``s and
    does not count in the family.
    """
    out: dict[str, dict[str, dict[str, float | None]]] = {m: {} for m in results}
    terms: list[str] = []
    for r in results.values():
        terms += [f.term for f in r.fixed if f.term not in terms]
    for term in terms:
        for m, r in results.items():  # not estimable: outside the family, no p at all
            if not r.estimable and any(f.term == term for f in r.fixed):
                out[m][term] = {"p": None, "p_holm": None, "p_bh": None}
        metrics = [m for m, r in results.items() if r.estimable and any(f.term == term for f in r.fixed)]
        if not metrics:
            continue
        pv = np.array([results[m].term(term).p for m in metrics])
        ph, pb = holm(pv), benjamini_hochberg(pv)
        for m, a, b, c in zip(metrics, pv, ph, pb, strict=True):
            out[m][term] = {"p": float(a), "p_holm": float(b), "p_bh": float(c)}
    return out


def fit_lmm_many(
    df: pd.DataFrame,
    responses: Sequence[str],
    rhs: str,
    groups: list[str],
    coding: str = "treatment",
    reml: bool = True,
    re_formula: str | None = None,
) -> tuple[dict[str, LMMResult], dict[str, dict[str, dict[str, float]]]]:
    """Fit ``response ~ rhs`` for each response; return the fits and Holm/BH-adjusted p-values."""
    if not responses:
        raise UserError("give at least one response column")
    fits = {r: fit_lmm(df, f"{r} ~ {rhs}", groups, coding, reml, re_formula) for r in responses}
    return fits, adjust_across_metrics(fits)


def many_summary(fits: Mapping[str, LMMResult], adjusted: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """Text of several fits plus the adjusted p-values ("not estimable" where a fit gives none)."""
    text = "\n\n".join(v.summary() for v in fits.values())
    text += "\n\nAdjusted p-values (family: one term across the estimable metrics)\n"
    for m, terms in adjusted.items():
        for term, v in terms.items():
            if v["p"] is None:
                text += f"  {m:<14s} {term:<32s} not estimable: {fits[m].reason}\n"
            else:
                text += f"  {m:<14s} {term:<32s} p={v['p']:.4g}  holm={v['p_holm']:.4g}  bh={v['p_bh']:.4g}\n"
    return text


def qq_plot(result: LMMResult, path: str) -> None:
    """Write a normal Q-Q plot of the standardized conditional residuals (PNG/SVG/PDF by suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pcpo_eval.io import atomic_save_figure

    if result.diagnostics is None:
        raise UserError("this fit has no residual diagnostics; refit with diagnostics=True")
    dg = result.diagnostics
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.scatter(dg.qq_theoretical, dg.qq_sample, s=6)
    lim = [min(dg.qq_theoretical[0], dg.qq_sample[0]), max(dg.qq_theoretical[-1], dg.qq_sample[-1])]
    ax.plot(lim, lim, color="gray", lw=1)
    ax.set_xlabel("normal quantiles")
    ax.set_ylabel("standardized residuals")
    ax.set_title(f"{result.response}: Q-Q (r = {dg.qq_r:.3f})")
    fig.tight_layout()
    atomic_save_figure(path, fig, dpi=120)
    plt.close(fig)
